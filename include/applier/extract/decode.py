"""From pgoutput messages to spec rows, events and table definitions.

Pure apart from the sink it calls (the project's
:class:`~applier.intermediate.writer.IntermediateWriter`) and the catalog
look-up of a primary key. Decoding whole transactions in commit order (no
streaming), the decoder numbers each row and event it hands on with the next
``lsn`` of one counter, as spec §7 allows (the extractor's position in the
stream it decodes): strictly increasing, with no bound on a transaction's
size or on the source's WAL position.

What makes a restart exact is the **source position** of the last thing
handed on: a :class:`Position`, the transaction's commit position (pgoutput's
``final_lsn``, the start of its commit record; commit positions strictly
increase in commit order) and how many of its items (``begin``, rows,
``commit``) were handed on. Each pair records the position of its last item
(``cdc.extract`` in its Parquet metadata); a restart decodes again from the
slot and skips everything at or before the last complete pair's position,
then numbers on from its ``last_lsn``. The same transaction decoded twice
gives its items in the same order, so the skip is exact.
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

WHOLE = 1 << 62
"""The item count of a :class:`Position` that stands for a whole transaction, its commit included."""


@dataclass(frozen=True, order=True)
class Position:
    """A point of the source's stream: a transaction's commit position and how many of its items were handed on."""

    commit: int
    items: int = WHOLE

    def metadata(self) -> dict[str, int | None]:
        """The pair metadata ``cdc.extract`` of a pair whose last item is here."""
        return {"commit": self.commit, "items": None if self.items == WHOLE else self.items}

    @classmethod
    def of(cls, raw: dict[str, int | None]) -> Position:
        items = raw.get("items")
        return cls(int(raw["commit"] or 0), WHOLE if items is None else int(items))


START = Position(-1)
"""Before anything: an empty intermediate folder."""


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
    ts: dt.datetime
    items: int = 0  # begin, rows and commit decoded so far
    first_lsn: int = 0  # the lsn of its begin, once handed on
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
        resume: the source position of the last item already written (the last complete pair's);
            anything at or before it is skipped, so a transaction decoded again is not written twice.
        next_lsn: the lsn of the next item handed on (the last complete pair's ``last_lsn`` + 1).
        on_commit: called with the source end position of each commit decoded and whether it was written.
        written_definitions: each table's latest definition in the pairs already written.
        markers: the subscriptions: which tables are extracted from where, and what markers write.
    """

    def __init__(
        self,
        sink: Sink,
        key_lookup: KeyLookup,
        *,
        include: Collection[str] = (),
        exclude: Collection[str] = (),
        resume: Position = START,
        next_lsn: int = 1,
        on_commit: Callable[[int, bool], None] | None = None,
        written_definitions: Mapping[str, TableDef] | None = None,
        markers: Markers | None = None,
    ) -> None:
        self.sink = sink
        self.key_lookup = key_lookup
        self.include, self.exclude = frozenset(include), frozenset(exclude)
        self.done = resume  # the source position of the last item handed on
        self.next_lsn = next_lsn
        self.on_commit = on_commit
        self.markers = markers
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
            self._tx = _Transaction(str(message.xid), message.final_lsn, message.commit_time)
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
        if Position(tx.final, 1) <= self.done:  # decoded before: whole in the pairs, or cut by a crash
            tx.cut = self.done < Position(tx.final)
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

    # -- transactions, lsns and positions ----------------------------------------------

    def _fresh(self, tx: _Transaction, *, commit: bool = False) -> bool:
        """Count the transaction's next item; whether it lies past what was handed on already."""
        tx.items += 1
        return Position(tx.final, WHOLE if commit else tx.items) > self.done

    def _take(self) -> int:
        lsn, self.next_lsn = self.next_lsn, self.next_lsn + 1
        return lsn

    def _begin(self, tx: _Transaction) -> None:
        if not tx.begun:
            tx.begun = True
            if self._fresh(tx):
                tx.first_lsn = self._take()
                self.sink.begin(tx.xid, tx.first_lsn, tx.ts)
                self.done = Position(tx.final, tx.items)  # after the sink: a pair it closes ends before

    def _emit_row(self, table: str, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        tx = self._transaction()
        self._begin(tx)
        if self._fresh(tx):
            self.sink.row(self._take(), tx.xid, table, op, before, after)
            self.done = Position(tx.final, tx.items)
            self.rows += 1
            if self.markers is not None and table in self.markers.watched:
                self.markers.changed(table, op, before, after)

    def _commit(self, message: po.Commit) -> None:
        tx = self._transaction()
        self._tx = None
        written = False
        if tx.cut:  # its rows cannot be read again (the copy's snapshot is gone): they are taken back
            self.sink.rollback(tx.xid, self._take(), message.commit_time)
            self.done, written = Position(tx.final), True
        elif tx.begun and self._fresh(tx, commit=True):  # a transaction without extracted rows writes nothing
            lsn = self._take()
            self.sink.commit(tx.xid, lsn, message.commit_time)
            self.done, written = Position(tx.final), True
            if tx.marker and self.markers is not None:
                self.markers.marker_written(tx.final, tx.first_lsn, lsn)
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
