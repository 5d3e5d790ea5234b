"""The ``wide`` workload: many tables, skewed concurrent transactions over them.

First an initial load gives every table rows (the hot ones many), one
transaction at a time, as a snapshot load would. Then ordinary transactions
run concurrently: each touches one to four tables drawn by the tables'
weights, makes a handful of changes (a few make hundreds and stay open across
pairs), and commits or, now and then, rolls back. Rare truncates gate a cold
table, wait until no open transaction uses it, then empty and refill it. The
last few transactions stay open at the end of the stream.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from applier.generate.database import DRAINING
from applier.generate.runner import RunState
from applier.generate.session import COMMIT, LEAVE_OPEN, ROLLBACK
from applier.generate.shapes.ops import Mine, Shaped
from applier.generate.shapes.session import ShapeSession
from applier.generate.shapes.tables import ShapedTable

LOAD_ROWS_PER_TXN = 1.0  # initial-load rows per ordinary transaction, spread by table weight
LOAD_MIN_ROWS = 2  # every table starts with at least this many rows
MEAN_CHANGES = 9  # of an ordinary transaction
MOST_CHANGES = 60
LONG_RATE = 0.003
LONG_CHANGES = (200, 1200)
TABLES_PER_TXN = (1, 2, 3, 4)
TABLES_PER_TXN_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
ROLLBACK_RATE = 0.03
EMPTY_RATE = 0.002
_END = object()
CONCURRENCY = (2, 10)  # fewest and most ordinary transactions open at once (redrawn every 64)
TRUNCATE_EVERY = 20_000  # ordinary transactions per planned truncate (beyond one keyed and one keyless)
LEAVE_OPEN_AT_END = 2


@dataclass(eq=False)
class _Running:
    session: ShapeSession
    steps: Iterator[None]


class WideRunner:
    """Runs one ``wide`` workload on a :class:`Shaped` state.

    Args:
        shaped: the tables, database and log.
        total: ordinary transactions to run (the initial load and truncates come on top).
        progress: called with ``(finished, total)`` now and then.
    """

    def __init__(self, shaped: Shaped, total: int, progress: Callable[[int, int], None] | None = None) -> None:
        self.shaped, self.total, self.progress = shaped, total, progress
        self.rng = shaped.rng
        self.open: list[_Running] = []
        self.started = self.finished = 0
        self.target = CONCURRENCY[1]
        self.cum_weights = list(itertools.accumulate(t.weight for t in shaped.tables))
        self.truncates = self._plan_truncates()
        self.report_every = max(1, total // 200)

    def _plan_truncates(self) -> list[tuple[int, ShapedTable]]:
        """Truncates at even points of the run, of cold tables, keyed and keyless in turn."""
        cold = sorted(self.shaped.tables, key=lambda t: (t.weight, t.name))[: max(1, len(self.shaped.tables) // 2)]
        count = 2 + self.total // TRUNCATE_EVERY
        plan = []
        for i in range(count):
            keyed = [t for t in cold if t.keyed == (i % 2 == 0)] or cold
            plan.append((self.total * (i + 1) // (count + 1), keyed[int(self.rng.random() * len(keyed))]))
        return plan

    def run(self) -> RunState:
        """Load, then run every ordinary transaction and the planned truncates.

        Returns:
            The run's figures.
        """
        self._load()
        while True:
            if self._start_truncate():
                continue
            if self.started < self.total and len(self.open) < self.target:
                self._start()
            elif self.open:
                self._step()
            elif not self.truncates:
                break
            else:
                raise RuntimeError(f"wide workload stalled: {self.truncates[0][1].name} is never idle to truncate")
        if self.progress:
            self.progress(self.total, self.total)
        return self.shaped.state

    def _load(self) -> None:
        shaped = self.shaped
        per_txn = LOAD_ROWS_PER_TXN * self.total
        rows = ((t, LOAD_MIN_ROWS + round(t.weight * per_txn)) for t in shaped.tables)
        todo = [t for t, n in rows for _ in range(n)]
        shaped.load(todo)

    def _start_truncate(self) -> bool:
        if not self.truncates or self.started < self.truncates[0][0]:
            return False
        table = self.truncates[0][1]
        db = self.shaped.db
        db.gate(table.name)  # no new transaction changes it from now on
        if db.gates[table.name] != DRAINING or not db.idle(table.name):  # another truncate may still own it
            return False
        self.truncates.pop(0)
        session = self.shaped.session(COMMIT)
        db.gates[table.name] = session.txn.xid
        self.open.append(_Running(session, self._truncate(session, table)))
        return True

    def _truncate(self, s: ShapeSession, table: ShapedTable) -> Iterator[None]:
        s.truncate(table.name)
        yield
        for _ in range(3 + int(self.rng.random() * 20)):
            self.shaped.insert(s, table)
            yield
        self.shaped.feature("truncate" if table.keyed else "truncate_keyless")

    def _start(self) -> None:
        rng, shaped = self.rng, self.shaped
        self.started += 1
        if self.started % 64 == 0:
            self.target = rng.randint(*CONCURRENCY)
        last = self.started > self.total - LEAVE_OPEN_AT_END
        outcome = LEAVE_OPEN if last else ROLLBACK if rng.random() < ROLLBACK_RATE else COMMIT
        session = shaped.session(outcome)
        if not last and rng.random() < EMPTY_RATE:
            self.open.append(_Running(session, iter(())))
            return
        if rng.random() < LONG_RATE or self.started == self.total // 3 + 1:  # at least one per run
            changes = rng.randint(*LONG_CHANGES)
            shaped.feature("long_transaction")
        else:
            changes = min(MOST_CHANGES, 1 + int(rng.expovariate(1 / (MEAN_CHANGES - 1))))
        size = rng.choices(TABLES_PER_TXN, weights=TABLES_PER_TXN_WEIGHTS)[0]
        drawn = rng.choices(shaped.tables, cum_weights=self.cum_weights, k=size)
        # A transaction left open never ends, so it keeps off the tables waiting to be truncated.
        avoid = {t.name for _, t in self.truncates} if last else set()
        tables = [t for t in dict.fromkeys(drawn) if session.may_touch(t.name) and t.name not in avoid]
        self.open.append(_Running(session, self._ordinary(session, tables, changes)))

    def _ordinary(self, s: ShapeSession, tables: list[ShapedTable], changes: int) -> Iterator[None]:
        if not tables:
            return
        mine, rnd, change = Mine(), self.rng.random, self.shaped.change
        for _ in range(changes):
            change(s, tables[int(rnd() * len(tables))], mine)
            yield

    def _step(self) -> None:
        at = int(self.rng.random() * len(self.open))
        running = self.open[at]
        if next(running.steps, _END) is _END:
            self.open[at] = self.open[-1]
            self.open.pop()
            self.shaped.finish(running.session)
            self.finished += 1
            if self.progress and self.finished % self.report_every == 0:
                self.progress(min(self.finished, self.total), self.total)
