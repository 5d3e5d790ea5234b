"""Running a workload: interleaving transactions and writing them as pairs.

The runner plays the source database's sessions. Each step it either starts a
transaction (a due special scenario first, else an ordinary one drawn from
the profile's mix) or advances one open transaction by one change, so rows of
concurrent transactions interleave in the log and commit order differs from
begin order. Everything random comes from one ``random.Random(seed)`` and
the simulated clock, so a seed always gives byte-identical pairs.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from applier.generate.database import DRAINING, Database
from applier.generate.model import Key, Txn
from applier.generate.profiles import Profile
from applier.generate.scenarios import SCHEMA_CHANGE, Scenario, plan
from applier.generate.scripts import SCRIPTS
from applier.generate.session import COMMIT, LEAVE_OPEN, ROLLBACK, Session
from applier.generate.stream import Stream
from applier.generate.tables import ADDED_COLUMN, CUSTOMERS, with_column
from applier.generate.values import RowFactory

# A scenario that found no target is retried; this many failures mean a bug.
MAX_SCENARIO_ATTEMPTS = 200
_DONE = object()


@dataclass
class _Pending:
    scenario: Scenario
    attempts: int = 0


@dataclass(eq=False)
class _Running:
    session: Session
    steps: Iterator[None]
    pending: _Pending | None  # the scenario it runs, None for an ordinary transaction


@dataclass
class RunState:
    """What a finished run leaves behind besides the stream totals.

    Attributes:
        started: transactions started.
        finished: transactions ended, or done and left open.
        left_open: transactions logged with a begin and no end.
        features: scenario kinds carried out, in completion order.
    """

    started: int = 0
    finished: int = 0
    left_open: int = 0
    features: dict[str, None] = field(default_factory=dict)


class Runner:
    """Interleaves the transactions of one workload.

    Args:
        profile: the workload's figures.
        total: transactions to start (special scenarios run even beyond it).
        db: the simulated database.
        stream: the log.
        rows: builds row values (shares the run's random source).
        progress: called with ``(finished, total)`` now and then (finished capped at total).
    """

    def __init__(
        self,
        profile: Profile,
        total: int,
        db: Database,
        stream: Stream,
        rows: RowFactory,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.profile, self.total, self.db, self.stream, self.rows = profile, total, db, stream, rows
        self.rng: random.Random = rows.rng
        self.progress = progress
        self.state = RunState()
        shared: dict[str, Key] = {}
        self.plan = [_Pending(sc) for sc in plan(profile, shared)]
        self.due: list[_Pending] = []
        self.next_due_at = 0  # started count at which the next planned scenario falls due
        self.regular: list[_Running] = []
        self.long: list[_Running] = []
        self.kinds = list(profile.mix)
        self.cum_weights = list(itertools.accumulate(profile.mix.values()))
        self.target = profile.concurrency
        self.xid = 4_000 + self.rng.randrange(1_000)
        self.report_every = max(1, total // 200)

    def run(self) -> RunState:
        """Run until every transaction has started and all but the open ones have ended.

        Returns:
            The run's figures.
        """
        while True:
            self._release_due()
            if self._wants_start() and self._start_next():
                continue
            if self.regular or self.long:
                self._step()
                continue
            if self.due or self.plan:
                kinds = sorted({p.scenario.kind for p in [*self.due, *self.plan]})
                raise RuntimeError(f"workload generator stalled: scenarios {kinds} can never start")
            if self.progress:
                self.progress(self.total, self.total)
            return self.state

    def _release_due(self) -> None:
        started = self.state.started
        if started < self.next_due_at:
            return
        while self.plan and (started >= self.total or self.plan[0].scenario.at * self.total <= started):
            self.due.append(self.plan.pop(0))
        self.next_due_at = int(self.plan[0].scenario.at * self.total) if self.plan else self.total

    def _wants_start(self) -> bool:
        more = self.state.started < self.total or bool(self.due)
        return more and len(self.regular) < self.target

    def _start_next(self) -> bool:
        for pending in self.due:
            if self._ready(pending.scenario):
                self.due.remove(pending)
                self._start_scenario(pending)
                return True
        if self.state.started < self.total:
            self._start_regular()
            return True
        return False

    def _ready(self, sc: Scenario) -> bool:
        if sc.after is not None and sc.after not in self.state.features:
            return False
        if sc.final and any(not p.scenario.final for p in [*self.plan, *self.due]):
            return False
        if any(not self.db.pk[table].rows for table in sc.needs_rows if table in self.db.pk):
            return False
        if any(not self.db.bags[table].counts for table in sc.needs_rows if table in self.db.bags):
            return False
        if sc.gate is not None:
            # Gating stops new users of the table; the scenario starts once the
            # transactions that already changed it have ended.
            self.db.gate(sc.gate)
            return self.db.gates[sc.gate] == DRAINING and self.db.idle(sc.gate)
        return all(table not in self.db.gates for table in sc.tables)

    def _new_session(self, outcome: str) -> Session:
        self.xid += 1 if self.rng.random() < 0.9 else self.rng.randint(2, 9)
        self.state.started += 1
        started = self.state.started
        if started % 64 == 0:
            self.target = self.rng.randint(1, self.profile.concurrency)
        return Session(self.db, self.stream, self.rows, Txn(str(self.xid)), outcome)

    def _start_regular(self) -> None:
        profile, rng = self.profile, self.rng
        outcome = ROLLBACK if rng.random() < profile.rollback_rate else COMMIT
        session = self._new_session(outcome)
        c = profile.changes_per_txn
        if rng.random() < profile.empty_rate:
            steps: Iterator[None] = iter(())
        else:
            kind = rng.choices(self.kinds, cum_weights=self.cum_weights)[0]
            steps = SCRIPTS[kind](session, rng.randint(max(1, c // 2), c + c // 2))
        self.regular.append(_Running(session, steps, None))

    def _start_scenario(self, pending: _Pending) -> None:
        sc = pending.scenario
        if sc.script is None:
            self._schema_change(sc)
            return
        session = self._new_session(sc.outcome)
        if sc.gate is not None:
            self.db.gates[sc.gate] = session.txn.xid
        (self.long if sc.long else self.regular).append(_Running(session, sc.script(session), pending))

    def _schema_change(self, sc: Scenario) -> None:
        """Add the nullable column to ``shop.customers`` while no transaction uses the table."""
        if sc.gate != CUSTOMERS:
            raise RuntimeError(f"schema change scenario gates {sc.gate}, expected {CUSTOMERS}")
        evolved = with_column(self.db.pk[CUSTOMERS].definition, ADDED_COLUMN)
        self.db.evolve(evolved, {ADDED_COLUMN.name: None})
        self.stream.define_table(evolved)
        self.rows.customer_phone = True
        del self.db.gates[CUSTOMERS]
        self.state.features[SCHEMA_CHANGE] = None

    def _step(self) -> None:
        use_long = bool(self.long) and (not self.regular or self.rng.random() < self.profile.long_share)
        pool = self.long if use_long else self.regular
        at = int(self.rng.random() * len(pool))
        running = pool[at]
        if next(running.steps, _DONE) is _DONE:
            pool[at] = pool[-1]
            pool.pop()
            self._finish(running)

    def _finish(self, running: _Running) -> None:
        session, txn = running.session, running.session.txn
        if session.outcome == LEAVE_OPEN:
            self.state.left_open += txn.begun
        else:
            commit = session.outcome == COMMIT
            (self.db.commit if commit else self.db.rollback)(txn)
            self.stream.end(txn, commit=commit)
        self.state.finished += 1
        if self.progress and self.state.finished % self.report_every == 0:
            self.progress(min(self.state.finished, self.total), self.total)
        pending = running.pending
        if pending is None:
            return
        if pending.scenario.kind in session.features:
            self.state.features[pending.scenario.kind] = None
            return
        pending.attempts += 1
        if pending.attempts >= MAX_SCENARIO_ATTEMPTS:
            raise RuntimeError(f"scenario {pending.scenario.kind} found no target in {pending.attempts} tries")
        self.due.append(pending)
