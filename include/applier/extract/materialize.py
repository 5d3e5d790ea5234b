"""Materialization: a newly subscribed table's existing rows, consistent with the change stream.

The copy travels through the intermediate files, as rows of source
transactions the extractor writes at a fixed position of the stream, so the
Applier applies it through the path it already has. Positions are fixed with
**markers**: transactional logical messages (``pg_logical_emit_message``,
prefix ``cdc-applier``) the extractor commits into the source's WAL and meets
again, in commit order, while decoding (SAP Replication Server's
``rs_marker``). A marker's payload names the table, the attempt and its kind.

**atomic** and **incremental** (SAP's atomic and incremental atomic
materialization, with a shorter lock):

1. in one ``REPEATABLE READ`` transaction: ``LOCK TABLE … IN SHARE MODE``
   (writers of the table wait; ``materialize.lock_timeout_s``), then
   ``pg_export_snapshot()``; a second connection imports the snapshot;
2. while the lock is held, one marker per chunk is committed: every change
   of the table before the lock commits before the first marker, and every
   later one after the last, so the snapshot is exactly the table at the
   markers;
3. the lock is released at once; the copy reads the snapshot, streaming;
4. decoding meets marker *i* and writes chunk *i* as that marker's
   transaction: a ``T`` row first (chunk 1: the copy replaces whatever the
   target holds), then one ``I`` row per source row. Atomic has one chunk,
   so the copy, its truncate and the switch-over commit as one transaction;
   incremental has ``materialize.chunk_rows`` rows per chunk;
5. the table's changes are extracted from the transactions committed after
   the last marker; those at or before it are in the copy.

**nonatomic**, the DBLog watermark method (Netflix; Debezium's incremental
snapshots): no lock and no long transaction. A *start* marker (with a ``T``
row) begins the table's changes. Then, chunk by chunk in key order, a *low*
marker is committed, the chunk is read by one short query, and a *high*
marker is committed. Decoding between the two drops from the chunk every key
a change of the table touched in that window (the change is newer or as new);
at the high marker, the rest of the chunk is written as ``I`` rows. An *end*
marker closes the copy. Until then the table's rows may meet collisions (an
update of a row not copied yet, a chunk row already inserted by a change), so
the pairs say, in the Parquet metadata key ``cdc.autocorrect``, which tables'
lsn ranges the Applier applies as upserts without counting them (see
docs/materialization.md). A table needs a key for this mode.

**A crash** loses the snapshot: a marker met again after a restart whose
attempt is not live is *stale*. A stale marker's transaction writes nothing,
and one whose rows a crash cut (written, not committed) is ended with a
``rollback`` event; the subscription is ``recovering`` and the next batch
starts a new attempt (a nonatomic one continues after its last recorded key).
The registry (:mod:`applier.extract.subscriptions`) moves only once the pair
holding a marker's commit is in place.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from applier.config_source import MaterializeConfig
from applier.errors import ExtractError
from applier.extract import source
from applier.extract.decode import MarkerRows
from applier.extract.pgoutput import Relation, Tuple
from applier.extract.subscriptions import Registry, Subscription
from applier.intermediate.pairs import AUTOCORRECT_METADATA_KEY

log = logging.getLogger(__name__)
Image = dict[str, Any]
ImageOf = Callable[[Relation, Tuple], Image]
"""The decoder's conversion of a row's text output into a spec image."""


@dataclass
class _Copy:
    """A live atomic or incremental attempt: the snapshot's connection and its streaming cursor."""

    relation: Relation
    conn: psycopg.Connection[tuple[object, ...]]
    rows: Iterator[tuple[object, ...]]
    chunks: int
    chunk_rows: int


@dataclass
class _Chunked:
    """A live nonatomic attempt: the chunk read between its markers, keyed by the row's key."""

    relation: Relation
    key: tuple[str, ...]
    after_key: list[str | None] | None
    chunk: int = 0
    held: dict[tuple[Any, ...], Image] | None = None
    window_open: bool = False
    last_key: list[str | None] | None = None
    done: bool = False


