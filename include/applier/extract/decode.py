"""From pgoutput messages to spec rows, events and table definitions.

Pure apart from the sink it calls (the project's
:class:`~applier.intermediate.writer.IntermediateWriter`) and the catalog
look-up of a primary key. Decoding whole transactions in commit order (no
streaming), the decoder composes each ``lsn`` as spec §7 allows:

    lsn = commit position << 20 | index within the transaction

with index 0 for ``begin``, 1..n for the rows and n+1 for ``commit``, and the
commit position the start of the transaction's commit record (pgoutput's
``final_lsn``). Commit positions strictly increase in commit order, so the
lsn does too; and the same transaction decoded twice gets the same numbers,
which is what lets a restart skip exactly what a complete pair already holds
(``resume_after``). It holds while the source's WAL position is below
2^43 (8 TiB) and a transaction has fewer than 2^20 - 1 changes; past either
the decoder refuses rather than write an lsn out of order.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from applier.errors import ExtractError
from applier.extract import pgoutput as po
from applier.extract.types import UnmappableError, spec_type, value_converter
from applier.intermediate.schema import Column, SchemaError, TableDef, check_table_name, evolution_problem

INDEX_BITS = 20
MAX_INDEX = (1 << INDEX_BITS) - 1
MAX_POSITION = 1 << (63 - INDEX_BITS)


class Sink(Protocol):
    """Where decoded changes go: the intermediate-file writer."""

    def define_table(self, table: TableDef) -> None: ...
    def row(
        self, lsn: int, xid: str, table: str, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None
    ) -> None: ...
    def begin(self, xid: str, lsn: int, ts: dt.datetime) -> None: ...
    def commit(self, xid: str, lsn: int, ts: dt.datetime) -> None: ...
    def rollback(self, xid: str, lsn: int, ts: dt.datetime) -> None: ...


KeyLookup = Callable[[str, str], tuple[str, ...]]
"""(schema, table) -> the table's primary-key columns, from the source catalog."""

MARKER_PREFIX = "cdc-applier"
"""The prefix of the logical messages the extractor commits into the source's WAL as markers."""


@dataclass(frozen=True)
class MarkerRows:
    """What a live marker's transaction writes: an optional truncate of its table, then inserts."""

    relation: po.Relation
    truncate: bool = False
    rows: Iterable[dict[str, Any]] = ()


