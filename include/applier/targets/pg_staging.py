"""The PostgreSQL target's staging step: a cycle's net changes COPYed into unlogged staging tables.

Each table of a cycle stages in ``applier_staging.<configuration>_<n>``
(``n``: its place among the cycle's tables by name), committed as it loads:
no target table changes until the cycle's one transaction applies them
(:mod:`~applier.targets.postgres`). The driver loads ``threads`` tables at
once on its load connections, taking each table's changes from the compiled
cycle only when its batch loads (flow control under the queue-memory budget).
Once :meth:`Staging.use_spark` allows it, a large cycle's tables whose changes
are in files are loaded by Spark's executors meanwhile (:mod:`~.pg_tasks`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from psycopg import sql

from applier.engine.changes import TableChanges
from applier.engine.compiled import admit, release
from applier.errors import TargetError
from applier.targets import CycleLoad, pg_tasks
from applier.targets import pg_sql as q
from applier.targets.executor_tasks import executor_threshold, executor_writes
from applier.targets.pg_connections import Connections, Staged
from applier.targets.pg_load import staging_rows


class Staging:
    """One configuration's staging tables.

    Args:
        db: the target's connections (the first one drops and prepares; ``threads`` load).
        connect: the arguments ``db`` was made with, for the executors' own connections.
        threads: load connections of the driver.
        executor_write_mb: ``apply.executor_write_mb`` (:func:`~.executor_tasks.executor_threshold`).
    """

    def __init__(
        self, db: Connections, connect: Mapping[str, Any], threads: int, executor_write_mb: float | None
    ) -> None:
        self._db, self._connect, self._threads = db, dict(connect), threads
        self._name = str(connect["name"])
        self._executor_mb = executor_write_mb
        self._executor_bytes: int | None = None
        self._spark: Any = None

    def use_spark(self, spark: Any) -> None:
        """Load large cycles on ``spark``'s executors from now on, as ``apply.executor_write_mb`` says."""
        self._spark = spark
        self._executor_bytes = executor_threshold(self._executor_mb, spark, "PostgreSQL staging load")

    def load(self, changes: Mapping[str, TableChanges], load: CycleLoad, cycle_id: int = 0) -> list[Staged]:
        """COPY every table of ``changes`` into its staging table (those a crash left dropped first).

        Returns:
            The tables staged, in name order; ``load`` records the driver's
            batches and the executors' seconds per table (``load_on_executor``).
        """
        conn = self._db.get(0)
        self.drop()
        with self._db.errors("prepare staging", None), conn.transaction():
            conn.execute(q.create_schema(q.STAGING_SCHEMA))
        names = {name: self._stage_name(n) for n, name in enumerate(sorted(changes))}
        here = partial(self._load_here, names=names, changes=changes, load=load)
        writes = []
        if self._spark is not None and self._executor_bytes is not None:
            writes = executor_writes(changes, self._executor_bytes)
        if not writes:
            return here(list(names))
        job = pg_tasks.StagingJob(cycle_id, self._connect, names)
        staged, seconds = pg_tasks.load_beside_executors(self._spark, job, writes, here)
        for name, took in seconds.items():
            load.table_seconds[name] = {"load_on_executor": took}
        return staged

    def _load_here(
        self, tables: list[str], names: Mapping[str, str], changes: Mapping[str, TableChanges], load: CycleLoad
    ) -> list[Staged]:
        """Load ``tables`` on the driver's connections, ``threads`` tables at once."""
        staged: list[Staged] = []
        for start in range(0, len(tables), self._threads):
            batch = tables[start : start + self._threads]
            load.batches.append(batch)
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                jobs = [pool.submit(self._stage, i, names[name], name, changes) for i, name in enumerate(batch)]
                staged.extend(job.result() for job in jobs)
        return staged

    def _stage(self, connection: int, stage: str, name: str, changes: Mapping[str, TableChanges]) -> Staged:
        """Load one table's changes into staging table ``stage`` on load connection ``connection``."""
        try:
            admit(changes, name)  # flow control: the tables being staged stay within the queue's budget
            table = changes[name]
            rows = staging_rows(table)
            staged = Staged(table.table, sql.Identifier(q.STAGING_SCHEMA, stage), rows, rows.num_rows, table.truncate)
            pg_tasks.load_stage(self._db, connection, staged)
        finally:
            release(changes, name)
        staged.source = None
        return staged

    def _stage_name(self, n: int) -> str:
        name = f"{self._name}_{n}"
        if len(name.encode()) > q.MAX_IDENTIFIER:
            raise TargetError(f"configuration name {self._name!r} is too long for PostgreSQL staging table names")
        return name

    def drop(self) -> None:
        """Drop this configuration's staging tables (after a commit, or left by a crash)."""
        conn = self._db.get(0)
        mine = re.compile(re.escape(self._name) + r"_\d+")
        with self._db.errors("drop staging tables", None), conn.transaction():
            cur = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", [q.STAGING_SCHEMA])
            for (name,) in cur.fetchall():
                if mine.fullmatch(name):
                    conn.execute(q.drop_table(sql.Identifier(q.STAGING_SCHEMA, name)))
