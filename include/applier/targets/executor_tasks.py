"""A cycle's tables written by Spark executor tasks: which tables, shared how, and their errors on the driver.

On a cluster a driver that writes every table caps the cycle at one
machine's CPU, and holds each table's net changes in memory while it writes
them. Tables whose compiled changes are all in files (the compile job's chunk
files, spill files) can be written by any process that reads those files: when
they weigh ``apply.executor_write_mb`` or more together, one Spark job shares
them among its tasks by weight, and the driver writes the rest meanwhile. A
smaller cycle stays on the driver, where a job would cost more than its writes.

What a task writes is the target's own business: Delta commits each table
(:mod:`~applier.targets.delta_tasks`), PostgreSQL loads its staging table and
leaves the cycle's one transaction to the driver
(:mod:`~applier.targets.pg_tasks`). This module holds what both share.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import pyarrow as pa

from applier.engine.changes import TableChanges
from applier.engine.compiled import CompiledCycle, to_table_changes
from applier.engine.session import local_master
from applier.engine.spill import read_spill
from applier.errors import TargetError
from applier.intermediate.schema import TableDef

log = logging.getLogger(__name__)

Result = TypeVar("Result")
Local = TypeVar("Local")


@dataclass(frozen=True)
class TableWrite:
    """One table a task writes: its definition, whether the cycle empties it first, its changes' files."""

    table: TableDef
    truncated: bool
    files: tuple[str, ...]
    nbytes: int


CLUSTER_WRITE_MB = 4.0
"""The default ``apply.executor_write_mb`` on a cluster: a job costs a few tenths of a second, a MERGE of 4 MiB more."""


def executor_threshold(setting_mb: float | None, spark: Any, what: str) -> int | None:
    """From how many bytes of compiled changes a cycle's tables are written on ``spark``'s executors; None: never.

    ``setting_mb`` None takes :data:`CLUSTER_WRITE_MB` on a cluster, and none
    with a local master, whose executors are the driver's own machine: the
    job's Python workers would import the target's library and read the
    changes again for no CPU the driver lacks (the bench's narrow cycle on
    Delta: 0.9 s of commits on the executors, 0.1 s on the driver). Never with
    ``spark.speculation`` on, which may run a task twice at once; ``what``
    names the writes in the warning that says so.
    """
    if spark is None or setting_mb == float("inf"):
        return None
    if spark.conf.get("spark.speculation", "false").lower() == "true":
        log.warning("spark.speculation is on: every %s is done by the driver", what)
        return None
    if setting_mb is None:
        setting_mb = None if local_master(str(spark.sparkContext.master)) else CLUSTER_WRITE_MB
    return None if setting_mb is None else int(setting_mb * 2**20)


def executor_writes(
    changes: Mapping[str, TableChanges], min_bytes: int, kept: Mapping[str, Any] | None = None
) -> list[TableWrite]:
    """The tables of a compiled cycle its executors write: those whose changes are all in files, but for those
    ``kept`` names true, when together they weigh ``min_bytes`` or more; else none (a job would cost more).

    A table whose changes net to nothing has no file: the driver only makes
    sure it exists. ``kept`` holds what the driver must see first (Delta's
    CHECK constraints, which it checks before any table commits).
    """
    if not isinstance(changes, CompiledCycle):
        return []
    kept = kept or {}
    writes = []
    for name in sorted(changes):
        found = changes.in_files(name)
        if found is None or not found[0] or kept.get(name):
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


def read_changes(write: TableWrite) -> TableChanges:
    """A task's table: its net changes read from their files."""
    parts = [pa.Table.from_batches([batch]) for path in write.files for batch in read_spill(path)]
    return to_table_changes(write.table, write.truncated, parts)


def beside_executors(
    spark: Any,
    cycle_id: int,
    doing: str,
    then: str,
    writes: Sequence[TableWrite],
    task: Callable[[Iterator[TableWrite]], Iterator[Result]],
    here: Callable[[], Local],
) -> tuple[Local, list[Result]]:
    """``task`` over ``writes`` in one Spark job (:func:`run_tasks`) while the driver runs ``here``: both answers.

    Raises:
        Once both are done: the driver's failure first; else the job's own (a task lost with its worker
        after Spark's retries) as a transient :class:`TargetError` (:func:`job_failed`: ``doing`` names
        the writes, ``then`` says why trying the cycle again is safe).
    """
    failed: BaseException | None = None
    with ThreadPoolExecutor(max_workers=1) as side:
        remote = side.submit(run_tasks, spark, f"cycle {cycle_id}: {doing} of {len(writes)} tables", writes, task)
        try:
            local = here()
        except BaseException as e:  # raised once the executors are done too: no write is left under way
            failed = e
        try:
            done = remote.result()
        except Exception as e:
            failed = failed or job_failed(cycle_id, f"the {doing}", then, e)
        if failed is not None:
            raise failed
    return local, done


def run_tasks(
    spark: Any, description: str, writes: Sequence[TableWrite], task: Callable[[Iterator[TableWrite]], Iterator[Result]]
) -> list[Result]:
    """``task`` over ``writes`` in one Spark job of twice as many tasks as the application has cores (fewer for
    fewer tables); each task gets its tables one after the other. What the tasks yield, in no order."""
    context = spark.sparkContext
    bins = task_tables(writes, 2 * context.defaultParallelism)
    context.setJobDescription(description)
    try:
        job = context.parallelize(bins, len(bins)).mapPartitions(partial(_each_table, task))
        done: list[Result] = job.collect()
        return done
    finally:
        context.setJobDescription(None)


def _each_table(
    task: Callable[[Iterator[TableWrite]], Iterator[Result]], bins: Iterator[list[TableWrite]]
) -> Iterator[Result]:
    return task(write for tables in bins for write in tables)


def job_failed(cycle_id: int, doing: str, then: str, error: Exception) -> TargetError:
    """The job itself failed (a task that died with its Python worker or executor, after Spark's own retries).

    Transient (class ``connection``): ``then`` says why trying the cycle again is safe.
    """
    cause = getattr(error, "java_exception", None)  # py4j's own message only names the call that failed
    lines = str(cause.getMessage() if cause is not None else error).strip().splitlines()
    return TargetError(
        f"cycle {cycle_id}: {doing} on the executors failed: {lines[0] if lines else type(error).__name__}; {then}",
        error_class="connection",
        code=type(error).__name__,
    )


def sendable(name: str, error: Exception) -> BaseException:
    """``error`` itself when it survives pickling, else a :class:`TargetError` naming the table and saying it."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # any failure to pickle: send a plain description
        return TargetError(f"table {name}: {type(error).__name__}: {error}", table=name, code=type(error).__name__)
    return error
