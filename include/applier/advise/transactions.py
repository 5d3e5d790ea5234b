"""Transactions of a workload, followed from begin to end across pairs (reads files).

Each transaction is measured two ways:

- **by the arithmetic** (:mod:`applier.advise.arithmetic`): transaction header
  plus, per row, row header + hash option + its table's expanded row size;
- **as the Applier buffers it**: the engine's own byte count of buffered rows
  (:func:`applier.engine.buffers.row_bytes`: 8 for the lsn plus the UTF-8
  bytes of xid, table, op and both images), the figure it compares with
  ``apply.buffer_size_for_split_records`` and half the queue memory.

The tracker walks events and rows in lsn order: memory of the open
transactions rises with each row (and, by the arithmetic, a header at each
begin) and falls at each commit or rollback, so its peak is read just before
an end event or at the end of a pair. Rows are summed with pyarrow per pair;
only the events are walked in Python. It keeps one small record per open
transaction and three integers per transaction seen, so memory does not
follow the rows.

A transaction whose begin precedes the pairs read is counted from its first
row seen (its figures are then a lower bound); one still open after the last
pair is counted with the rows it has so far.
"""

from __future__ import annotations

import bisect
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import pyarrow as pa

from applier.advise.arithmetic import Layout, percentile
from applier.intermediate.events import Event
from applier.lookup import looked_up

P99 = 0.99


@dataclass(frozen=True)
class TransactionFigures:
    """The transactions of the pairs read.

    Attributes:
        seen: transactions with a begin, a row or an end in the pairs read.
        ended: of those, committed or rolled back in them.
        open_at_end: still open after the last pair read.
        began_before: first seen by a row, their begin being in an earlier pair.
        rows_p99, rows_max: rows per transaction.
        memory_p99, memory_max: bytes per transaction by the arithmetic.
        buffered_p99, buffered_max: bytes per transaction as the Applier buffers them.
        most_open: the most transactions open at once.
        peak_open_memory: the peak memory of the open transactions by the arithmetic.
        peak_open_buffered: the peak bytes of the open transactions as buffered.
        largest_by_table: per table, the most rows of it one transaction held.
    """

    seen: int = 0
    ended: int = 0
    open_at_end: int = 0
    began_before: int = 0
    rows_p99: int = 0
    rows_max: int = 0
    memory_p99: int = 0
    memory_max: int = 0
    buffered_p99: int = 0
    buffered_max: int = 0
    most_open: int = 0
    peak_open_memory: int = 0
    peak_open_buffered: int = 0
    largest_by_table: Mapping[str, int] = field(default_factory=dict)


@dataclass
class _Open:
    """An open transaction's figures so far (its header not included)."""

    rows: int = 0
    memory: int = 0
    buffered: int = 0
    tables: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class _PairRows:
    """One pair's rows summed for the tracker."""

    lsns: list[int]
    memory: list[int]  # prefix sums of the rows' memory by the arithmetic, from 0
    buffered: list[int]  # prefix sums of the rows' buffered bytes, from 0
    by_xid: dict[str, _Open]


def _pair_rows(data: pa.Table, entry_bytes: Mapping[str, int]) -> _PairRows:
    """Sum a pair's rows (columns lsn, xid, table, buffered) per row and per transaction."""
    if not data.num_rows:
        return _PairRows([], [0], [0], {})
    costs = looked_up(data["table"], entry_bytes)
    buffered = data["buffered"]
    rows = pa.table({"xid": data["xid"], "table": data["table"], "memory": costs, "buffered": buffered})
    by_xid: dict[str, _Open] = {}
    sums = rows.group_by("xid").aggregate([("memory", "count"), ("memory", "sum"), ("buffered", "sum")])
    for xid, count, memory, size in zip(
        *(sums[c].to_pylist() for c in ("xid", "memory_count", "memory_sum", "buffered_sum")), strict=True
    ):
        by_xid[xid] = _Open(count, memory, size)
    per_table = rows.group_by(["xid", "table"]).aggregate([("memory", "count")])
    for xid, table, count in zip(*(per_table[c].to_pylist() for c in ("xid", "table", "memory_count")), strict=True):
        by_xid[xid].tables[table] = count
    return _PairRows(
        lsns=data["lsn"].to_pylist(),
        memory=[0, *accumulate(costs.to_pylist())],
        buffered=[0, *accumulate(buffered.to_pylist())],
        by_xid=by_xid,
    )


