"""A cycle's PostgreSQL staging tables loaded by Spark executor tasks, not by the driver.

The driver's part of a PostgreSQL cycle is two steps (:mod:`~applier.targets.postgres`):
COPY each table's net changes into a staging table, then one transaction that
applies them all with the checkpoint row. The COPY reads and encodes every
compiled row, so on a cluster it made the driver the cycle's largest CPU user
after the executors (18.6% of a cycle's CPU on the bench's narrow workload,
against 9.5% for Delta). When the tables whose compiled changes are
in files weigh enough (:mod:`~applier.targets.executor_tasks`), one Spark job
loads their staging tables, each task on a connection of its own, while the
driver loads the rest; the driver's one transaction then applies every
staging table as before. The cycle stays atomic with its checkpoint row: a
staging table changes no target table, and a failed or lost task leaves only
staging tables, dropped when the cycle is loaded again.

A task loads a table exactly as the driver would (:func:`load_stage`), and
replaces a staging table a lost attempt left. Its errors (the table, the key
when known, the class) come back to the driver, which raises them as its own.
The executors must reach the database at the target's URL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from psycopg import sql

from applier.engine.worker_path import prepare_worker
from applier.errors import TargetError
from applier.targets import pg_sql as q
from applier.targets.executor_tasks import TableWrite, beside_executors, read_changes, sendable
from applier.targets.pg_connections import Connections, Staged
from applier.targets.pg_load import binary_copy, staging_rows


def load_stage(db: Connections, connection: int, staged: Staged) -> None:
    """COPY ``staged``'s rows into its staging table, made anew, on load connection ``connection``, and commit."""
    conn = db.get(connection)
    with db.errors("load into staging", staged.table.name, staged), conn.transaction():
        conn.execute(q.drop_table(staged.stage))  # one a lost attempt left (the driver drops the cycle's first)
        conn.execute(q.create_staging(staged.stage, staged.table))
        with conn.cursor().copy(q.copy_into(staged.stage, q.staging_columns(staged.table))) as copy:
            for data in binary_copy(staged.source):
                copy.write(data)


@dataclass(frozen=True)
class StagingJob:
    """What every task of a cycle's job shares: how to connect (``Connections``' arguments), and where each
    table stages (``stages``: table -> staging table name, in :data:`~applier.targets.pg_sql.STAGING_SCHEMA`)."""

    cycle_id: int
    connect: Mapping[str, Any]
    stages: Mapping[str, str]

    def stage(self, table: str) -> sql.Identifier:
        """Where ``table`` stages."""
        return sql.Identifier(q.STAGING_SCHEMA, self.stages[table])


@dataclass(frozen=True)
class Loaded:
    """What a task did with one table: the rows it staged and its seconds, or the error it met."""

    name: str
    rows: int = 0
    seconds: float = 0.0
    error: BaseException | None = None


def load_beside_executors(
    spark: Any, job: StagingJob, writes: Sequence[TableWrite], load_here: Callable[[list[str]], list[Staged]]
) -> tuple[list[Staged], dict[str, float]]:
    """Load ``writes`` on the executors while the driver loads the other tables (``load_here``).

    Returns:
        Every table of ``job.stages`` staged, in table-name order, and the
        seconds each executor table took.

    Raises:
        TargetError: once both are done: the driver's failure first, then the executors' first by table
            name; the job's own failure (a task lost with its worker after Spark's retries) as a transient
            one, class ``connection``. Nothing of the cycle is applied then.
    """
    off = {w.table.name for w in writes}
    here, done = beside_executors(
        spark,
        job.cycle_id,
        "PostgreSQL staging loads",
        "nothing of the cycle was applied, and it is loaded again when it is applied again",
        writes,
        partial(_load_tables, job),
        partial(load_here, [name for name in sorted(job.stages) if name not in off]),
    )
    loaded = sorted(done, key=lambda one: one.name)
    errors = [one.error for one in loaded if one.error is not None]
    if errors:
        raise errors[0]
    tables = {w.table.name: w for w in writes}
    remote_staged = [
        Staged(tables[one.name].table, job.stage(one.name), None, one.rows, tables[one.name].truncated)
        for one in loaded
    ]
    staged = sorted([*here, *remote_staged], key=lambda s: s.table.name)
    return staged, {one.name: round(one.seconds, 3) for one in loaded}


def _load_tables(job: StagingJob, writes: Iterator[TableWrite]) -> Iterator[Loaded]:
    """A task: each table's changes read from its files and loaded as the driver would, on one connection."""
    prepare_worker()
    db = Connections(**job.connect)
    try:
        try:
            db.get(0)
        except TargetError as e:  # the executors' own way to the database: say so, and how to do without it
            cut = TargetError(
                f"{e}, from a Spark executor: the executors must reach target.url to load staging tables "
                "(apply.executor_write_mb: off keeps the loads on the driver)",
                transient=e.transient,
                error_class=e.error_class,
                code=e.code,
            )
            yield from (Loaded(write.table.name, error=cut) for write in writes)
            return
        for write in writes:
            name = write.table.name
            started = time.perf_counter()
            try:
                rows = staging_rows(read_changes(write))
                load_stage(db, 0, Staged(write.table, job.stage(name), rows, rows.num_rows, write.truncated))
            except Exception as e:  # the driver raises it, as if it had loaded the table
                db.close()  # a broken transaction: the next table connects afresh
                yield Loaded(name, seconds=time.perf_counter() - started, error=sendable(name, e))
            else:
                yield Loaded(name, rows.num_rows, time.perf_counter() - started)
    finally:
        db.close()
