"""The per-transaction baseline on PostgreSQL (runs in a child process, ``--part pertxn``).

The first committed transactions, in commit order, each applied on its own:
its net changes per table (:func:`bench.pg_source.transaction_net`) are COPYed
into a staging table and applied with the PostgreSQL target's own set-wise
statements (``pg_sql.delete_keyed`` and ``upsert_keyed``, or ``delete_copies``
and ``insert_copies`` for a table without a key; a truncate as ``TRUNCATE``),
in one database transaction per source transaction. The report extrapolates
the time linearly to all committed transactions.

The staging tables are created once (temporary, shaped by the target's
``create_staging``) rather than per transaction, emptied by a ``DELETE`` in
each transaction (``ON COMMIT DELETE ROWS`` costs a truncate of every staging
table at every commit, several times more) and vacuumed every thousand
transactions; a statement with nothing to do is not sent. The baseline gets
every advantage a careful per-transaction applier could take.
"""

from __future__ import annotations

import time
from typing import Any

from psycopg import sql

from bench.common import BenchError
from bench.pg_source import Prefix, Typed, copy_data, create_tables, load_prefix, run_prefix, transaction_net

_TEMPLATE_SCHEMA = "bench_staging"
VACUUM_EVERY = 1000  # transactions; the staging tables' emptied pages are reclaimed this often


class PerTransactionApplier:
    """Applies source transactions one by one through staging tables, counting statements and time.

    Args:
        conn: an autocommit psycopg connection to an empty database.
        defs: every table's latest definition (the tables are created here).
    """

    def __init__(self, conn: Any, defs: dict[str, Any]) -> None:
        from applier.targets import pg_sql as q

        self.conn, self.cur = conn, conn.cursor()
        self.typed = {name: Typed(t) for name, t in defs.items()}
        self.stage: dict[str, sql.Identifier] = {}
        create_tables(conn, defs)
        with conn.transaction():
            conn.execute(q.create_schema(_TEMPLATE_SCHEMA))
            for n, (name, table) in enumerate(defs.items()):
                template = sql.Identifier(_TEMPLATE_SCHEMA, f"stage_{n}")
                conn.execute(q.create_staging(template, table))
                conn.execute(
                    sql.SQL("CREATE TEMPORARY TABLE {} (LIKE {})").format(sql.Identifier(f"stage_{n}"), template)
                )
                self.stage[name] = sql.Identifier("pg_temp", f"stage_{n}")
        self.commits = self.statements = self.copies = 0
        self.prepare_s = self.database_s = 0.0

    def apply_transaction(self, changes: list[Any]) -> None:
        """One source transaction: its net changes staged and applied, in one database transaction."""
        from applier.targets.pg_load import staging_rows

        started = time.perf_counter()
        nets = transaction_net(changes, self.typed)
        staged = [(net, rows.num_rows, copy_data(rows)) for net in nets.values() for rows in [staging_rows(net)]]
        prepared = time.perf_counter()
        with self.conn.transaction():
            for net, rows, data in staged:
                self._apply_table(net, rows, data)
        self.commits += 1
        if self.commits % VACUUM_EVERY == 0:
            for stage in self.stage.values():
                self.cur.execute(sql.SQL("VACUUM {}").format(stage))
        self.prepare_s += prepared - started
        self.database_s += time.perf_counter() - prepared

    def _run(self, statement: Any) -> int:
        self.statements += 1
        self.cur.execute(statement, prepare=True)
        return int(self.cur.rowcount)

    def _apply_table(self, net: Any, rows: int, data: bytes) -> None:
        """Truncate, COPY into the staging table, then the target's set-wise statements for this table."""
        from applier.targets import pg_sql as q

        table = net.table
        ident, stage = q.target_table(table, {}), self.stage[table.name]
        if net.truncate:
            self._run(q.truncate(ident))
        if not rows:
            return
        with self.cur.copy(q.copy_into(stage, q.staging_columns(table))) as copy:
            copy.write(data)
        self.copies += 1
        if table.primary_key:
            self._run(q.merge_keyed(ident, stage, table))
        else:
            if net.stats["D"]:
                deleted = self._run(q.delete_copies(ident, stage, table))
                if deleted != net.stats["D"]:
                    raise BenchError(f"{table.name}: {net.stats['D']} rows to delete, {deleted} found")
            if net.stats["I"]:
                self._run(q.insert_copies(ident, stage, table))
        self._run(sql.SQL("DELETE FROM {}").format(stage))


def apply_prefix(url: str, prefix: Prefix) -> dict[str, Any]:
    """Apply every transaction of ``prefix`` on its own to the (empty) database at ``url``; the figures."""
    import psycopg

    with psycopg.connect(url, autocommit=True, application_name="cdc-bench per-transaction") as conn:
        applier = PerTransactionApplier(conn, prefix.defs)
        timed = run_prefix(prefix, applier.apply_transaction)
    return {
        **timed,
        "commits": applier.commits,
        "copies": applier.copies,
        "statements": applier.statements,
        "prepare_s": applier.prepare_s,
        "database_s": applier.database_s,
    }


def part_pertxn(params: dict[str, Any]) -> dict[str, Any]:
    """Apply each of the first ``prefix`` committed transactions on its own, staged and set-wise.

    Args:
        params: ``intermediate_dir``, ``url`` (an empty database) and ``prefix`` (transactions to apply).

    Returns:
        The transactions, changes, commits, COPYs and statements applied, the seconds they took (preparing the
        staging data and in the database apart), and the seconds spent reading them (not timed with the rest).
    """
    from pathlib import Path

    prefix = load_prefix(Path(params["intermediate_dir"]), params["prefix"])
    print(f"loaded {len(prefix.xids)} transactions, {prefix.rows} changes in {prefix.load_s:.1f} s", flush=True)
    return apply_prefix(params["url"], prefix)
