"""The PostgreSQL exceptions store: source transactions an error action set aside, with every change.

Two tables beside the checkpoint row, written in the same transaction as the
checkpoint row that passes the transaction (so a crash leaves both or
neither):

- ``applier_exceptions``: one row per transaction: configuration, cycle, xid,
  commit lsn, pair, the refusing table, the error's class, SQLSTATE and
  message, when it was logged and, once an operator resubmitted it, when;
- ``applier_exception_changes``: its changes in lsn order, each image kept as
  the pair held it (text, so numbers and key order stay as written).

No connection string or credential is ever written here.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from applier.targets import PassedTransaction

EXCEPTIONS_TABLE = "applier_exceptions"
CHANGES_TABLE = "applier_exception_changes"
RECORD_COLUMNS = (
    "id",
    "configuration_name",
    "cycle_id",
    "xid",
    "commit_lsn",
    "pair_seq",
    "table_name",
    "error_class",
    "sqlstate",
    "message",
    "action",
    "logged_at",
    "resubmitted_at",
)
CHANGE_COLUMNS = ("lsn", "table_name", "op", "before", "after")


def create_tables(conn: psycopg.Connection[Any]) -> None:
    """Create both tables when missing."""
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, configuration_name text NOT NULL, "
            "cycle_id bigint NOT NULL, xid text NOT NULL, commit_lsn bigint NOT NULL, pair_seq bigint NOT NULL, "
            "table_name text, error_class text NOT NULL, sqlstate text, message text NOT NULL, action text NOT NULL, "
            "logged_at timestamptz NOT NULL DEFAULT now(), resubmitted_at timestamptz, "
            "UNIQUE (configuration_name, xid, commit_lsn))"
        ).format(sql.Identifier(EXCEPTIONS_TABLE))
    )
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (exception_id bigint NOT NULL REFERENCES {} ON DELETE CASCADE, "
            "lsn bigint NOT NULL, table_name text NOT NULL, op text NOT NULL, before text, after text, "
            "PRIMARY KEY (exception_id, lsn))"
        ).format(sql.Identifier(CHANGES_TABLE), sql.Identifier(EXCEPTIONS_TABLE))
    )


def store(conn: psycopg.Connection[Any], configuration: str, passed: PassedTransaction) -> int:
    """Write ``passed`` and its changes; returns its id."""
    create_tables(conn)
    row = conn.execute(
        sql.SQL(
            "INSERT INTO {} (configuration_name, cycle_id, xid, commit_lsn, pair_seq, table_name, error_class, "
            "sqlstate, message, action) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id"
        ).format(sql.Identifier(EXCEPTIONS_TABLE)),
        [
            *(configuration, passed.cycle_id, passed.xid, passed.commit_lsn, passed.pair_seq, passed.table),
            *(passed.error_class, passed.code, passed.message, passed.action),
        ],
    ).fetchone()
    assert row is not None
    ident = int(row[0])
    if passed.changes is not None and passed.changes.num_rows:
        columns = passed.changes.select(["lsn", "table", "op", "before", "after"]).to_pylist()
        with conn.cursor().copy(
            sql.SQL("COPY {} (exception_id, lsn, table_name, op, before, after) FROM STDIN").format(
                sql.Identifier(CHANGES_TABLE)
            )
        ) as copy:
            for change in columns:
                copy.write_row([ident, change["lsn"], change["table"], change["op"], change["before"], change["after"]])
    return ident


def records(conn: psycopg.Connection[Any], configuration: str, ident: int | None = None) -> list[dict[str, Any]]:
    """The configuration's exceptions (one, by id), oldest first, each with its count of changes."""
    exists = conn.execute("SELECT to_regclass(%s)", [EXCEPTIONS_TABLE]).fetchone()
    if exists is None or exists[0] is None:
        return []
    query = sql.SQL(
        "SELECT {}, (SELECT count(*) FROM {} c WHERE c.exception_id = e.id) AS changes FROM {} e "
        "WHERE configuration_name = %s AND (%s::bigint IS NULL OR id = %s) ORDER BY id"
    ).format(
        sql.SQL(", ").join(sql.Identifier("e", c) for c in RECORD_COLUMNS),
        sql.Identifier(CHANGES_TABLE),
        sql.Identifier(EXCEPTIONS_TABLE),
    )
    names = (*RECORD_COLUMNS, "changes")
    return [dict(zip(names, row, strict=True)) for row in conn.execute(query, [configuration, ident, ident])]


def changes(conn: psycopg.Connection[Any], ident: int) -> list[dict[str, Any]]:
    """The changes of exception ``ident``, in lsn order."""
    query = sql.SQL("SELECT {} FROM {} WHERE exception_id = %s ORDER BY lsn").format(
        sql.SQL(", ").join(map(sql.Identifier, CHANGE_COLUMNS)), sql.Identifier(CHANGES_TABLE)
    )
    return [dict(zip(CHANGE_COLUMNS, row, strict=True)) for row in conn.execute(query, [ident])]


def delete(conn: psycopg.Connection[Any], configuration: str, ident: int | None, before: str | None) -> int:
    """Delete exception ``ident``, or those logged before the moment ``before``; returns how many."""
    exists = conn.execute("SELECT to_regclass(%s)", [EXCEPTIONS_TABLE]).fetchone()
    if exists is None or exists[0] is None:
        return 0
    query = sql.SQL("DELETE FROM {} WHERE configuration_name = %s AND (id = %s OR logged_at < %s::timestamptz)").format(
        sql.Identifier(EXCEPTIONS_TABLE)
    )
    return conn.execute(query, [configuration, ident, before]).rowcount


def claim(conn: psycopg.Connection[Any], configuration: str, ident: int) -> Any:
    """Lock exception ``ident`` for a resubmission; its ``resubmitted_at`` (None: not yet), or False when missing."""
    row = conn.execute(
        sql.SQL("SELECT resubmitted_at FROM {} WHERE configuration_name = %s AND id = %s FOR UPDATE").format(
            sql.Identifier(EXCEPTIONS_TABLE)
        ),
        [configuration, ident],
    ).fetchone()
    return False if row is None else row[0]


def mark_resubmitted(conn: psycopg.Connection[Any], ident: int) -> None:
    conn.execute(
        sql.SQL("UPDATE {} SET resubmitted_at = now() WHERE id = %s").format(sql.Identifier(EXCEPTIONS_TABLE)), [ident]
    )
