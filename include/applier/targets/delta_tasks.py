"""A cycle's Delta commits made by Spark executor tasks, not by the driver.

A table's MERGE (or a keyless table's rewrite) reads its target files and
grows with the table, not with the cycle: on a cluster, a driver that commits
every table caps the cycle at one machine's CPU, and holds each table's net
changes in memory while it writes them. When the tables whose compiled changes
are all in files (the compile job's chunk files, spill files) weigh
``apply.executor_write_mb`` or more together, they are committed by one Spark
job, shared among its tasks by weight; the driver commits the rest meanwhile
(tables with CHECK constraints, which it checks first, and tables whose
changes net to nothing). A smaller cycle stays on the driver, where a job
would cost more than its writes.

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

import logging
import pickle
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from applier.engine.changes import TableChanges
from applier.engine.compiled import CompiledCycle, to_table_changes
from applier.engine.session import local_master
from applier.engine.spill import read_spill
from applier.engine.worker_path import prepare_worker
from applier.errors import TargetError
from applier.intermediate.schema import TableDef
from applier.targets import CycleLoad, Part
from applier.targets.collisions import Collisions
from applier.targets.per_table import PerTableTarget, apply_tables

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableWrite:
    """One table a task commits: its definition, whether the cycle empties it first, its changes' files."""

    table: TableDef
    truncated: bool
    files: tuple[str, ...]
    nbytes: int


@dataclass(frozen=True)
class CycleCommit:
    """What every task of a cycle's job shares: the target, its collisions and the cycle (or part) committed."""

    root: str
    app_id: str
    collisions: Collisions
    cycle_id: int
    part: Part | None


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


CLUSTER_WRITE_MB = 4.0
"""The default ``apply.executor_write_mb`` on a cluster: a job costs a few tenths of a second, a MERGE of 4 MiB more."""


def executor_threshold(setting_mb: float | None, spark: Any) -> int | None:
    """From how many bytes of compiled changes a cycle's tables are committed on ``spark``'s executors; None: never.

    ``setting_mb`` None takes :data:`CLUSTER_WRITE_MB` on a cluster, and none
    with a local master, whose executors are the driver's own machine: the
    job's Python workers would import delta-rs and read the changes again for
    no CPU the driver lacks (the bench's narrow cycle: 0.9 s of commits on
    the executors, 0.1 s on the driver). Never with ``spark.speculation``
    on, which may run a task twice at once.
    """
    if spark is None or setting_mb == float("inf"):
        return None
    if spark.conf.get("spark.speculation", "false").lower() == "true":
        log.warning("spark.speculation is on: every Delta table is committed by the driver")
        return None
    if setting_mb is None:
        setting_mb = None if local_master(str(spark.sparkContext.master)) else CLUSTER_WRITE_MB
    return None if setting_mb is None else int(setting_mb * 2**20)


def executor_writes(
    changes: Mapping[str, TableChanges], min_bytes: int, constrained: Mapping[str, Mapping[str, str]]
) -> list[TableWrite]:
    """The tables of a compiled cycle its executors commit: those whose changes are all in files, without CHECK
    constraints, when together they weigh ``min_bytes`` or more; else none (a job would cost more than the writes).

    A table with constraints is checked by the driver before any table
    commits, which reads its changes there anyway; a table whose changes net
    to nothing has no file, and the driver only makes sure it exists.
    """
    if not isinstance(changes, CompiledCycle):
        return []
    writes = []
    for name in sorted(changes):
        found = changes.in_files(name)
        if found is None or not found[0] or constrained.get(name):
            continue
        files, nbytes = found
        writes.append(TableWrite(changes.tables[name], name in changes.truncated, tuple(map(str, files)), nbytes))
    return writes if sum(w.nbytes for w in writes) >= min_bytes else []


