"""Observation of a workload: the backlog's pairs, or a sample of them, measured for the advisor (reads files).

Two passes over the same pairs, one pair in memory at a time: the first
(:mod:`applier.advise.shapes`) reads the row images for each table's
expanded row size; the second (:mod:`applier.advise.transactions`) reads the
rows and transaction events and measures every transaction with those row
sizes. A sample is the backlog's first pairs, so the transactions in it are
followed whole as the next cycles will meet them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from applier.advise.arithmetic import Layout, row_entry_bytes
from applier.advise.shapes import TableShape, observe_shapes
from applier.advise.transactions import TransactionFigures, TransactionTracker
from applier.config import Config
from applier.engine.buffers import row_bytes
from applier.engine.checkpoint import CheckpointStore
from applier.intermediate.events import Event, Record
from applier.intermediate.pairs import DAT_COLUMNS, PairRef, list_pairs


@dataclass(frozen=True)
class Observation:
    """What the advisor measured.

    Attributes:
        layout: the ER layout the memory figures use.
        applied_seq: the checkpoint's last applied pair; the backlog follows it.
        backlog_pairs: complete pairs in the backlog (up to a gap).
        read: the pairs read (the whole backlog, or its first pairs as a sample).
        pair_bytes: the size of the pairs read (``.dat`` + ``.trn``).
        largest_pair_bytes: the largest of them.
        rows: the rows in them.
        row_memory: every row's memory by the arithmetic (row header + hash + row size), headers of
            transactions not included.
        row_buffered: every row's bytes as the Applier buffers them.
        tables: per table, its shape (definition, observed maxima, rows).
        transactions: the transactions' figures.
    """

    layout: Layout
    applied_seq: int
    backlog_pairs: int
    read: tuple[PairRef, ...] = ()
    pair_bytes: int = 0
    largest_pair_bytes: int = 0
    rows: int = 0
    row_memory: int = 0
    row_buffered: int = 0
    tables: Mapping[str, TableShape] = field(default_factory=dict)
    transactions: TransactionFigures = field(default_factory=TransactionFigures)

    def entry_bytes(self, table: str) -> int:
        """What one row of ``table`` takes by the arithmetic: row header + hash + expanded row size."""
        return row_entry_bytes(self.layout, self.tables[table].row_size)


class _EventLine(msgspec.Struct):
    """The fields of a ``.trn`` event line the tracker needs (the rest is skipped)."""

    record: Record
    xid: str
    lsn: int


def events_of(ref: PairRef) -> list[Event]:
    """The events of a pair already checked (by the first pass), parsed without checking them again."""
    decoder = msgspec.json.Decoder(_EventLine)
    lines = ref.trn_path.read_bytes().split(b"\n")[1:]  # the header first
    return [Event(e.record, e.xid, e.lsn, "") for e in map(decoder.decode, filter(None, lines))]


_ROWS_SCHEMA = pa.schema([("lsn", pa.int64()), ("xid", pa.string()), ("table", pa.string()), ("buffered", pa.int64())])


def rows_of(ref: PairRef, batch_rows: int = 65_536) -> pa.Table:
    """A pair's rows as the tracker needs them: lsn, xid, table and the bytes each row takes as buffered.

    The images are read a batch of rows at a time and reduced to their size
    at once; what is kept is a few narrow columns per row.
    """
    parts = [_ROWS_SCHEMA.empty_table()]
    for batch in pq.ParquetFile(ref.dat_path).iter_batches(batch_size=batch_rows, columns=list(DAT_COLUMNS)):
        size = row_bytes(pa.Table.from_batches([batch]))
        names = [batch["xid"].cast(pa.string()), batch["table"].cast(pa.string())]  # large_string is allowed too
        parts.append(pa.table([batch["lsn"], *names, size], schema=_ROWS_SCHEMA))
    return pa.concat_tables(parts)


def measure_pairs(refs: Sequence[PairRef], layout: Layout) -> tuple[dict[str, TableShape], TransactionTracker]:
    """Measure the pairs ``refs`` (in sequence order): the tables' shapes, then every transaction.

    Args:
        refs: complete, contiguous pairs.
        layout: the ER layout for the memory figures.

    Returns:
        The tables' shapes and the tracker that followed the transactions
        (call :meth:`TransactionTracker.finish` for the figures).

    Raises:
        IntermediateFileError: a pair breaks the spec.
    """
    shapes = observe_shapes(refs)
    tracker = TransactionTracker(layout, {name: row_entry_bytes(layout, s.row_size) for name, s in shapes.items()})
    for ref in refs:
        tracker.add_pair(events_of(ref), rows_of(ref))
    return shapes, tracker


def observe_backlog(config: Config, layout: Layout, sample_pairs: int | None = None) -> Observation:
    """Measure the pairs after the checkpoint's ``applied_seq``, or the first ``sample_pairs`` of them.

    Args:
        config: the configuration (its intermediate and work folders).
        layout: the ER layout for the memory figures.
        sample_pairs: read only this many pairs; None reads the whole backlog.

    Returns:
        The observation; without pairs (no backlog, or no intermediate
        folder) it holds no tables and no transactions.

    Raises:
        IntermediateFileError: a pair breaks the spec.
    """
    applied = CheckpointStore(config.work_dir).load().applied_seq
    if not config.intermediate_dir.is_dir():
        return Observation(layout, applied, 0)
    backlog = list_pairs(config.intermediate_dir, applied + 1).pairs
    read = backlog if sample_pairs is None else backlog[:sample_pairs]
    if not read:
        return Observation(layout, applied, len(backlog))
    shapes, tracker = measure_pairs(read, layout)
    return Observation(
        layout=layout,
        applied_seq=applied,
        backlog_pairs=len(backlog),
        read=tuple(read),
        pair_bytes=sum(r.size for r in read),
        largest_pair_bytes=max(r.size for r in read),
        rows=sum(s.rows for s in shapes.values()),
        row_memory=tracker.row_memory,
        row_buffered=tracker.row_buffered,
        tables=shapes,
        transactions=tracker.finish(),
    )
