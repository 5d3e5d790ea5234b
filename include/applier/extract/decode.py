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
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
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


KeyLookup = Callable[[str, str], tuple[str, ...]]
"""(schema, table) -> the table's primary-key columns, from the source catalog."""


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
    base: int
    ts: dt.datetime
    index: int = 0
    begun: bool = False


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
    ) -> None:
        self.sink = sink
        self.key_lookup = key_lookup
        self.include, self.exclude = frozenset(include), frozenset(exclude)
        self.resume_after = resume_after
        self.on_commit = on_commit
        self._relations: dict[int, _Table | None] = {}
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
            self._tx = _Transaction(str(message.xid), message.final_lsn << INDEX_BITS, message.commit_time)
        elif isinstance(message, po.Commit):
            self._commit(message)
        elif isinstance(message, po.Relation):
            self._relations[message.oid] = self._relation(message)
        elif isinstance(message, po.Insert | po.Update | po.Delete):
            self._change(message)
        elif isinstance(message, po.Truncate):
            for oid in message.relations:
                table = self._relations.get(oid)
                if table is not None:
                    self._emit_row(table.definition.name, "T", None, None)

    # -- transactions and lsn composition -------------------------------------------

    def _next_lsn(self, tx: _Transaction) -> int:
        tx.index += 1
        if tx.index > MAX_INDEX:
            raise ExtractError(f"transaction {tx.xid} has more than {MAX_INDEX - 1} changes, past lsn composition")
        return tx.base + tx.index

    def _emit_row(self, table: str, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        tx = self._transaction()
        if not tx.begun:
            tx.begun = True
            if tx.base > self.resume_after:
                self.sink.begin(tx.xid, tx.base, tx.ts)
                self.resume_after = tx.base
        lsn = self._next_lsn(tx)
        if lsn > self.resume_after:
            self.sink.row(lsn, tx.xid, table, op, before, after)
            self.resume_after = lsn
            self.rows += 1

    def _commit(self, message: po.Commit) -> None:
        tx = self._transaction()
        self._tx = None
        written = False
        if tx.begun:  # a transaction without extracted rows writes nothing
            lsn = self._next_lsn(tx)
            if lsn > self.resume_after:
                self.sink.commit(tx.xid, lsn, message.commit_time)
                self.resume_after = lsn
                written = True
        if self.on_commit:
            self.on_commit(message.end_lsn, written)

    def _transaction(self) -> _Transaction:
        if self._tx is None:
            raise ExtractError("pgoutput sent a change outside a transaction")
        return self._tx

    # -- definitions -----------------------------------------------------------------

    def _relation(self, rel: po.Relation) -> _Table | None:
        name = f"{rel.namespace}.{rel.name}"
        if (self.include and name not in self.include) or name in self.exclude:
            return None
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
        table = self._relations.get(message.relation)
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
