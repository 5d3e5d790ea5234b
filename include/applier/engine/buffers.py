"""Buffers of open transactions, under the queue-memory budget, spooling to disk (engine design, "Buffers").

Rows of transactions not yet committed in a cycle wait here, per ``xid``. A
batch of rows (a pair's rows of the transactions still open) is stored as one
*segment*: one Arrow table sorted by ``(xid, lsn)``, of which each transaction
owns a slice. A buffered row thus costs what its data weighs plus a share of
one table, whether it belongs to one large transaction or to thousands of
small ones (the earlier design kept one small Arrow table per transaction and
batch, about 7 KB a row). When transactions leave a segment (committed,
rolled back or spooled) and less than half its rows are still owned, the
segment is compacted: the owned slices are copied into a smaller one.

A transaction spools, as Informix ER's receive queue does, once its bytes in
memory exceed half the queue memory or ``buffer_size``
(``apply.buffer_size_for_split_records``); and when the queue is full the
largest buffers spool first (:class:`~applier.engine.queue.MemoryQueue`).
Spooled rows are appended to ``<spill_dir>/<configuration_name>_<safe
xid>.spill`` (:mod:`applier.engine.spill`), and read back as a stream by Spark
at apply time, never loaded whole.

Bytes of a transaction are the rows' logical size: 8 for ``lsn`` plus the
UTF-8 length of each string column (null counts 0), exact and reproducible.
The queue is charged with what the segments really hold in Arrow buffers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from applier.engine.queue import MemoryQueue
from applier.engine.spill import SPILL_SUFFIX, SpillEvent, append_spill, file_size, safe_xid
from applier.engine.touches import Truncate, table_touches, truncate_rows
from applier.intermediate.writer import DAT_SCHEMA

__all__ = ["SPILL_SUFFIX", "BufferedTxn", "OpenTxn", "SpillEvent", "TransactionBuffers", "row_bytes", "safe_xid"]

_STRING_COLUMNS = ("xid", "table", "op", "before", "after")
_LSN_BYTES = 8
_UNLIMITED = 2**62
_WRITE_BYTES = 4 * 1024 * 1024  # committed rows from memory are written in groups of this size


@dataclass(frozen=True)
class OpenTxn:
    """What the buffers hold of one open transaction (for status and cycle reports).

    ``bytes`` counts every buffered row; ``memory_bytes`` the part still in
    memory; ``spill_bytes`` is the spill file's current size on disk.
    """

    xid: str
    rows: int
    bytes: int
    first_seen: int | None
    spilled: bool
    spill_path: Path | None
    spill_bytes: int
    memory_bytes: int


@dataclass(frozen=True)
class BufferedTxn:
    """The rows of a committed transaction, handed to the engine by :meth:`TransactionBuffers.take`.

    Exactly one of ``memory`` and ``spill_path`` is set: a transaction that
    never spooled comes back as an Arrow table (slices of the segments, no
    copy); one that spooled comes back as its spill file holding all its rows
    (the remainder is appended on take). Rows are in ``lsn`` order with the
    ``.dat`` columns. ``tables`` are the tables its rows change and
    ``truncates`` its ``T`` rows as ``(table, lsn)``.
    """

    xid: str
    rows: int
    bytes: int
    first_seen: int | None
    memory: pa.Table | None
    spill_path: Path | None
    spill_bytes: int
    tables: frozenset[str] = frozenset()
    truncates: tuple[Truncate, ...] = ()


@dataclass(eq=False)
class _Segment:
    rows: pa.Table
    owners: dict[str, tuple[int, int]] = field(default_factory=dict)  # xid -> (offset, length)
    live: int = 0


@dataclass
class _Txn:
    xid: str
    first_seen: int | None = None
    rows: int = 0
    bytes: int = 0
    memory_bytes: int = 0
    segments: list[_Segment] = field(default_factory=list)
    path: Path | None = None
    tables: set[str] = field(default_factory=set)
    truncates: list[Truncate] = field(default_factory=list)


def _normalised(rows: pa.Table) -> pa.Table:
    """The ``.dat`` columns of ``rows`` in spec order and types, without file metadata."""
    missing = [name for name in DAT_SCHEMA.names if name not in rows.column_names]
    if missing:
        raise ValueError(f"rows lack the .dat column(s) {missing}; got {rows.column_names}")
    selected = rows.select(DAT_SCHEMA.names).replace_schema_metadata(None)
    return selected if selected.schema.equals(DAT_SCHEMA) else selected.cast(DAT_SCHEMA)


def row_bytes(rows: pa.Table) -> pa.Array:
    """Per row: 8 for the lsn plus the UTF-8 length of each string column (null counts 0)."""
    total: pa.Array | pa.Scalar = pa.scalar(_LSN_BYTES, pa.int64())
    for name in _STRING_COLUMNS:
        length = pc.fill_null(pc.cast(pc.binary_length(rows.column(name)), pa.int64()), 0)
        total = pc.add(total, length)
    return pc.cast(total, pa.int64())


def _sorted_runs(rows: pa.Table) -> tuple[pa.Table, list[tuple[str, int, int, int]]]:
    """``rows`` sorted by (xid, lsn) in one contiguous table, and its runs ``(xid, offset, length, bytes)``."""
    order = pc.sort_indices(rows, sort_keys=[("xid", "ascending"), ("lsn", "ascending")])
    ordered = rows.take(order).combine_chunks()
    runs = pc.run_end_encode(ordered.column("xid").chunk(0), run_end_type=pa.int64())
    ends: list[int] = runs.run_ends.to_pylist()
    cumulative = pc.cumulative_sum(row_bytes(ordered))
    totals: list[int] = pc.take(cumulative, pc.subtract(runs.run_ends, 1)).to_pylist()
    out, start, counted = [], 0, 0
    for xid, end, total in zip(runs.values.to_pylist(), ends, totals, strict=True):
        out.append((xid, start, end - start, total - counted))
        start, counted = end, total
    return ordered, out


class TransactionBuffers:
    """Rows of open transactions, per xid, in memory under the queue budget and spooled beyond.

    Not thread-safe: one engine (the driver) owns it. Usable as a context
    manager; leaving it closes and deletes every spill file it made.

    Args:
        spill_dir: the directory of spill files (created on the first spill).
        configuration_name: prefix of every spill file name.
        buffer_size: bytes one transaction may hold in memory before it spools.
        queue: the queue-memory budget (None: unlimited, the buffer size alone applies).

    Raises:
        ValueError: ``buffer_size`` is below 1.
    """

    def __init__(
        self, spill_dir: Path, configuration_name: str, buffer_size: int, queue: MemoryQueue | None = None
    ) -> None:
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be at least 1 byte, got {buffer_size}")
        self._spill_dir = Path(spill_dir)
        self._configuration_name = configuration_name
        self._queue = queue if queue is not None else MemoryQueue(_UNLIMITED)
        self._limit = min(buffer_size, self._queue.budget // 2)
        self._open: dict[str, _Txn] = {}
        self._taken: dict[str, Path] = {}
        self._events: list[SpillEvent] = []
        self._memory_bytes = 0
        self._queue.register(self)

    @property
    def memory_bytes(self) -> int:
        """Bytes of rows held in memory across all open transactions (their logical size)."""
        return self._memory_bytes

    @property
    def spill_events(self) -> list[SpillEvent]:
        """Spill files created and removed since the last :meth:`drain_spill_events`, oldest first."""
        return list(self._events)

    def drain_spill_events(self) -> list[SpillEvent]:
        """Return the spill events recorded so far and forget them (one cycle's report)."""
        events, self._events = self._events, []
        return events

    def spill_path(self, xid: str) -> Path:
        """The spill file of ``xid``: ``<spill_dir>/<configuration_name>_<safe xid>.spill``."""
        return self._spill_dir / f"{self._configuration_name}_{safe_xid(xid)}{SPILL_SUFFIX}"

    def add(self, rows: pa.Table, seq: int | None = None) -> None:
        """Buffer rows of transactions that are not committed yet.

        Args:
            rows: rows with the ``.dat`` columns, in ascending lsn order (other
                columns and the Parquet metadata are dropped).
            seq: where the rows come from (the pair's sequence number); each
                transaction keeps the smallest as ``first_seen``.

        Raises:
            ValueError: a ``.dat`` column is missing or holds a null the spec forbids
                (``pyarrow.ArrowInvalid``), or a row's transaction was already taken.
        """
        if rows.num_rows == 0:
            return
        ordered, runs = _sorted_runs(_normalised(rows))
        late = [xid for xid, *_ in runs if xid in self._taken]
        if late:
            raise ValueError(f"rows for transaction(s) {late} arrive after they were taken (committed)")
        segment = _Segment(ordered, live=ordered.num_rows)
        self._queue.charge("transactions", ordered.nbytes)
        grown: list[_Txn] = []
        for xid, offset, length, nbytes in runs:
            txn = self._open.get(xid)
            if txn is None:
                txn = self._open[xid] = _Txn(xid)
            if seq is not None and (txn.first_seen is None or seq < txn.first_seen):
                txn.first_seen = seq
            segment.owners[xid] = (offset, length)
            txn.segments.append(segment)
            txn.rows += length
            txn.bytes += nbytes
            txn.memory_bytes += nbytes
            self._memory_bytes += nbytes
            grown.append(txn)
        for xid, table in table_touches(rows):
            self._open[xid].tables.add(table)
        for xid, truncate in truncate_rows(rows):
            self._open[xid].truncates.append(truncate)
        for txn in grown:
            if txn.memory_bytes > self._limit:
                self._spool(txn)
        self._queue.make_room()

    def take(self, xid: str) -> BufferedTxn | None:
        """Hand over the rows of a transaction that committed.

        A spooled transaction has its remaining rows appended to its file; the
        file stays on disk until :meth:`release`. Nothing is read back into memory.

        Args:
            xid: the committed transaction.

        Returns:
            Its rows, or None when no row of ``xid`` is buffered.
        """
        txn = self._open.pop(xid, None)
        if txn is None:
            return None
        memory: pa.Table | None = None
        spill_bytes = 0
        if txn.path is not None:
            self._spool(txn)
            spill_bytes = file_size(txn.path)
            self._taken[xid] = txn.path
        else:
            memory = self._memory_rows(txn)
            self._detach(txn)
        return BufferedTxn(
            *(xid, txn.rows, txn.bytes, txn.first_seen, memory, txn.path, spill_bytes),
            tables=frozenset(txn.tables),
            truncates=tuple(txn.truncates),
        )

    def take_committed(self, xids: Iterable[str], memory_file: Path) -> tuple[dict[str, BufferedTxn], Path | None]:
        """:meth:`take` every committed transaction, writing those still in memory to ``memory_file``.

        The rows in memory leave the queue for a spill file Spark reads like
        the others, a few MiB at a time, so they are never held twice.

        Args:
            xids: the transactions committed in the cycle.
            memory_file: where the rows of those not spooled go.

        Returns:
            The taken transactions (``memory`` is None: their rows are in
            ``memory_file`` or their spill file), and ``memory_file`` when rows
            were written to it.
        """
        taken: dict[str, BufferedTxn] = {}
        group: list[pa.Table] = []
        held, written = 0, False
        for xid in list(filter(self._open.__contains__, xids)):  # the few buffered, not every commit
            txn = self.take(xid)
            if txn is None:
                continue
            if txn.memory is not None and txn.memory.num_rows:
                group.append(txn.memory)
                held += txn.memory.nbytes
                if held >= _WRITE_BYTES:
                    written |= bool(append_spill(memory_file, [pa.concat_tables(group).combine_chunks()]))
                    group, held = [], 0
            taken[xid] = replace(txn, memory=None)
        if group:
            written |= bool(append_spill(memory_file, [pa.concat_tables(group).combine_chunks()]))
        return taken, memory_file if written else None

    def release(self, xid: str) -> None:
        """Delete the spill file of a taken transaction once the target committed it (idempotent).

        Raises:
            ValueError: ``xid`` is still open (use :meth:`discard` for a rollback).
        """
        if xid in self._open:
            raise ValueError(f"transaction {xid!r} is still open; take() it first, or discard() it")
        path = self._taken.pop(xid, None)
        if path is not None:
            self._remove(path)

    def discard(self, xid: str) -> None:
        """Drop a rolled-back transaction: its memory rows and its spill file (idempotent)."""
        txn = self._open.pop(xid, None)
        if txn is not None:
            self._detach(txn)
            if txn.path is not None:
                self._remove(txn.path)
        path = self._taken.pop(xid, None)
        if path is not None:
            self._remove(path)

    def open_transactions(self) -> list[OpenTxn]:
        """Describe every open transaction, in the order each was first added."""
        return [
            OpenTxn(
                xid=txn.xid,
                rows=txn.rows,
                bytes=txn.bytes,
                first_seen=txn.first_seen,
                spilled=txn.path is not None,
                spill_path=txn.path,
                spill_bytes=file_size(txn.path) if txn.path is not None else 0,
                memory_bytes=txn.memory_bytes,
            )
            for txn in self._open.values()
        ]

    def clear_leftovers(self) -> list[str]:
        """Delete every spill file of this configuration that these buffers are not using (restart).

        A file belongs to the configuration when its name, without ``.spill``,
        splits at its last ``_`` into the configuration name and an xid part,
        so ``a_b_1.spill`` of configuration ``a_b`` is never claimed by ``a``.
        No spill events are recorded; the caller reports the returned names.

        Returns:
            The names of the files removed, sorted.
        """
        if not self._spill_dir.is_dir():
            return []
        in_use = {txn.path for txn in self._open.values()} | set(self._taken.values())
        removed: list[str] = []
        for path in sorted(self._spill_dir.glob(f"*{SPILL_SUFFIX}")):
            owner, sep, _ = path.name[: -len(SPILL_SUFFIX)].rpartition("_")
            if sep and owner == self._configuration_name and path not in in_use and path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path.name)
        return removed

    def close(self) -> None:
        """Drop every buffer and delete every spill file made here (open and taken alike).

        Buffers live for one run: a restart rebuilds open transactions from the pairs.
        """
        for xid in list(self._open) + list(self._taken):
            self.discard(xid)
        self._queue.unregister(self)

    def __enter__(self) -> TransactionBuffers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the queue's side

    def spool_candidates(self) -> Iterator[tuple[int, str]]:
        """``(bytes in memory, xid)`` of each open transaction holding rows in memory."""
        return ((t.memory_bytes, t.xid) for t in self._open.values() if t.memory_bytes)

    def spool(self, name: str) -> None:
        """Spool the open transaction ``name`` (the queue is full)."""
        self._spool(self._open[name])

    # ------------------------------------------------------------------ internals

    def _memory_rows(self, txn: _Txn) -> pa.Table:
        pieces = [seg.rows.slice(*seg.owners[txn.xid]) for seg in txn.segments]
        return pa.concat_tables(pieces) if pieces else DAT_SCHEMA.empty_table()

    def _spool(self, txn: _Txn) -> None:
        """Append the transaction's rows in memory to its spill file and free them."""
        if not txn.segments:
            return
        created = txn.path is None
        if txn.path is None:
            txn.path = self.spill_path(txn.xid)
        moved = txn.memory_bytes
        append_spill(txn.path, [self._memory_rows(txn)])
        self._detach(txn)
        self._queue.note_spooled("transactions", txn.xid, txn.path.name, moved)
        if created:
            self._events.append(SpillEvent("created", txn.path.name, file_size(txn.path)))

    def _detach(self, txn: _Txn) -> None:
        """The transaction no longer owns rows in memory: shrink or drop the segments it left."""
        for segment in txn.segments:
            _, length = segment.owners.pop(txn.xid)
            segment.live -= length
            if segment.live == 0:
                self._queue.release("transactions", segment.rows.nbytes)
                segment.rows = DAT_SCHEMA.empty_table()
            elif segment.live * 2 < segment.rows.num_rows:
                self._compact(segment)
        txn.segments = []
        self._memory_bytes -= txn.memory_bytes
        txn.memory_bytes = 0

    def _compact(self, segment: _Segment) -> None:
        """Copy the owned slices of a mostly abandoned segment into a table of their own."""
        owners = sorted(segment.owners.items(), key=lambda item: item[1][0])
        compacted = pa.concat_tables([segment.rows.slice(*span) for _, span in owners]).combine_chunks()
        offset = 0
        for xid, (_, length) in owners:
            segment.owners[xid] = (offset, length)
            offset += length
        self._queue.release("transactions", segment.rows.nbytes - compacted.nbytes)
        segment.rows = compacted

    def _remove(self, path: Path) -> None:
        size = file_size(path)
        path.unlink(missing_ok=True)
        self._events.append(SpillEvent("removed", path.name, size))