class Markers(Protocol):
    """Subscriptions, as the decoder meets them (:class:`applier.extract.materialize.Materializer`)."""

    @property
    def watched(self) -> set[str]: ...
    def included(self, table: str, position: int) -> bool | None: ...
    def marker(self, payload: bytes, final_lsn: int) -> MarkerRows | None: ...
    def marker_written(self, final_lsn: int, begin_lsn: int, commit_lsn: int) -> None: ...
    def changed(self, table: str, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None: ...


@dataclass(frozen=True)
class _Table:
    """A relation as the decoder uses it: its definition, converters and replica identity."""

    definition: TableDef
    converters: tuple[Callable[[str], Any], ...]
    identity: str
    key_index: tuple[int, ...]


@dataclass
class _Transaction:
    xid: str
    final: int  # the commit record's position
    base: int
    ts: dt.datetime
    index: int = 0
    begun: bool = False
    cut: bool = False  # a stale marker's transaction whose rows a crash cut: it ends in a rollback
    marker: bool = False  # a live marker's transaction
    scope: dict[str, bool] = field(default_factory=dict)


def _fix(table: str) -> str:
    return f"ALTER TABLE {table} REPLICA IDENTITY FULL"


class Decoder:
    """Feeds one slot's pgoutput messages, in order, to a sink.

    Args:
        sink: receives table definitions, rows, begins and commits.
        key_lookup: the primary key of a table whose replica identity does not show it.
        include: ``schema.table`` names to extract (empty: every published table).
        exclude: ``schema.table`` names to leave out.
        resume_after: the last lsn already written (in a complete pair, then as passed on);
            anything at or below is skipped, so a transaction decoded again is not written twice.
        on_commit: called with the source end position of each commit decoded and whether it was written.
        written_definitions: each table's latest definition in the pairs already written.
        markers: the subscriptions: which tables are extracted from where, and what markers write.
        finished_xids: transactions whose commit the last complete pair holds (a marker's
            transaction decoded again is whole in the pairs, not cut).
    """

    def __init__(
        self,
        sink: Sink,
        key_lookup: KeyLookup,
        *,
        include: Collection[str] = (),
        exclude: Collection[str] = (),
        resume_after: int = -1,
        on_commit: Callable[[int, bool], None] | None = None,
        written_definitions: Mapping[str, TableDef] | None = None,
        markers: Markers | None = None,
        finished_xids: Collection[str] = (),
    ) -> None:
        self.sink = sink
        self.key_lookup = key_lookup
        self.include, self.exclude = frozenset(include), frozenset(exclude)
        self.resume_after = resume_after
        self.on_commit = on_commit
        self.markers = markers
        self._finished = set(finished_xids)
        self._relations: dict[int, po.Relation] = {}
        self._tables: dict[po.Relation, _Table] = {}
        self._defined: dict[str, TableDef] = {}
        self.written_definitions = written_definitions or {}
        self._tx: _Transaction | None = None
        self.rows = 0

    def handle(self, data: bytes) -> None:
        """Decode one message and pass what it means on to the sink."""
        message = po.parse(data)
        if isinstance(message, po.Begin):
            if message.final_lsn >= MAX_POSITION:
                raise ExtractError(f"source WAL position {message.final_lsn} is past what lsn composition holds")
            self._tx = _Transaction(
                str(message.xid), message.final_lsn, message.final_lsn << INDEX_BITS, message.commit_time
            )
        elif isinstance(message, po.Commit):
            self._commit(message)
        elif isinstance(message, po.Relation):
            self._relations[message.oid] = message
        elif isinstance(message, po.Insert | po.Update | po.Delete):
            self._change(message)
        elif isinstance(message, po.Truncate):
            for oid in message.relations:
                table = self._in_scope(oid)
                if table is not None:
                    self._emit_row(table.definition.name, "T", None, None)
        elif isinstance(message, po.LogicalMessage) and message.prefix == MARKER_PREFIX and message.transactional:
            self._marker(message.content)

    def image(self, relation: po.Relation, values: po.Tuple) -> dict[str, Any]:
        """A row's text output as a spec image, converted as the stream's rows are (a copy's rows)."""
        return self._image(self._table(relation), values)

    def _in_scope(self, oid: int) -> _Table | None:
        """The relation's table when its changes in the current transaction are extracted."""
        rel = self._relations.get(oid)
        if rel is None:
            raise ExtractError(f"pgoutput sent a change of relation {oid} before describing it")
        tx = self._transaction()
        name = f"{rel.namespace}.{rel.name}"
        included = tx.scope.get(name)
        if included is None:
            included = (not self.include or name in self.include) and name not in self.exclude
            if self.markers is not None:
                decided = self.markers.included(name, tx.final)
                included = included if decided is None else decided
            tx.scope[name] = included
        return self._table(rel) if included else None

    def _marker(self, payload: bytes) -> None:
        tx = self._transaction()
        if self.markers is None:
            return
        if tx.base <= self.resume_after:  # decoded before: whole in the pairs, or cut by a crash
            tx.cut = tx.xid not in self._finished
            return
        result = self.markers.marker(payload, tx.final)
        if result is None:
            return  # a stale marker (an attempt a crash ended) writes nothing
        tx.marker = True
        name = self._table(result.relation).definition.name
        self._begin(tx)
        if result.truncate:
            self._emit_row(name, "T", None, None)
        for image in result.rows:
            self._emit_row(name, "I", None, image)

    # -- transactions and lsn composition -------------------------------------------

    def _next_lsn(self, tx: _Transaction) -> int:
        tx.index += 1
        if tx.index > MAX_INDEX:
            raise ExtractError(f"transaction {tx.xid} has more than {MAX_INDEX - 1} changes, past lsn composition")
        return tx.base + tx.index

    def _begin(self, tx: _Transaction) -> None:
        if not tx.begun:
            tx.begun = True
            if tx.base > self.resume_after:
                self.sink.begin(tx.xid, tx.base, tx.ts)
                self.resume_after = tx.base

    def _emit_row(self, table: str, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        tx = self._transaction()
        self._begin(tx)
        lsn = self._next_lsn(tx)
        if lsn > self.resume_after:
            self.sink.row(lsn, tx.xid, table, op, before, after)
            self.resume_after = lsn
            self.rows += 1
            if self.markers is not None and table in self.markers.watched:
                self.markers.changed(table, op, before, after)

    def _commit(self, message: po.Commit) -> None:
        tx = self._transaction()
        self._tx = None
        written = False
        if tx.cut:  # its rows cannot be read again (the copy's snapshot is gone): they are taken back
            lsn = self.resume_after + 1
            self.sink.rollback(tx.xid, lsn, message.commit_time)
            self.resume_after, written = lsn, True
        elif tx.begun:  # a transaction without extracted rows writes nothing
            lsn = self._next_lsn(tx)
            if lsn > self.resume_after:
                self.sink.commit(tx.xid, lsn, message.commit_time)
                self.resume_after = lsn
                written = True
                if tx.marker and self.markers is not None:
                    self._finished.add(tx.xid)
                    self.markers.marker_written(tx.final, tx.base, lsn)
        if self.on_commit:
            self.on_commit(message.end_lsn, written)

    def _transaction(self) -> _Transaction:
        if self._tx is None:
            raise ExtractError("pgoutput sent a change outside a transaction")
        return self._tx

    # -- definitions -----------------------------------------------------------------

    def _table(self, rel: po.Relation) -> _Table:
        table = self._tables.get(rel)
        if table is None:
            table = self._tables[rel] = self._relation(rel)
        return table

    def _relation(self, rel: po.Relation) -> _Table:
        name = f"{rel.namespace}.{rel.name}"
        try:
            check_table_name(name)
        except SchemaError as e:
            raise ExtractError(f"table {name}: {e}") from e
        types, converters = [], []
        for col in rel.columns:
            try:
                types.append(spec_type(col.type_oid, col.typmod))
            except UnmappableError as e:
                raise ExtractError(
                    f"table {name}, column {col.name}: {e}; leave the table out or change the type"
                ) from e
            converters.append(value_converter(col.type_oid, types[-1]))
        if rel.replica_identity in ("d", "i"):
            key = tuple(c.name for c in rel.columns if c.is_key)
        else:
            key = self.key_lookup(rel.namespace, rel.name)
        definition = TableDef(
            name,
            tuple(Column(c.name, t, c.name not in key) for c, t in zip(rel.columns, types, strict=True)),
            key,
        )
        self._define(definition)
        names = [c.name for c in rel.columns]
        return _Table(definition, tuple(converters), rel.replica_identity, tuple(names.index(k) for k in key))

    def _define(self, definition: TableDef) -> None:
        # Compared with what this run defined, else with what earlier runs wrote (a restart
        # must refuse a type change too: a pair the Applier refuses cannot be rewritten).
        old = self._defined.get(definition.name, self.written_definitions.get(definition.name))
        if old is not None and old != definition:
            problem = evolution_problem(old, definition)
            if problem:
                raise ExtractError(
                    f"table {definition.name}: {problem}; only an added nullable column can be extracted "
                    "(stop, re-create the table's target and re-materialize it)"
                )
        if self._defined.get(definition.name) != definition:
            self._defined[definition.name] = definition
            self.sink.define_table(definition)

    # -- row images ------------------------------------------------------------------

    def _image(self, table: _Table, values: po.Tuple, only: tuple[int, ...] | None = None) -> dict[str, Any]:
        image: dict[str, Any] = {}
        columns = table.definition.columns
        for i in only if only is not None else range(len(columns)):
            text = values[i]
            if text is None:
                image[columns[i].name] = None
                continue
            if text is po.UNCHANGED_TOAST:
                raise ExtractError(
                    f"table {table.definition.name}, column {columns[i].name}: an update left a TOASTed value "
                    f"out of the log; run {_fix(table.definition.name)}"
                )
            try:
                image[columns[i].name] = table.converters[i](str(text))
            except (UnmappableError, ValueError) as e:
                raise ExtractError(
                    f"table {table.definition.name}, column {columns[i].name}: value {str(text)[:80]!r} "
                    f"cannot be extracted exactly ({e})"
                ) from e
        return image

    def _change(self, message: po.Insert | po.Update | po.Delete) -> None:
        table = self._in_scope(message.relation)
        if table is None:
            return
        name = table.definition.name
        if isinstance(message, po.Insert):
            self._emit_row(name, "I", None, self._image(table, message.new))
            return
        keyless = not table.definition.primary_key
        if keyless and message.old_kind != "O":
            op = "an UPDATE" if isinstance(message, po.Update) else "a DELETE"
            raise ExtractError(f"table {name} has no primary key and got {op} without the old row; run {_fix(name)}")
        if isinstance(message, po.Delete):
            only = None if message.old_kind == "O" else table.key_index
            self._emit_row(name, "D", self._image(table, message.old, only), None)
            return
        new = message.new
        if message.old is not None and message.old_kind == "O":
            new = tuple(o if n is po.UNCHANGED_TOAST else n for n, o in zip(new, message.old, strict=True))
        after = self._image(table, new)
        if message.old is None:
            before = {k: after[k] for k in table.definition.primary_key}
        else:
            only = None if message.old_kind == "O" else table.key_index
            before = self._image(table, message.old, only)
        self._emit_row(name, "U", before, after)
