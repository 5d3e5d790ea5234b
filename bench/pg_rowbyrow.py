"""The log-order row-by-row baseline on PostgreSQL (runs in a child process, ``--part pg-rowbyrow``).

The first committed transactions, in commit order, each change in log order as
one parameterised statement, with one commit per source transaction: an insert
as ``INSERT … VALUES``, an update as ``UPDATE … SET`` every column ``WHERE`` the
before-image's key, a delete as ``DELETE … WHERE`` the key, a truncate as
``TRUNCATE``. A table without a key has no identity: a delete (and the old row
of an update) removes exactly one row holding the before-image's values, found
by ``ctid``. Every statement is prepared on the server (psycopg
``prepare=True``), and every update and delete must touch exactly one row.
The report extrapolates the time linearly to all committed transactions.
"""

from __future__ import annotations

import time
from typing import Any

from psycopg import sql

from bench.measure import BenchError
from bench.source import Prefix, Typed, create_tables, load_prefix, run_prefix

# The SQL of one change (pure; every identifier quoted, every value a parameter).


def _placeholders(n: int) -> sql.Composed:
    return sql.SQL(", ").join([sql.Placeholder()] * n)


def _names(names: Any) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def _where(table: Any, names: Any) -> sql.Composed:
    """``a = %s AND b IS NOT DISTINCT FROM %s ...``: null-safe for nullable columns."""
    return sql.SQL(" AND ").join(
        sql.SQL("{} {} %s").format(
            sql.Identifier(n), sql.SQL("IS NOT DISTINCT FROM" if table.column(n).nullable else "=")
        )
        for n in names
    )


def insert_row(ident: sql.Identifier, table: Any) -> sql.Composed:
    """Insert one row; parameters: every column, in the table's order."""
    names = table.column_names
    return sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(ident, _names(names), _placeholders(len(names)))


def update_row(ident: sql.Identifier, table: Any) -> sql.Composed:
    """Update the row holding a key; parameters: every column's new value, then the old key."""
    sets = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(n)) for n in table.column_names)
    return sql.SQL("UPDATE {} SET {} WHERE {}").format(ident, sets, _where(table, table.primary_key))


def delete_row(ident: sql.Identifier, table: Any) -> sql.Composed:
    """Delete the row holding a key; parameters: the key."""
    return sql.SQL("DELETE FROM {} WHERE {}").format(ident, _where(table, table.primary_key))


def delete_one_copy(ident: sql.Identifier, table: Any) -> sql.Composed:
    """Delete exactly one row holding these values (a table without a key); parameters: every column."""
    return sql.SQL("DELETE FROM {0} WHERE ctid = (SELECT ctid FROM {0} WHERE {1} LIMIT 1)").format(
        ident, _where(table, table.column_names)
    )


class _TableStatements:
    """One table's statements and how to turn its images into their parameters."""

    def __init__(self, typed: Typed) -> None:
        from applier.targets import pg_sql as q

        self.typed, table = typed, typed.table
        self.name, self.key, self.columns = table.name, list(table.primary_key), list(table.column_names)
        ident = q.target_table(table, {})
        self.insert, self.truncate = insert_row(ident, table), q.truncate(ident)
        self.update = update_row(ident, table) if self.key else None
        self.delete = delete_row(ident, table) if self.key else delete_one_copy(ident, table)

    def values(self, image: dict[str, Any], names: list[str]) -> list[Any]:
        row = self.typed.rows([image])[0]
        return [row[n] for n in names]


class RowByRowApplier:
    """Applies source transactions change by change, counting statements and time.

    Args:
        conn: an autocommit psycopg connection to an empty database.
        defs: every table's latest definition (the tables are created here).
    """

    def __init__(self, conn: Any, defs: dict[str, Any]) -> None:
        self.conn, self.cur = conn, conn.cursor()
        self.tables = {name: _TableStatements(Typed(t)) for name, t in defs.items()}
        create_tables(conn, defs)
        self.commits = self.statements = 0
        self.prepare_s = self.database_s = 0.0

    def apply_transaction(self, changes: list[Any]) -> None:
        """One source transaction, change by change in log order, then one commit."""
        with self.conn.transaction():
            for table, op, before, after in changes:
                self._change(self.tables[table], op, before, after)
            committing = time.perf_counter()  # the block's end is the COMMIT
        self.database_s += time.perf_counter() - committing
        self.commits += 1

    def _execute(self, statement: sql.Composed, params: list[Any] | None) -> int:
        """Run one statement (prepared on the server); the rows it touched."""
        ran = time.perf_counter()
        self.cur.execute(statement, params, prepare=True)
        self.database_s += time.perf_counter() - ran
        self.statements += 1
        return int(self.cur.rowcount)

    def _change(self, t: _TableStatements, op: str, before: Any, after: Any) -> None:
        """One change as one statement (two for an update of a table without a key)."""
        prepared = time.perf_counter()
        if op == "T":
            statement, params, must_touch = t.truncate, None, False
        elif op == "I":
            statement, params, must_touch = t.insert, t.values(after, t.columns), False
        elif t.update is not None:  # a keyed table
            old = t.values(before, t.key)
            statement, params = (t.update, [*t.values(after, t.columns), *old]) if op == "U" else (t.delete, old)
            must_touch = True
        else:  # no key: one row holding the old values goes (and an update's new row comes after)
            statement, params, must_touch = t.delete, t.values(before, t.columns), True
        again = t.values(after, t.columns) if op == "U" and t.update is None else None
        self.prepare_s += time.perf_counter() - prepared
        touched = self._execute(statement, params)
        if must_touch and touched != 1:
            shown = dict(zip(t.key or t.columns, params or [], strict=False))
            raise BenchError(f"{t.name}: {op} of {shown} touched {touched} rows, not 1")
        if again is not None:
            self._execute(t.insert, again)


def apply_prefix(url: str, prefix: Prefix) -> dict[str, Any]:
    """Apply every change of ``prefix`` as its own statement to the (empty) database at ``url``; the figures."""
    import psycopg

    with psycopg.connect(url, autocommit=True, application_name="cdc-bench row-by-row") as conn:
        applier = RowByRowApplier(conn, prefix.defs)
        timed = run_prefix(prefix, applier.apply_transaction)
    return {
        **timed,
        "commits": applier.commits,
        "statements": applier.statements,
        "prepare_s": applier.prepare_s,
        "database_s": applier.database_s,
    }


def part_rowbyrow(params: dict[str, Any]) -> dict[str, Any]:
    """Apply each change of the first ``prefix`` committed transactions as one statement, in log order, at ``url``."""
    from pathlib import Path

    return apply_prefix(params["url"], load_prefix(Path(params["intermediate_dir"]), params["prefix"]))