@dataclass
class _Pending:
    """Registry fields to set once the pair holding a marker's commit is in place."""

    final_lsn: int
    table: str
    fields: dict[str, Any]
    commit_fields: tuple[str, ...] = ()  # set to the marker's commit lsn
    commit_lsn: int | None = None


@dataclass
class Materializer:
    """The extractor's side of subscriptions: starts attempts, answers markers, keeps the registry.

    Args:
        directory: the intermediate folder (its ``.subscriptions.json``).
        settings: ``materialize.*``.
        url: the source, for the snapshot's and the chunks' connections.
        publication: the publication a subscribed table is added to when it is not in it yet.
        image_of: the decoder's conversion of a row's text output (set once the decoder exists).
    """

    directory: Path
    settings: MaterializeConfig
    url: str
    publication: str
    image_of: ImageOf = field(default=lambda relation, values: {})
    registry: Registry = field(init=False)
    _subs: dict[str, Subscription] = field(default_factory=dict)
    _copies: dict[str, _Copy] = field(default_factory=dict)  # by attempt
    _chunked: dict[str, _Chunked] = field(default_factory=dict)  # by attempt
    _start: dict[str, int] = field(default_factory=dict)  # table -> start position decoded in this process
    _autocorrect: dict[str, list[int | None]] = field(default_factory=dict)  # table -> [from lsn, to lsn]
    _pending: list[_Pending] = field(default_factory=list)
    _watched: set[str] = field(default_factory=set)
    _last_written: int | None = None  # the last lsn of the pair being written
    _emitted: bool = False  # markers committed by the last prepare
    _dropping: dict[str, Relation] = field(default_factory=dict)  # attempt of a drop marker emitted -> its table

    def __post_init__(self) -> None:
        self.registry = Registry(self.directory)
        self._subs = self.registry.load()
        for sub in self._subs.values():
            if sub.mode == "nonatomic" and sub.state == "materializing" and sub.start_position is not None:
                self._autocorrect[sub.table] = [0, None]  # a window a crash left open: from the restart on

    # -- what the decoder asks ---------------------------------------------------------

    @property
    def watched(self) -> set[str]:
        """Tables whose changes a nonatomic window must see."""
        return self._watched

    def included(self, table: str, position: int) -> bool | None:
        """Whether a change of ``table`` committed at ``position`` is extracted (None: the configuration decides)."""
        sub = self._subs.get(table)
        if sub is None:
            return None
        if sub.drop_position is not None and position > sub.drop_position:
            return False
        start = self._start.get(table, sub.start_position)
        if start is not None and position > start:
            return True
        return None

    def marker(self, payload: bytes, final_lsn: int) -> MarkerRows | None:
        """What a marker's transaction writes, or None for a stale marker (an attempt no longer live)."""
        m = json.loads(payload)
        table, attempt, kind = m["t"], m["a"], m["k"]
        if kind == "copy" and attempt in self._copies:
            return self._copy_chunk(table, attempt, int(m["c"]), final_lsn)
        if kind == "drop" and attempt in self._dropping:
            relation = self._dropping.pop(attempt)
            sub = self._subs[table]
            sub.drop_position = final_lsn
            self._pending.append(_Pending(final_lsn, table, {"state": "dropped", "drop_position": final_lsn}))
            return MarkerRows(relation, truncate=sub.drop == "purge")
        chunked = self._chunked.get(attempt)
        if chunked is None:
            return None
        if kind == "start":
            self._start[table] = final_lsn
            self._pending.append(
                _Pending(final_lsn, table, {"start_position": final_lsn}, commit_fields=("activation_lsn",))
            )
            return MarkerRows(chunked.relation, truncate=True)
        if kind == "low" and int(m["c"]) == chunked.chunk:
            chunked.window_open = True
            self._watched.add(table)
            return MarkerRows(chunked.relation)
        if kind == "high" and int(m["c"]) == chunked.chunk and chunked.held is not None:
            rows, chunked.held, chunked.window_open = list(chunked.held.values()), None, False
            self._watched.discard(table)
            copied = self._subs[table].copied_rows + len(rows)
            self._subs[table].copied_rows = copied
            self._pending.append(_Pending(final_lsn, table, {"after_key": chunked.last_key, "copied_rows": copied}))
            return MarkerRows(chunked.relation, rows=rows)
        if kind == "end":
            del self._chunked[attempt]
            self._pending.append(
                _Pending(final_lsn, table, {"state": "activating", "recovering": False}, commit_fields=("valid_lsn",))
            )
            return MarkerRows(chunked.relation)
        return None

    def marker_written(self, final_lsn: int, begin_lsn: int, commit_lsn: int) -> None:
        """A live marker's transaction was written, from ``begin_lsn`` to ``commit_lsn``."""
        for p in self._pending:
            if p.final_lsn == final_lsn:
                p.commit_lsn = commit_lsn
                table = p.table
                if "start_position" in p.fields and self._subs[table].mode == "nonatomic":
                    self._autocorrect[table] = [begin_lsn, None]
                if p.fields.get("state") == "activating" and table in self._autocorrect:
                    self._autocorrect[table][1] = commit_lsn

    def changed(self, table: str, op: str, before: Image | None, after: Image | None) -> None:
        """A change of a watched table inside a nonatomic window: its keys leave the chunk held."""
        for chunked in self._chunked.values():
            if not chunked.window_open or chunked.held is None:
                continue
            if f"{chunked.relation.namespace}.{chunked.relation.name}" != table:
                continue
            if op == "T":
                chunked.held.clear()
            for image in (before, after):
                if image is not None:
                    chunked.held.pop(tuple(image.get(k) for k in chunked.key), None)

    # -- what the extraction asks -------------------------------------------------------

    def pair_metadata(self, first: int | None, last: int | None) -> dict[bytes, str]:
        """The ``cdc.autocorrect`` ranges of a pair being written: ``{table: [from lsn, to lsn]}``."""
        self._last_written = last
        if first is None or last is None:
            return {}
        ranges = {}
        for table, (start, end) in self._autocorrect.items():
            if start is not None and start <= last and (end is None or end >= first):
                ranges[table] = [max(start, first), last if end is None else min(end, last)]
        return {AUTOCORRECT_METADATA_KEY: json.dumps(ranges)} if ranges else {}

    def pair_written(self, handled_end: int) -> None:
        """A pair holding every commit before ``handled_end`` is in place: the registry follows."""
        last_lsn = self._last_written
        done = [p for p in self._pending if p.final_lsn < handled_end]
        self._pending = [p for p in self._pending if p.final_lsn >= handled_end]
        for p in done:
            values = dict(p.fields)
            for name in p.commit_fields:
                values[name] = p.commit_lsn
            self.registry.change(p.table, **values)
            for name, value in values.items():
                if name not in ("copied_rows", "after_key"):  # the in-memory ones are ahead already
                    setattr(self._subs[p.table], name, value)
            log.info("applier extract: subscription %s: %s", p.table, values)
        if last_lsn is not None:
            for table, (_, end) in list(self._autocorrect.items()):
                if end is not None and end <= last_lsn:
                    del self._autocorrect[table]

    @property
    def busy(self) -> bool:
        """A nonatomic copy has chunks to read (the batch goes on until it ends)."""
        return any(not c.done for c in self._chunked.values())

    def prepare(self, conn: psycopg.Connection[tuple[object, ...]]) -> bool:
        """Start what the registry asks for, and read the next nonatomic chunks (``conn``: autocommit).

        Returns:
            Whether markers were committed (the WAL end moved past them).
        """
        self._emitted = False
        on_disk = self.registry.load()
        for table, sub in on_disk.items():  # a new or changed request; the fields this process moves stay
            mine = self._subs.get(table)
            if mine is None or sub.attempt != mine.attempt or sub.drop != mine.drop or sub.error != mine.error:
                self._subs[table] = sub
        for table in list(self._subs):
            if table not in on_disk:
                del self._subs[table]
        for sub in list(self._subs.values()):
            try:
                self._prepare_one(conn, sub)
            except (psycopg.Error, ExtractError) as e:
                self._fail(sub, e)
        return self._emitted

    def close(self) -> None:
        for copy in self._copies.values():
            copy.conn.close()
        self._copies.clear()

    # -- attempts ----------------------------------------------------------------------

    def _prepare_one(self, conn: psycopg.Connection[tuple[object, ...]], sub: Subscription) -> None:
        if sub.state == "dropped":
            return
        if sub.drop is not None:
            if sub.attempt not in self._dropping:
                self._drop(conn, sub)
            return
        live = sub.attempt in self._copies or sub.attempt in self._chunked
        if sub.error is not None or (sub.state not in ("defined", "materializing")) or live:
            if sub.attempt in self._chunked:
                self._next_chunk(conn, self._chunked[sub.attempt], sub)
            return
        attempt = uuid.uuid4().hex[:12]
        recovering = sub.state == "materializing" or sub.recovering
        if recovering:
            log.warning("applier extract: subscription %s: attempt %s was cut; a new attempt", sub.table, sub.attempt)
        relation = source.relation(conn, sub.table)
        source.publish(conn, self.publication, sub.table)
        if sub.mode == "nonatomic":
            self._start_chunked(conn, sub, attempt, relation, recovering)
        else:
            self._start_copy(conn, sub, attempt, relation, recovering)

    def _chunk_rows(self, sub: Subscription) -> int:
        return sub.chunk_rows or self.settings.chunk_rows

    def _set(self, sub: Subscription, **values: Any) -> None:
        self.registry.change(sub.table, **values)
        for name, value in values.items():
            setattr(sub, name, value)

    def _fail(self, sub: Subscription, error: Exception) -> None:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        log.error("applier extract: subscription %s is recovering: %s", sub.table, message)
        self._copies.pop(sub.attempt or "", None)
        self._chunked.pop(sub.attempt or "", None)
        self._set(sub, recovering=True, error=message)

    def _marker(
        self, conn: psycopg.Connection[tuple[object, ...]], table: str, attempt: str, kind: str, **more: Any
    ) -> None:
        source.emit_marker(conn, json.dumps({"t": table, "a": attempt, "k": kind, **more}))
        self._emitted = True

    def _start_copy(
        self, conn: psycopg.Connection[tuple[object, ...]], sub: Subscription, attempt: str, relation: Relation,
        recovering: bool,
    ) -> None:  # fmt: skip
        lock = source.connect(self.url, autocommit=False)
        copy = source.connect(self.url, autocommit=False)
        try:
            lock.isolation_level = copy.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            name = sql.Identifier(relation.namespace, relation.name)
            timeout = sql.Literal(f"{int(self.settings.lock_timeout_s * 1000)}ms")
            lock.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(timeout))
            lock.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(name))
            (snapshot,) = lock.execute("SELECT pg_export_snapshot()").fetchone() or ("",)
            copy.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
            (count,) = copy.execute(sql.SQL("SELECT count(*) FROM {}").format(name)).fetchone() or (0,)
            count = int(str(count))
            per_chunk = count + 1 if sub.mode == "atomic" else self._chunk_rows(sub)
            chunks = max(1, math.ceil(count / per_chunk))
            self._start.pop(sub.table, None)
            self._set(sub, state="materializing", attempt=attempt, recovering=recovering, start_position=None,
                      copied_rows=0)  # fmt: skip
            for chunk in range(1, chunks + 1):  # committed while the lock holds the table's writers
                self._marker(conn, sub.table, attempt, "copy", c=chunk, n=chunks)
            lock.commit()
        except BaseException:
            lock.close()
            copy.close()
            raise
        lock.close()
        cursor = source.select_text(copy, relation, name="applier_materialize")
        self._copies[attempt] = _Copy(relation, copy, iter(cursor), chunks, per_chunk)
        log.info(
            "applier extract: subscription %s (%s): copying %d rows, %d chunks", sub.table, sub.mode, count, chunks
        )

    def _copy_chunk(self, table: str, attempt: str, chunk: int, final_lsn: int) -> MarkerRows:
        copy = self._copies[attempt]
        last = chunk == copy.chunks
        rows = _taken(copy, self.image_of, last)
        fields: dict[str, Any] = {}
        commit_fields: tuple[str, ...] = ("activation_lsn",) if chunk == 1 else ()
        if last:
            self._start[table] = final_lsn
            fields = {"state": "activating", "recovering": False, "start_position": final_lsn}
            commit_fields = (*commit_fields, "valid_lsn")
        pending = _Pending(final_lsn, table, fields, commit_fields)
        self._pending.append(pending)
        return MarkerRows(copy.relation, truncate=chunk == 1, rows=_counted(rows, pending, self._subs[table]))

    def _start_chunked(
        self, conn: psycopg.Connection[tuple[object, ...]], sub: Subscription, attempt: str, relation: Relation,
        recovering: bool,
    ) -> None:  # fmt: skip
        key = tuple(c.name for c in relation.columns if c.is_key) or source.primary_key(
            conn, relation.namespace, relation.name
        )
        if not key:
            raise ExtractError(f"table {sub.table} has no primary key: subscribe it in atomic or incremental mode")
        chunked = _Chunked(relation, key, sub.after_key if recovering else None)
        self._set(sub, state="materializing", attempt=attempt, recovering=recovering)
        self._chunked[attempt] = chunked
        if sub.start_position is None:
            self._set(sub, copied_rows=0, after_key=None)
            self._marker(conn, sub.table, attempt, "start")
        self._next_chunk(conn, chunked, sub)

    def _next_chunk(self, conn: psycopg.Connection[tuple[object, ...]], chunked: _Chunked, sub: Subscription) -> None:
        if chunked.held is not None or chunked.done:
            return  # the chunk in hand waits for its high marker
        attempt = sub.attempt or ""
        chunked.chunk += 1
        self._marker(conn, sub.table, attempt, "low", c=chunked.chunk)
        rel = chunked.relation
        names = [c.name for c in rel.columns]
        key_sql = sql.SQL(", ").join(sql.Identifier(rel.namespace, rel.name, k) for k in chunked.key)
        where = sql.SQL("ORDER BY {} LIMIT {}").format(key_sql, sql.Literal(self._chunk_rows(sub)))
        if chunked.after_key is not None:
            casts = source.column_types(conn, rel, chunked.key)
            after = sql.SQL(", ").join(
                sql.SQL("{}::" + t).format(sql.Literal(v)) for v, t in zip(chunked.after_key, casts, strict=True)
            )
            where = sql.SQL("WHERE ({}) > ({}) ").format(key_sql, after) + where
        rows = source.select_settled(conn, rel, where)  # sees every commit before the low marker
        held: dict[tuple[Any, ...], Image] = {}
        for row in rows:
            image = self.image_of(rel, row)
            held[tuple(image.get(k) for k in chunked.key)] = image
        if rows:
            chunked.last_key = [None if rows[-1][names.index(k)] is None else str(rows[-1][names.index(k)])
                                for k in chunked.key]  # fmt: skip
            chunked.after_key = chunked.last_key
        chunked.held = held
        self._marker(conn, sub.table, attempt, "high", c=chunked.chunk)
        if len(rows) < self._chunk_rows(sub):
            chunked.done = True
            self._marker(conn, sub.table, attempt, "end")

    def _drop(self, conn: psycopg.Connection[tuple[object, ...]], sub: Subscription) -> None:
        attempt = uuid.uuid4().hex[:12]
        self._dropping[attempt] = source.relation(conn, sub.table)
        self._copies.pop(sub.attempt or "", None)
        self._chunked.pop(sub.attempt or "", None)
        self._set(sub, attempt=attempt)
        self._marker(conn, sub.table, attempt, "drop")


def _taken(copy: _Copy, image_of: ImageOf, last: bool) -> Iterator[Image]:
    """Chunk rows from the copy's cursor (the rest of it for the last chunk); the snapshot ends after the last."""
    for taken, row in enumerate(copy.rows, 1):
        yield image_of(copy.relation, row)
        if not last and taken >= copy.chunk_rows:
            return
    if last:
        copy.conn.commit()
        copy.conn.close()


def _counted(rows: Iterator[Image], pending: _Pending, sub: Subscription) -> Iterator[Image]:
    n = 0
    for row in rows:
        n += 1
        yield row
    pending.fields["copied_rows"] = sub.copied_rows + n
    sub.copied_rows += n
