"""A cycle's Delta commits made by Spark executor tasks, not by the driver.

A table's MERGE (or a keyless table's rewrite) reads its target files and
grows with the table, not with the cycle: on a cluster, the tables whose
compiled changes are in files are committed by one Spark job when they weigh
enough (:mod:`~applier.targets.executor_tasks`); the driver commits the rest
meanwhile (tables with CHECK constraints, which it checks first, and tables
whose changes net to nothing).

The task does exactly what the driver would (:meth:`DeltaTarget.apply_one`):
it reads the table's changes from the job's folder, opens the table afresh,
reads the cycle it holds, and skips a cycle already committed. A task that
Spark runs again after a lost executor therefore cannot commit twice. It never
runs twice at once: with ``spark.speculation`` on, every table is committed by
the driver. What the task found (applied or skipped, the cycle held, the
collisions, the table's CHECK constraints) or the error it met goes back to
the driver, which records and raises it as if it had written the table itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from applier.engine.changes import TableChanges
from applier.engine.worker_path import prepare_worker
from applier.targets import CycleLoad, Part
from applier.targets.collisions import Collisions
from applier.targets.executor_tasks import TableWrite, beside_executors, read_changes, sendable
from applier.targets.per_table import PerTableTarget, apply_tables


@dataclass(frozen=True)
class CycleCommit:
    """What every task of a cycle's job shares: the target, its collisions and the cycle (or part) committed."""

    root: str
    app_id: str
    collisions: Collisions
    cycle_id: int
    part: Part | None
    compact_min_files: int


@dataclass(frozen=True)
class Written:
    """What a task did with one table: ``apply_one``'s answer, its seconds, the table's constraints, or the error."""

    name: str
    applied: bool = False
    held: int = 0
    found: Mapping[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    constraints: Mapping[str, str] | None = None
    error: BaseException | None = None


class ExecutorWriter(PerTableTarget, Protocol):
    """A per-table target that learns what the executors found of its tables' constraints."""

    threads: int

    def learn_constraints(self, table: str, constraints: Mapping[str, str]) -> None: ...


def apply_beside_executors(
    target: ExecutorWriter,
    spark: Any,
    commit: CycleCommit,
    writes: Sequence[TableWrite],
    changes: Mapping[str, TableChanges],
) -> CycleLoad:
    """Commit ``writes`` on the executors while the driver commits the cycle's other tables; the load of both.

    Raises:
        TargetError: as :func:`~applier.targets.per_table.apply_tables` does, once both are done: the
            driver's failure first, then the executors' first by table name; the job's own failure
            (a task lost with its worker after Spark's retries) as a transient one, class ``connection``.
    """
    off = {w.table.name for w in writes}
    rest = [n for n in sorted(changes) if n not in off]
    load, done = beside_executors(
        spark,
        commit.cycle_id,
        "Delta commits",
        "the tables they committed skip the cycle when it is applied again",
        writes,
        partial(_commit_tables, commit),
        partial(apply_tables, target, target.threads, commit.cycle_id, changes, commit.part, rest),
    )
    written = sorted(done, key=lambda w: w.name)
    for one in written:
        if one.constraints is not None:
            target.learn_constraints(one.name, one.constraints)
    errors = [one.error for one in written if one.error is not None]
    if errors:
        raise errors[0]
    for one in written:
        if not one.applied:
            load.skipped_tables.append(one.name)
        if one.found:
            load.collisions[one.name] = dict(one.found)
        load.held[one.name] = one.held
        load.table_seconds[one.name] = {"apply_on_executor": round(one.seconds, 3)}
    return load


def _commit_tables(commit: CycleCommit, writes: Iterator[TableWrite]) -> Iterator[Written]:
    """A task: each table's changes read from its files and committed as the driver would."""
    prepare_worker()
    from applier.targets.delta import DeltaTarget  # the target module imports this one

    root, compacting = Path(commit.root), commit.compact_min_files
    target = DeltaTarget(root, commit.app_id, threads=1, collisions=commit.collisions, compact_min_files=compacting)
    for write in writes:
        name = write.table.name
        started = time.perf_counter()
        try:
            applied, held, found = target.apply_one(commit.cycle_id, read_changes(write), commit.part)
        except Exception as e:  # the driver raises it, as if it had written the table
            yield Written(name, seconds=time.perf_counter() - started, error=sendable(name, e))
        else:
            seconds = time.perf_counter() - started
            yield Written(name, applied, held, found, seconds, target.constraints(name))
