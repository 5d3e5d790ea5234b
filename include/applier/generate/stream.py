"""The log the simulated database writes: lsns, times and the writer behind them.

Every row and event takes the next log sequence number (with an occasional
gap, as other activity in a real log leaves) and a slightly later simulated
time. A transaction's ``begin`` is logged just before its first row, so the
writer always keeps a ``begin`` in the pair of the first row.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from applier.generate.clock import SimClock
from applier.generate.model import Txn
from applier.generate.values import Row
from applier.intermediate.schema import TableDef
from applier.intermediate.writer import IntermediateWriter


@dataclass
class StreamStats:
    """Running totals of what the stream holds."""

    rows: int = 0
    rows_per_table: dict[str, int] = field(default_factory=dict)
    rows_per_op: dict[str, int] = field(default_factory=dict)
    committed: int = 0
    rolled_back: int = 0
    empty: int = 0
    pairs: int = 0
    bytes: int = 0
    first_lsn: int | None = None
    last_lsn: int | None = None

    def add_pair(self, seq: int, size: int) -> None:
        """Writer callback: one more pair of ``size`` bytes is in place."""
        del seq
        self.pairs += 1
        self.bytes += size


class Stream:
    """Turns model changes into writer calls with increasing lsns and times.

    Args:
        writer: where pairs go; its clock should read ``clock``.
        rng: the generator's random source (for lsn gaps and time steps).
        clock: simulated time.
        stats: totals to update.
        first_lsn: the lsn just below the stream's first one.
    """

    def __init__(
        self, writer: IntermediateWriter, rng: random.Random, clock: SimClock, stats: StreamStats, first_lsn: int
    ) -> None:
        self.writer = writer
        self.rng = rng
        self.clock = clock
        self.stats = stats
        self.lsn = first_lsn

    def _tick(self) -> int:
        # One random draw decides both the lsn step (mostly +1, now and then a
        # gap) and the time step, to keep the per-row cost low.
        r = self.rng.random()
        self.lsn += 1 if r < 0.97 else 2 + int(r * 1e6) % 50
        self.clock.advance(1 + int(r * 400))
        if self.stats.first_lsn is None:
            self.stats.first_lsn = self.lsn
        self.stats.last_lsn = self.lsn
        return self.lsn

    def _begin(self, txn: Txn) -> None:
        self.clock.advance(self.rng.randrange(20_000))
        self.writer.begin(txn.xid, self._tick(), self.clock.now())
        txn.begun = True

    def row(self, txn: Txn, table: str, op: str, before: Row | None, after: Row | None) -> None:
        """Log one row change of ``txn`` (and its ``begin`` first if it has none yet)."""
        if not txn.begun:
            self._begin(txn)
        self.writer.row(self._tick(), txn.xid, table, op, before, after)
        txn.rows += 1
        txn.pairs.add(self.writer.next_seq)
        stats = self.stats
        stats.rows += 1
        stats.rows_per_table[table] = stats.rows_per_table.get(table, 0) + 1
        stats.rows_per_op[op] = stats.rows_per_op.get(op, 0) + 1

    def end(self, txn: Txn, *, commit: bool) -> None:
        """Log ``txn``'s commit or rollback (a transaction without rows gets its begin first)."""
        if not txn.begun:
            self._begin(txn)
            self.stats.empty += 1
        self.clock.advance(self.rng.randrange(2_000))
        if commit:
            self.writer.commit(txn.xid, self._tick(), self.clock.now())
            self.stats.committed += 1
        else:
            self.writer.rollback(txn.xid, self._tick(), self.clock.now())
            self.stats.rolled_back += 1

    def define_table(self, definition: TableDef) -> None:
        """Describe ``definition`` for the rows that follow (a schema change mid-stream)."""
        self.writer.define_table(definition)