def task_tables(writes: Sequence[TableWrite], tasks: int) -> list[list[TableWrite]]:
    """``writes`` shared among at most ``tasks`` tasks by weight, largest first, each to the lightest task so far."""
    bins: list[list[TableWrite]] = [[] for _ in range(max(1, min(tasks, len(writes))))]
    loads = [0] * len(bins)
    for write in sorted(writes, key=lambda w: (-w.nbytes, w.table.name)):
        lightest = loads.index(min(loads))
        bins[lightest].append(write)
        loads[lightest] += write.nbytes
    return bins


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
    failed: BaseException | None = None
    with ThreadPoolExecutor(max_workers=1) as side:
        remote = side.submit(write_on_executors, spark, commit, writes)
        try:
            rest = [n for n in sorted(changes) if n not in off]
            load = apply_tables(target, target.threads, commit.cycle_id, changes, commit.part, rest)
        except BaseException as e:  # raised once the executors are done too: no commit is left under way
            failed = e
        try:
            written = sorted(remote.result(), key=lambda w: w.name)
        except Exception as e:
            failed = failed or _job_failed(commit.cycle_id, e)
        if failed is not None:
            raise failed
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


def write_on_executors(spark: Any, commit: CycleCommit, writes: Sequence[TableWrite]) -> list[Written]:
    """Commit ``writes`` in one Spark job, twice as many tasks as the application has cores (fewer for fewer tables).

    Returns:
        What was done with each table, in no order.
    """
    context = spark.sparkContext
    bins = task_tables(writes, 2 * context.defaultParallelism)
    context.setJobDescription(f"cycle {commit.cycle_id}: Delta commits of {len(writes)} tables")
    try:
        job = context.parallelize(bins, len(bins)).mapPartitions(partial(_commit_task, commit))
        done: list[Written] = job.collect()
        return done
    finally:
        context.setJobDescription(None)


def _commit_task(commit: CycleCommit, bins: Iterator[list[TableWrite]]) -> Iterator[Written]:
    """A task: its tables, one after the other."""
    return _commit_tables(commit, (write for tables in bins for write in tables))


def _commit_tables(commit: CycleCommit, writes: Iterator[TableWrite]) -> Iterator[Written]:
    """A task: each table's changes read from its files and committed as the driver would."""
    prepare_worker()
    from applier.targets.delta import DeltaTarget  # the target module imports this one

    target = DeltaTarget(Path(commit.root), commit.app_id, threads=1, collisions=commit.collisions)
    for write in writes:
        name = write.table.name
        started = time.perf_counter()
        try:
            parts = [pa.Table.from_batches([batch]) for path in write.files for batch in read_spill(path)]
            changes = to_table_changes(write.table, write.truncated, parts)
            del parts
            applied, held, found = target.apply_one(commit.cycle_id, changes, commit.part)
        except Exception as e:  # the driver raises it, as if it had written the table
            yield Written(name, seconds=time.perf_counter() - started, error=_sendable(name, e))
        else:
            seconds = time.perf_counter() - started
            yield Written(name, applied, held, found, seconds, target.constraints(name))


def _job_failed(cycle_id: int, error: Exception) -> TargetError:
    """The job itself failed (a task that died with its Python worker or executor, after Spark's own retries).

    Transient: what its tasks committed holds the cycle, and a retry of the
    cycle skips those tables and commits the rest.
    """
    cause = getattr(error, "java_exception", None)  # py4j's own message only names the call that failed
    lines = str(cause.getMessage() if cause is not None else error).strip().splitlines()
    return TargetError(
        f"cycle {cycle_id}: the Delta commits on the executors failed: {lines[0] if lines else type(error).__name__}; "
        "the tables they committed skip the cycle when it is applied again",
        error_class="connection",
        code=type(error).__name__,
    )


def _sendable(name: str, error: Exception) -> BaseException:
    """``error`` itself when it survives pickling, else a :class:`TargetError` naming the table and saying it."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # any failure to pickle: send a plain description
        return TargetError(f"table {name}: {type(error).__name__}: {error}", table=name, code=type(error).__name__)
    return error