class TransactionTracker:
    """Follows transactions through pairs given in sequence order and measures them.

    Args:
        layout: the ER layout of the arithmetic.
        entry_bytes: per table, what one of its rows takes by the arithmetic
            (row header + hash option + expanded row size).
    """

    def __init__(self, layout: Layout, entry_bytes: Mapping[str, int]) -> None:
        self.layout = layout
        self.entry_bytes = dict(entry_bytes)
        self.open: dict[str, _Open] = {}
        self.rows, self.memory, self.buffered = array("q"), array("q"), array("q")
        self.largest: dict[str, int] = {}
        self.ended = self.began_before = self.most_open = 0
        # Open transactions' memory at the start of the current pair, and the peaks.
        self.base_memory = self.base_buffered = 0
        self.peak_memory = self.peak_buffered = 0
        # Every row's memory by the arithmetic and buffered bytes, over the pairs read.
        self.row_memory = self.row_buffered = 0

    def add_pair(self, events: Sequence[Event], data: pa.Table) -> None:
        """Follow one pair: its events and its rows in lsn order (columns lsn, xid, table, and buffered:
        the bytes of each row as the Applier buffers it, :func:`applier.engine.buffers.row_bytes`)."""
        rows = _pair_rows(data, self.entry_bytes)
        self.row_memory += rows.memory[-1]
        self.row_buffered += rows.buffered[-1]
        begun_here = {e.xid for e in events if e.record == "begin"}
        for xid in sorted(rows.by_xid.keys() - self.open.keys() - begun_here):
            self.base_memory += self._begin(xid)  # begun in a pair before those read
            self.began_before += 1
        memory, buffered = self.base_memory, self.base_buffered  # both less the rows so far in this pair
        for event in events:
            if event.record == "begin":
                memory += self._begin(event.xid)
                continue
            before = bisect.bisect_left(rows.lsns, event.lsn)
            self._peak(memory + rows.memory[before], buffered + rows.buffered[before])
            finished = self.open.pop(event.xid, None)
            if finished is not None:
                part = rows.by_xid.pop(event.xid, _Open())
                _merge(finished, part)
                self._record(finished)
                self.ended += 1
                memory -= finished.memory + self.layout.transaction_header
                buffered -= finished.buffered
        self.base_memory = memory + rows.memory[-1]
        self.base_buffered = buffered + rows.buffered[-1]
        self._peak(self.base_memory, self.base_buffered)
        for xid, part in rows.by_xid.items():
            if xid in self.open:
                _merge(self.open[xid], part)

    def _begin(self, xid: str) -> int:
        """Open ``xid``; returns the memory its header adds (0 if it was open already)."""
        if xid in self.open:
            return 0
        self.open[xid] = _Open()
        self.most_open = max(self.most_open, len(self.open))
        return self.layout.transaction_header

    def _peak(self, memory: int, buffered: int) -> None:
        self.peak_memory = max(self.peak_memory, memory)
        self.peak_buffered = max(self.peak_buffered, buffered)

    def _record(self, txn: _Open) -> None:
        self.rows.append(txn.rows)
        self.memory.append(txn.memory + self.layout.transaction_header)
        self.buffered.append(txn.buffered)
        for table, count in txn.tables.items():
            self.largest[table] = max(self.largest.get(table, 0), count)

    def finish(self) -> TransactionFigures:
        """The figures of every transaction seen, those still open counted with their rows so far."""
        for txn in self.open.values():
            self._record(txn)
        return TransactionFigures(
            seen=len(self.rows),
            ended=self.ended,
            open_at_end=len(self.open),
            began_before=self.began_before,
            rows_p99=percentile(self.rows, P99),
            rows_max=max(self.rows, default=0),
            memory_p99=percentile(self.memory, P99),
            memory_max=max(self.memory, default=0),
            buffered_p99=percentile(self.buffered, P99),
            buffered_max=max(self.buffered, default=0),
            most_open=self.most_open,
            peak_open_memory=self.peak_memory,
            peak_open_buffered=self.peak_buffered,
            largest_by_table=dict(sorted(self.largest.items())),
        )


def _merge(into: _Open, part: _Open) -> None:
    into.rows += part.rows
    into.memory += part.memory
    into.buffered += part.buffered
    into.tables.update(part.tables)
