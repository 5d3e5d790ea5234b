"""Applying a cycle table by table, several tables at once, for targets that commit per table."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from applier.engine.changes import TableChanges
from applier.engine.compiled import admit, release
from applier.targets import CycleLoad, Part


class PerTableTarget(Protocol):
    """Applies one table's changes in one commit.

    ``apply_one`` returns whether it applied them (False: the table already
    held the cycle), the cycle the table's state holds afterwards and the
    collisions it counted, per kind.
    """

    def apply_one(
        self, cycle_id: int, changes: TableChanges, part: Part | None = None
    ) -> tuple[bool, int, dict[str, int]]: ...


def apply_tables(
    target: PerTableTarget,
    threads: int,
    cycle_id: int,
    changes: Mapping[str, TableChanges],
    part: Part | None = None,
    names: Iterable[str] | None = None,
) -> CycleLoad:
    """Apply each table's changes in its own commit, ``threads`` tables at once (``part``: see ``Target.apply_cycle``).

    ``names``: the tables of ``changes`` to apply (None: every one).

    A table is taken once the queue has room for it (:meth:`~applier.engine.compiled.CompiledCycle.admit`):
    fewer tables at once when they are large against the queue-memory budget.

    A table already holding the cycle is skipped (a re-run after a crash
    between two table commits). The first failure is raised once the tables
    under way have finished; tables committed before it skip the cycle when it
    is re-run.
    """
    load = CycleLoad()

    def one(name: str) -> tuple[str, bool, int, dict[str, int], float]:
        started = time.perf_counter()
        try:
            admit(changes, name)  # flow control: the tables being applied stay within the queue's budget
            applied, held, found = target.apply_one(cycle_id, changes[name], part)
        finally:
            release(changes, name)
        return name, applied, held, found, time.perf_counter() - started

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for name, applied, held, found, seconds in pool.map(one, sorted(changes if names is None else names)):
            if not applied:
                load.skipped_tables.append(name)
            if found:
                load.collisions[name] = found
            load.held[name] = held
            load.table_seconds[name] = {"apply": round(seconds, 3)}
    return load
