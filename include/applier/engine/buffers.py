"""Buffers of open transactions that spill to disk (the engine's "Buffers and spill files").

Rows of transactions not yet committed in a cycle wait here, grouped per
``xid``. Each transaction's rows are held in memory until its buffered bytes
exceed ``buffer_size``; then they are flushed as one Parquet row group to
``<spill_dir>/<configuration_name>_<safe xid>.spill`` and every later batch of
the transaction goes the same way once it exceeds ``buffer_size`` again. The
spill file's ``ParquetWriter`` stays open while the transaction is open, so a
transaction costs at most ``buffer_size`` bytes of memory (plus the batch being
added), however large it grows.

At commit, :meth:`TransactionBuffers.take` flushes the remainder and closes the
file, which Spark (or pyarrow) can then read; :meth:`TransactionBuffers.release`
deletes it after the target commit. A rollback (:meth:`TransactionBuffers.discard`)
deletes it at once.

Bytes are the rows' logical size: 8 for ``lsn`` plus the UTF-8 length of each
string column (null counts 0). Arrow's overhead (offsets and validity bitmaps,
about 21 bytes a row) is not counted, so the figure is exact and reproducible.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from applier.engine.touches import Truncate, table_touches, truncate_rows
from applier.intermediate.writer import DAT_SCHEMA

SPILL_SUFFIX = ".spill"
_STRING_COLUMNS = ("xid", "table", "op", "before", "after")
_LSN_BYTES = 8
_MAX_CHUNKS = 64
# Longer encodings are replaced by a hash so that a file name stays far below 255 bytes.
_MAX_SAFE_LENGTH = 120
# "--" never occurs in an escaped name ("-" is always followed by two hex digits),
# so hashed names cannot collide with escaped ones.
_HASHED_PREFIX = "--"


def safe_xid(xid: str) -> str:
    """Encode an xid for a file name, so that no two xids share one name.

    Letters and digits are kept; every other UTF-8 byte (``_`` and ``-``
    included) becomes ``-XX`` in upper-case hex. The result holds no ``_``, so
    ``<configuration_name>_<safe xid>`` splits unambiguously at its last ``_``
    even though configuration names may contain ``_``. An encoding longer than
    120 characters is replaced by ``--`` and the SHA-256 hex of the xid.

    Args:
        xid: the source transaction id, any string.

    Returns:
        A name part made of ``[A-Za-z0-9-]`` only (empty for an empty xid).
    """
    parts: list[str] = []
    for char in xid:
        if char.isascii() and char.isalnum():
            parts.append(char)
        else:
            parts.extend(f"-{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
    encoded = "".join(parts)
    if len(encoded) > _MAX_SAFE_LENGTH:
        return _HASHED_PREFIX + hashlib.sha256(xid.encode("utf-8", "surrogatepass")).hexdigest()
    return encoded


class SpillEvent(NamedTuple):
    """A spill file was created or removed; ``bytes`` is its size on disk at that moment."""

    kind: str  # "created" | "removed"
    name: str
    bytes: int


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
    never spilled comes back as an Arrow table; one that spilled comes back as
    a closed Parquet file holding all its rows (the remainder is flushed on take).
    Rows are in ``lsn`` order with the ``.dat`` columns. ``tables`` are the
    tables its rows change and ``truncates`` its ``T`` rows as ``(table, lsn)``.
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


@dataclass
class _Txn:
    xid: str
    first_seen: int | None = None
    rows: int = 0
    bytes: int = 0
    chunks: list[pa.Table] = field(default_factory=list)
    memory_bytes: int = 0
    path: Path | None = None
    writer: pq.ParquetWriter | None = None
    tables: set[str] = field(default_factory=set)
    truncates: list[Truncate] = field(default_factory=list)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


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


def _groups(rows: pa.Table) -> list[tuple[str, pa.Array, int]]:
    """Split ``rows`` per xid: (xid, row indices in lsn order, bytes), vectorised.

    One sort by (xid, lsn) and a run-end encoding of the sorted xids give
    the group boundaries; only the loop over distinct xids runs in Python.
    """
    order = pc.sort_indices(rows, sort_keys=[("xid", "ascending"), ("lsn", "ascending")])
    sorted_xids = pc.take(rows.column("xid"), order)
    if isinstance(sorted_xids, pa.ChunkedArray):
        sorted_xids = sorted_xids.combine_chunks()
    runs = pc.run_end_encode(sorted_xids, run_end_type=pa.int64())
    ends: list[int] = runs.run_ends.to_pylist()
    cumulative = pc.cumulative_sum(pc.take(row_bytes(rows), order))
    totals: list[int] = pc.take(cumulative, pc.subtract(runs.run_ends, 1)).to_pylist()
    groups: list[tuple[str, pa.Array, int]] = []
    start, counted = 0, 0
    for xid, end, total in zip(runs.values.to_pylist(), ends, totals, strict=True):
        groups.append((xid, order.slice(start, end - start), total - counted))
        start, counted = end, total
    return groups


class TransactionBuffers:
    """Rows of open transactions, per xid, in memory up to ``buffer_size`` and spilled beyond.

    Not thread-safe: one engine (the driver) owns it. Usable as a context
    manager; leaving it closes and deletes every spill file it made.

    Args:
        spill_dir: the directory of spill files (created on the first spill).
        configuration_name: prefix of every spill file name.
        buffer_size: bytes one transaction may hold in memory before it spills.

    Raises:
        ValueError: ``buffer_size`` is below 1.
    """

    def __init__(self, spill_dir: Path, configuration_name: str, buffer_size: int) -> None:
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be at least 1 byte, got {buffer_size}")
        self._spill_dir = Path(spill_dir)
        self._configuration_name = configuration_name
        self._buffer_size = buffer_size
        self._open: dict[str, _Txn] = {}
        self._taken: dict[str, Path] = {}
        self._events: list[SpillEvent] = []
        self._memory_bytes = 0

    @property
    def memory_bytes(self) -> int:
        """Bytes of rows held in memory across all open transactions."""
        return self._memory_bytes

    @property
    def spill_events(self) -> list[SpillEvent]:
        """Spill files created and removed since the last :meth:`drain_spill_events`, oldest first."""
        return list(self._events)

    def drain_spill_events(self) -> list[SpillEvent]:
        """Return the spill events recorded so far and forget them (one cycle's report).

        Returns:
            The events, oldest first.
        """
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
        rows = _normalised(rows)
        groups = _groups(rows)
        late = [xid for xid, _, _ in groups if xid in self._taken]
        if late:
            raise ValueError(f"rows for transaction(s) {late} arrive after they were taken (committed)")
        for xid, indices, nbytes in groups:
            txn = self._open.get(xid)
            if txn is None:
                txn = self._open[xid] = _Txn(xid)
            if seq is not None and (txn.first_seen is None or seq < txn.first_seen):
                txn.first_seen = seq
            # take() copies the group's rows, so no slice keeps the whole batch alive.
            txn.chunks.append(rows.take(indices))
            if len(txn.chunks) > _MAX_CHUNKS:
                # Many tiny tables cost far more than their bytes; keep one contiguous copy.
                txn.chunks = [pa.concat_tables(txn.chunks).combine_chunks()]
            txn.rows += len(indices)
            txn.bytes += nbytes
            txn.memory_bytes += nbytes
            self._memory_bytes += nbytes
            if txn.memory_bytes > self._buffer_size:
                self._flush(txn)
        for xid, table in table_touches(rows):
            self._open[xid].tables.add(table)
        for xid, truncate in truncate_rows(rows):
            self._open[xid].truncates.append(truncate)

    def take(self, xid: str) -> BufferedTxn | None:
        """Hand over the rows of a transaction that committed.

        A spilled transaction has its remaining rows flushed and its file
        closed; the file stays on disk until :meth:`release`. Nothing is read
        back into memory.

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
        if txn.writer is not None and txn.path is not None:
            self._flush(txn)
            txn.writer.close()
            spill_bytes = _file_size(txn.path)
            self._taken[xid] = txn.path
        else:
            memory = pa.concat_tables(txn.chunks)
            self._memory_bytes -= txn.memory_bytes
        return BufferedTxn(
            *(xid, txn.rows, txn.bytes, txn.first_seen, memory, txn.path, spill_bytes),
            tables=frozenset(txn.tables),
            truncates=tuple(txn.truncates),
        )

    def release(self, xid: str) -> None:
        """Delete the spill file of a taken transaction once the target committed it (idempotent).

        Args:
            xid: a transaction returned by :meth:`take`.

        Raises:
            ValueError: ``xid`` is still open (use :meth:`discard` for a rollback).
        """
        if xid in self._open:
            raise ValueError(f"transaction {xid!r} is still open; take() it first, or discard() it")
        path = self._taken.pop(xid, None)
        if path is not None:
            self._remove(path)

    def discard(self, xid: str) -> None:
        """Drop a rolled-back transaction: its memory rows and its spill file (idempotent).

        Args:
            xid: the rolled-back transaction.
        """
        txn = self._open.pop(xid, None)
        if txn is not None:
            self._memory_bytes -= txn.memory_bytes
            txn.chunks.clear()
            if txn.writer is not None and txn.path is not None:
                txn.writer.close()
                self._remove(txn.path)
        path = self._taken.pop(xid, None)
        if path is not None:
            self._remove(path)

    def open_transactions(self) -> list[OpenTxn]:
        """Describe every open transaction, in the order each was first added.

        Returns:
            One :class:`OpenTxn` per open xid.
        """
        return [
            OpenTxn(
                xid=txn.xid,
                rows=txn.rows,
                bytes=txn.bytes,
                first_seen=txn.first_seen,
                spilled=txn.path is not None,
                spill_path=txn.path,
                spill_bytes=_file_size(txn.path) if txn.path is not None else 0,
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

    def __enter__(self) -> TransactionBuffers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _flush(self, txn: _Txn) -> None:
        """Write the transaction's memory rows as one row group of its spill file, opening it if needed."""
        if not txn.chunks:
            return
        created = txn.writer is None
        if txn.writer is None:
            self._spill_dir.mkdir(parents=True, exist_ok=True)
            txn.path = self.spill_path(txn.xid)
            txn.writer = pq.ParquetWriter(txn.path, DAT_SCHEMA)
        txn.writer.write_table(pa.concat_tables(txn.chunks))
        self._memory_bytes -= txn.memory_bytes
        txn.chunks = []
        txn.memory_bytes = 0
        if created and txn.path is not None:
            self._events.append(SpillEvent("created", txn.path.name, _file_size(txn.path)))

    def _remove(self, path: Path) -> None:
        size = _file_size(path)
        path.unlink(missing_ok=True)
        self._events.append(SpillEvent("removed", path.name, size))
