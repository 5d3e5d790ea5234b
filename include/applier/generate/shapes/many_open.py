"""The ``many-open`` workload: thousands of transactions open at once, ending together.

After a committed initial load, ``total`` transactions begin one after another
(all of them within the first third of their rows) and make about 25 changes
each, their rows interleaved at random, so every pair holds rows of
thousands of open transactions. None ends until all have made their changes;
then they commit (a few roll back) in random order, in the last pair or two.
An Applier that limits its cycles buffers all of them for many cycles and
applies them in one.
"""

from __future__ import annotations

from collections.abc import Callable

from applier.generate.runner import RunState
from applier.generate.session import COMMIT, ROLLBACK
from applier.generate.shapes.ops import Mine, Shaped
from applier.generate.shapes.session import ShapeSession
from applier.generate.shapes.tables import ShapedTable

LOAD_ROWS_PER_TXN = 4  # initial-load rows per open transaction, spread by table weight
CHANGES = (20, 30)  # per transaction
TABLES_PER_TXN = (1, 3)
ROLLBACK_RATE = 0.02
BEGIN_WITHIN = 1 / 3  # share of the open transactions' rows by which all of them have begun


class _Open:
    """One open transaction: its session, tables, what it changed and the changes it has left."""

    __slots__ = ("left", "mine", "session", "tables")

    def __init__(self, session: ShapeSession, tables: list[ShapedTable], left: int) -> None:
        self.session, self.tables, self.left, self.mine = session, tables, left, Mine()


class ManyOpenRunner:
    """Runs one ``many-open`` workload on a :class:`Shaped` state.

    Args:
        shaped: the tables, database and log.
        total: transactions open at once.
        progress: called with ``(finished, total)`` now and then.
    """

    def __init__(self, shaped: Shaped, total: int, progress: Callable[[int, int], None] | None = None) -> None:
        self.shaped, self.total, self.progress = shaped, total, progress
        self.rng = shaped.rng

    def run(self) -> RunState:
        """Load, open every transaction, interleave their changes, then end them all.

        Returns:
            The run's figures.
        """
        self._load()
        waiting = [self._new() for _ in range(self.total)]
        waiting.reverse()  # begin in xid order
        rows = sum(o.left for o in waiting)
        begin_rate = min(1.0, len(waiting) / max(1.0, rows * BEGIN_WITHIN))
        active: list[_Open] = []
        done: list[_Open] = []
        rnd = self.rng.random
        while waiting or active:
            if waiting and (not active or rnd() < begin_rate):
                active.append(waiting.pop())
                at = len(active) - 1
            else:
                at = int(rnd() * len(active))
            running = active[at]
            self.shaped.change(running.session, running.tables[int(rnd() * len(running.tables))], running.mine)
            running.left -= 1
            if not running.left:
                active[at] = active[-1]
                active.pop()
                done.append(running)
        self.shaped.feature("many_open")
        self._end(done)
        return self.shaped.state

    def _load(self) -> None:
        shaped = self.shaped
        todo = [t for t in shaped.tables for _ in range(1 + round(t.weight * LOAD_ROWS_PER_TXN * self.total))]
        shaped.load(todo)

    def _new(self) -> _Open:
        rng, shaped = self.rng, self.shaped
        session = shaped.session(ROLLBACK if rng.random() < ROLLBACK_RATE else COMMIT)
        size = rng.randint(*TABLES_PER_TXN)
        tables = list(dict.fromkeys(rng.choices(shaped.tables, weights=[t.weight for t in shaped.tables], k=size)))
        return _Open(session, tables, rng.randint(*CHANGES))

    def _end(self, done: list[_Open]) -> None:
        self.rng.shuffle(done)
        report_every = max(1, len(done) // 100)
        for finished, running in enumerate(done, start=1):
            self.shaped.finish(running.session)
            if self.progress and finished % report_every == 0:
                self.progress(finished, len(done))
        if self.progress:
            self.progress(len(done), len(done))
