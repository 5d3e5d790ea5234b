"""The PostgreSQL target: staged bulk loads, at most ``threads`` load connections, one commit per cycle.

A cycle reaches PostgreSQL in two steps:

1. **Load.** Each table's net changes are COPYed into an unlogged staging
   table (``applier_staging.<configuration>_<n>``) on one of ``threads`` load
   connections, in batches of at most ``threads`` tables. Tables waiting for a
   connection wait in the compiled cycle (:mod:`applier.engine.compiled`),
   under the queue-memory budget, spooled to
   ``<configuration>_<table id>.spill`` when it is full. Staging tables are
   committed as they load, but no target table changes yet. On a cluster, a
   large cycle's tables are loaded by Spark's executors (:mod:`~.pg_staging`).
2. **Apply.** One transaction on the first connection creates or evolves the
   tables, applies every staging table set-wise (truncate; delete; insert or
   update; copies of keyless rows) and writes the checkpoint row
   (``applier_checkpoint``). Its commit is the cycle's commit: a crash before
   it leaves no trace in the target tables, after it the checkpoint row says
   the cycle is in, so a re-run skips it (exactly once, with no collision
   handling).

Every identifier is quoted and every value travels as COPY data or a bound
parameter. Messages never carry the connection password.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from applier.engine.changes import TableChanges
from applier.errors import TargetError
from applier.intermediate.schema import TableDef, check_table_name
from applier.targets import CycleLoad, Part, PassedTransaction, collisions, pg_apply, pg_exceptions
from applier.targets import pg_sql as q
from applier.targets.collisions import Collisions
from applier.targets.pg_checkpoint import CheckpointRow, Position, holds
from applier.targets.pg_connections import Connections, Staged, redacted
from applier.targets.pg_drift import FoundColumn, drift
from applier.targets.pg_load import rows_as_arrow
from applier.targets.pg_lock import advisory_run_lock
from applier.targets.pg_staging import Staging


class PostgresTarget:
    """Applies cycles to one PostgreSQL database.

    A cycle, or a part of it, commits all its tables and the checkpoint row in
    one transaction (``atomic_cycles``), so a refused part leaves nothing.

    Args:
        url: a libpq connection string or URI (the password, if any, is never shown).
        configuration_name: names the checkpoint row, staging tables and spill files.
        schema_map: source schema -> target schema (unmapped schemas keep their name).
        threads: load connections allowed (at least 1).
        show_row_values: errors keep the database's detail with the failing row's
            values (otherwise only the key and the columns are named).
        lock_timeout_s: how long a statement waits for a lock before it fails
            with a transient error naming the holder (0: for ever).
        statement_timeout_s: how long one statement may run (0: no limit).
        collisions: what a collision does (:mod:`~applier.targets.collisions`; default: counted, applied).
        executor_write_mb: a cycle whose tables' compiled changes weigh this
            many MiB has them loaded into staging by Spark's executors once a
            session is given (:meth:`use_spark`, :mod:`~applier.targets.pg_tasks`).
    """

    def __init__(
        self,
        url: str,
        configuration_name: str,
        *,
        schema_map: Mapping[str, str] | None = None,
        threads: int = 1,
        show_row_values: bool = False,
        lock_timeout_s: float = 60.0,
        statement_timeout_s: float = 0.0,
        collisions: Collisions | None = None,
        executor_write_mb: float | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self._url = url
        self._name = configuration_name
        self._schema_map = dict(schema_map or {})
        connect: dict[str, Any] = {
            "url": url,
            "name": configuration_name,
            "schema_map": self._schema_map,
            "show_row_values": show_row_values,
            "lock_timeout_s": lock_timeout_s,
            "statement_timeout_s": statement_timeout_s,
        }
        self._db = Connections(**connect)
        self._staging = Staging(self._db, connect, threads, executor_write_mb)
        self._row = CheckpointRow(configuration_name)
        self._collisions = collisions or Collisions()
        self.atomic_cycles = True
        self.log_order = True

    def close(self) -> None:
        """Close every connection (a broken one too)."""
        self._db.close()
        self._row.forget_table()  # a rolled-back transaction may have created it

    def run_lock(self) -> AbstractContextManager[None]:
        """The configuration's advisory run lock, on a connection of its own for the whole run (see ``pg_lock``)."""
        return advisory_run_lock(self._url, self._name, redacted(self._url))

    # ------------------------------------------------------------------ reading

    def committed_cycle(self, table: str | None = None) -> int:
        """The last cycle committed whole; the same for every table (a cycle commits all its tables at once)."""
        return self._position()[0]

    def applied_through(self, cycle_id: int) -> int:
        """How many transactions of cycle ``cycle_id`` are in, when it is the one after the last whole cycle; else 0."""
        cycle, through = self._position()
        return through if cycle == cycle_id - 1 else 0

    def _position(self) -> Position:
        conn = self._db.get(0)
        with self._db.errors("read the checkpoint", None), conn.transaction():
            return self._row.position(conn)

    def highest_cycle(self, tables: Iterable[str]) -> int:
        """The cycle the checkpoint row holds: every table holds it or an earlier one."""
        return self.committed_cycle()

    def check_tables(self, tables: Mapping[str, TableDef]) -> None:
        """Refuse a drifted table (:mod:`~applier.targets.pg_drift`), reading every table's columns in one query."""
        if not tables:
            return
        conn = self._db.get(0)
        with self._db.errors("read the target tables' columns", None), conn.transaction():
            found: dict[tuple[str, str], list[FoundColumn]] = {}
            schemas = sorted({q.target_name(name, self._schema_map)[0] for name in tables})
            for schema, name, *column in conn.execute(q.ALL_COLUMNS_QUERY, [schemas]):
                found.setdefault((schema, name), []).append(FoundColumn(*column))
        for table in sorted(tables.values(), key=lambda t: t.name):
            columns = found.get(q.target_name(table.name, self._schema_map))
            problem = drift(table, columns, before_evolution=True) if columns else None
            if problem:
                raise pg_apply.drift_error(table, problem, self._schema_map)

    def saved_checkpoint(self) -> dict[str, Any] | None:
        """The copy of the Applier's checkpoint in the configuration's checkpoint row, if any."""
        conn = self._db.get(0)
        with self._db.errors("read the checkpoint", None), conn.transaction():
            return self._row.state(conn)

    def save_checkpoint(self, state: Mapping[str, Any]) -> None:
        """Keep ``state`` (the checkpoint just written) in the configuration's checkpoint row."""
        conn = self._db.get(0)
        with self._db.errors("keep a copy of the checkpoint", None), conn.transaction():
            self._row.save_state(conn, state)

    def autocorrect(self, tables: frozenset[str]) -> None:
        self._collisions = dataclasses.replace(self._collisions, autocorrect=tables)

    def use_spark(self, spark: Any) -> None:
        """Load large cycles' staging tables on ``spark``'s executors from now on (:mod:`~.pg_tasks`)."""
        self._staging.use_spark(spark)

    def committed_cycles(self, tables: Iterable[str]) -> dict[str, int]:
        """The last cycle committed, for every table at once: one read of the checkpoint row."""
        cycle = self.committed_cycle()
        return dict.fromkeys(tables, cycle)

    def read_arrow(self, table: str) -> pa.Table | None:
        """The table's rows typed as the spec types map to Arrow (status, validation, tests); None when missing."""
        source_schema, name = table.split(".", 1)
        schema = self._schema_map.get(source_schema, source_schema)
        conn = self._db.get(0)
        with self._db.errors("read", table), conn.transaction():
            cur = conn.execute(
                "SELECT column_name, data_type, numeric_precision, numeric_scale FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                [schema, name],
            )
            columns = cur.fetchall()
            if not columns:
                return None
            rows = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, name))).fetchall()
        return rows_as_arrow(columns, rows)

    def exceptions(self, ident: int | None = None) -> list[dict[str, Any]]:
        """The transactions error actions set aside (one, by id), each with its changes (``changes_list``)."""
        conn = self._db.get(0)
        with self._db.errors("read the exceptions store", None), conn.transaction():
            found = pg_exceptions.records(conn, self._name, ident)
            for record in found if ident is not None else ():
                record["changes_list"] = pg_exceptions.changes(conn, record["id"])
        return found

    def resubmit(self, ident: int, changes: Mapping[str, TableChanges]) -> bool:
        """Apply exception ``ident``'s net ``changes`` and mark it resubmitted, in one transaction.

        Returns:
            False when it was resubmitted already (by another command meanwhile): nothing is applied.

        Raises:
            TargetError: the target refused it again (naming the table and the key), or it is not in the store.
        """
        load = CycleLoad()
        try:
            staged = self._staging.load(changes, load)
            conn = self._db.get(0)
            with self._db.errors("resubmit the exception", None), conn.transaction():
                done = pg_exceptions.claim(conn, self._name, ident)
                if done is False:
                    raise TargetError(f"exception {ident} is not in the exceptions store of {self._name}")
                if done is not None:
                    return False
                for s in staged:
                    with self._db.errors("apply", s.table.name, s):
                        self._collisions.settle(s.table.name, self._apply_table(conn, s))
                pg_exceptions.mark_resubmitted(conn, ident)
        except TargetError:
            self.close()
            raise
        self._staging.drop()
        return True

    def delete_exceptions(self, ident: int | None = None, before: str | None = None) -> int:
        """Delete exception ``ident``, or those logged before ``before`` (an ISO moment); returns how many."""
        conn = self._db.get(0)
        with self._db.errors("delete from the exceptions store", None), conn.transaction():
            return pg_exceptions.delete(conn, self._name, ident, before)

    def table_misfit(self, table: TableDef, known: Collection[str]) -> str | None:
        """Why ``table`` cannot land in this database as named (:func:`applier.targets.pg_sql.table_misfit`)."""
        return q.table_misfit(table, known, self._schema_map)

    # ------------------------------------------------------------------ writing

    def apply_cycle(
        self,
        cycle_id: int,
        changes: Mapping[str, TableChanges],
        position: Mapping[str, int],
        part: Part | None = None,
    ) -> CycleLoad:
        """Load every table's changes and commit them with the checkpoint row, in one transaction.

        Args:
            cycle_id: the cycle; skipped when the checkpoint row already holds it.
            changes: each table's net changes.
            position: ``applied_seq``, ``applied_commit_lsn`` and ``restart_seq``
                after the cycle (0 when absent), written to ``applier_checkpoint``.
            part: the cycle's transactions ``changes`` hold, when not all: the
                row then records the part (``part_through``), and the cycle
                when the part is its last; skipped when the row holds its end.

        Returns:
            The load batches, spill files and seconds.

        Raises:
            TargetError: the cycle was rolled back whole (naming the table, the
                key when known, and the database error).
        """
        load = CycleLoad()
        for name in changes:
            check_table_name(name)
        if holds(self._position(), cycle_id, part):
            load.skipped_tables = sorted(changes)
            return load
        try:
            started = time.perf_counter()
            staged = self._staging.load(changes, load, cycle_id)
            loaded = time.perf_counter()
            if not self._commit(cycle_id, staged, position, load, part):
                load.skipped_tables = sorted(changes)
            load.seconds = {"load": round(loaded - started, 3), "commit": round(time.perf_counter() - loaded, 3)}
        except TargetError:
            self.close()  # a broken transaction or connection: start afresh next time
            raise
        self._staging.drop()
        return load

    def _commit(
        self, cycle_id: int, staged: list[Staged], position: Mapping[str, int], load: CycleLoad, part: Part | None
    ) -> bool:
        """The cycle's (or part's) one transaction; False when another run committed it meanwhile."""
        conn = self._db.get(0)
        with self._db.errors("commit the cycle", None), conn.transaction():
            if holds(self._row.position(conn, lock=True), cycle_id, part):
                return False
            for s in staged:
                with self._db.errors("apply", s.table.name, s):
                    found = self._apply_table(conn, s)
                collisions.add(load.collisions, s.table.name, self._collisions.settle(s.table.name, found))
            self._row.record(conn, cycle_id, position, part)
        return True

    def apply_log_order(
        self,
        cycle_id: int,
        part: Part,
        position: Mapping[str, int],
        rows: pa.Table,
        tables: Mapping[str, TableDef],
    ) -> CycleLoad:
        """Apply one transaction's changes statement by statement, in source order, with the checkpoint row, at once.

        Args:
            rows: its changes (``lsn, table, op, before, after``).
            tables: the definitions of (at least) the tables they change.

        Returns:
            ``collisions`` met and ``statements`` per table and op.
        """
        load = CycleLoad()
        names = sorted(set(rows.column("table").to_pylist()))
        for name in names:
            check_table_name(name)
        if holds(self._position(), cycle_id, part):
            load.skipped_tables = names
            return load
        conn = self._db.get(0)
        started = time.perf_counter()
        try:
            with self._db.errors("apply in log order", None), conn.transaction():
                if holds(self._row.position(conn, lock=True), cycle_id, part):
                    load.skipped_tables = names
                    return load
                idents = {}
                for name in names:
                    with self._db.errors("prepare", name):
                        idents[name] = self._prepare_table(conn, tables[name])
                statements = pg_apply.LogOrder(conn, idents, tables, self._db.errors)
                statements.apply(rows)
                for name, found in statements.found.items():
                    collisions.add(load.collisions, name, self._collisions.settle(name, found))
                self._row.record(conn, cycle_id, position, part)
        except TargetError:
            self.close()
            raise
        load.statements = statements.statements
        load.seconds = {"commit": round(time.perf_counter() - started, 3)}
        return load

    def pass_transaction(
        self, cycle_id: int, part: Part, position: Mapping[str, int], passed: PassedTransaction
    ) -> None:
        """Move the checkpoint row past ``part``, keeping a logged transaction in ``applier_exceptions``, at once."""
        conn = self._db.get(0)
        try:
            with self._db.errors("set a refused transaction aside", None), conn.transaction():
                if holds(self._row.position(conn, lock=True), cycle_id, part):
                    return
                if passed.logged:
                    pg_exceptions.store(conn, self._name, passed)
                self._row.record(conn, cycle_id, position, part)
        except TargetError:
            self.close()
            raise

    def _apply_table(self, conn: psycopg.Connection[Any], s: Staged) -> pg_apply.Found:
        """Apply one staging table set-wise (:mod:`~applier.targets.pg_apply`); the collisions it met."""
        ident = self._prepare_table(conn, s.table)
        if s.truncate:
            conn.execute(q.truncate(ident))
        if not s.rows:
            return {}
        if s.table.primary_key:
            return pg_apply.apply_keyed(conn, ident, s.stage, s.table)
        return pg_apply.apply_counted(conn, ident, s.stage, s.table)

    def _prepare_table(self, conn: psycopg.Connection[Any], table: TableDef) -> sql.Identifier:
        return pg_apply.prepare_table(conn, table, self._schema_map)
