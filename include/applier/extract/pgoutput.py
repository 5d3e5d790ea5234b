"""Parsing pgoutput's binary messages (logical replication protocol version 1).

A pure function from one message's bytes to a small value. Messages of
protocol version 1 without streaming: Begin, Commit, Origin, Relation, Type,
Insert, Update, Delete, Truncate and Message. See PostgreSQL's "Logical
Replication Message Formats".
"""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
UNCHANGED_TOAST = object()
"""A column value the message leaves out because it is an unchanged TOASTed value."""


@dataclass(frozen=True)
class Begin:
    final_lsn: int  # where the transaction's commit record starts
    commit_time: dt.datetime
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int  # the end of the commit record: the slot's position once it is consumed
    commit_time: dt.datetime


@dataclass(frozen=True)
class RelationColumn:
    name: str
    type_oid: int
    typmod: int
    is_key: bool


@dataclass(frozen=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str  # d default, n nothing, f full, i index
    columns: tuple[RelationColumn, ...]


# A tuple: per column None (SQL NULL), UNCHANGED_TOAST, or the value's text output.
Tuple = tuple[object, ...]


@dataclass(frozen=True)
class Insert:
    relation: int
    new: Tuple


@dataclass(frozen=True)
class Update:
    relation: int
    old: Tuple | None
    old_kind: str | None  # K: the key columns only, O: the whole old row
    new: Tuple


@dataclass(frozen=True)
class Delete:
    relation: int
    old: Tuple
    old_kind: str


@dataclass(frozen=True)
class Truncate:
    relations: tuple[int, ...]


@dataclass(frozen=True)
class LogicalMessage:
    """A ``pg_logical_emit_message`` (sent with the option ``messages``): the materialization markers."""

    transactional: bool
    prefix: str
    content: bytes


@dataclass(frozen=True)
class Ignored:
    kind: str


Message = Begin | Commit | Relation | Insert | Update | Delete | Truncate | LogicalMessage | Ignored


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def unpack(self, fmt: str) -> tuple[int, ...]:
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def byte(self) -> str:
        self.pos += 1
        return chr(self.data[self.pos - 1])

    def string(self) -> str:
        end = self.data.index(0, self.pos)
        text = self.data[self.pos : end].decode("utf-8")
        self.pos = end + 1
        return text

    def time(self) -> dt.datetime:
        (micros,) = self.unpack("!q")
        return PG_EPOCH + dt.timedelta(microseconds=micros)

    def tuple(self) -> Tuple:
        (count,) = self.unpack("!h")
        values: list[object] = []
        for _ in range(count):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED_TOAST)
            elif kind == "t":
                (length,) = self.unpack("!i")
                values.append(self.data[self.pos : self.pos + length].decode("utf-8"))
                self.pos += length
            else:
                raise ValueError(f"pgoutput tuple column kind {kind!r} is not supported (binary mode is off)")
        return tuple(values)


def _relation(r: _Reader) -> Relation:
    (oid,) = r.unpack("!I")
    namespace, name, identity = r.string(), r.string(), r.byte()
    (count,) = r.unpack("!h")
    columns = []
    for _ in range(count):
        (flags,) = r.unpack("!b")
        col_name = r.string()
        type_oid, typmod = r.unpack("!Ii")
        columns.append(RelationColumn(col_name, type_oid, typmod, bool(flags & 1)))
    return Relation(oid, namespace or "pg_catalog", name, identity, tuple(columns))


def _update(r: _Reader) -> Update:
    (relation,) = r.unpack("!I")
    kind = r.byte()
    old, old_kind = None, None
    if kind in ("K", "O"):
        old, old_kind = r.tuple(), kind
        kind = r.byte()
    if kind != "N":
        raise ValueError(f"pgoutput update without its new tuple (found {kind!r})")
    return Update(relation, old, old_kind, r.tuple())


def parse(data: bytes) -> Message:
    """One pgoutput message.

    Raises:
        ValueError: a message this parser does not know (streaming, two-phase, binary values).
    """
    r = _Reader(data)
    kind = r.byte()
    if kind == "B":
        final_lsn, _ = r.unpack("!Qq")
        r.pos -= 8
        commit_time = r.time()
        (xid,) = r.unpack("!I")
        return Begin(final_lsn, commit_time, xid)
    if kind == "C":
        _flags, commit_lsn, end_lsn = r.unpack("!bQQ")
        return Commit(commit_lsn, end_lsn, r.time())
    if kind == "R":
        return _relation(r)
    if kind == "I":
        (relation,) = r.unpack("!I")
        if r.byte() != "N":
            raise ValueError("pgoutput insert without its new tuple")
        return Insert(relation, r.tuple())
    if kind == "U":
        return _update(r)
    if kind == "D":
        (relation,) = r.unpack("!I")
        old_kind = r.byte()
        return Delete(relation, r.tuple(), old_kind)
    if kind == "T":
        count, _options = r.unpack("!ib")
        return Truncate(tuple(r.unpack(f"!{count}I")))
    if kind == "M":
        flags, _lsn = r.unpack("!bQ")
        prefix = r.string()
        (length,) = r.unpack("!i")
        return LogicalMessage(bool(flags & 1), prefix, r.data[r.pos : r.pos + length])
    if kind in ("O", "Y"):
        return Ignored(kind)
    raise ValueError(f"pgoutput message {kind!r} is not supported")
