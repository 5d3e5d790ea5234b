"""PostgreSQL's errors as the Applier reports them: which are transient, which key failed, no row values.

A target error names the table, the key when it can be found and the
database's message, never the password and never the row's other values
(unless ``target.show_row_values``). It is *transient* when the same apply may
succeed later unchanged: the engine then retries the cycle
(:mod:`applier.engine.retry`); otherwise the run stops.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pyarrow as pa

from applier.errors import ERROR_CLASSES
from applier.intermediate.schema import TableDef
from applier.targets.pg_load import read_batches

# The error classes (applier.errors.ERROR_CLASSES) of SQLSTATE codes, then of
# SQLSTATE classes (the first two characters). Transient among them:
# connection exceptions (08), transaction rollbacks (40: serialization failure,
# deadlock), insufficient resources (53), lock_not_available (55P03: our
# lock_timeout), query_canceled (57014: our statement_timeout), and the server
# shutting down or starting (57P01-57P03).
CODE_CLASSES = {
    "23505": "unique",
    "23503": "foreign_key",
    "23514": "check",
    "23502": "not_null",
    "55P03": "lock",
    "57014": "timeout",
    "57P01": "shutdown",
    "57P02": "shutdown",
    "57P03": "shutdown",
    "42703": "schema",  # undefined column
    "42P01": "schema",  # undefined table
    "42804": "schema",  # datatype mismatch
}
STATE_CLASSES = {"22": "data", "08": "connection", "40": "serialization", "53": "resources"}
LOCK_NOT_AVAILABLE = "55P03"

_LINE = re.compile(r"line (\d+)")
_FAILING_ROW = re.compile(r"^Failing row contains \((.*)\)\.?$", re.DOTALL)
_KEY_VALUES = re.compile(r"^(Key \((?:[^()]|\([^()]*\))*\))=\(.*\)(.*)$", re.DOTALL)


def error_class(error: psycopg.Error) -> str:
    """The class of a database error (:data:`~applier.errors.ERROR_CLASSES`), by its SQLSTATE."""
    state = error.sqlstate
    if state is None:  # no answer from the server: connecting, or the connection lost
        return "connection" if isinstance(error, psycopg.OperationalError) else "other"
    return CODE_CLASSES.get(state) or STATE_CLASSES.get(state[:2], "other")


def is_transient(error: psycopg.Error) -> bool:
    """Whether ``error`` may not happen again on a retry (a lock, a lost connection, a deadlock)."""
    return ERROR_CLASSES[error_class(error)]


def quiet_detail(detail: str | None) -> str | None:
    """The database's error detail without row values: ``Failing row contains (…)`` goes, ``Key (c)=(v)`` keeps ``c``.

    The key of the staged row is named apart (``at key …``); the other values
    of a row may be personal data, shown only with ``target.show_row_values``.
    """
    if not detail or _FAILING_ROW.match(detail):
        return None
    key = _KEY_VALUES.match(detail)
    return f"{key.group(1)}{key.group(2)}" if key else detail


def key_of_failing_row(detail: str | None, table: TableDef) -> str | None:
    """The key of the row a constraint refused, read from ``Failing row contains (…)`` when unambiguous.

    PostgreSQL lists the row's values in the table's column order, separated by
    ``, `` and unquoted, so the key is read only when the values split into
    exactly as many parts as the table has columns (a value holding ``, ``
    would shift them). Not for a table without a key.
    """
    found = _FAILING_ROW.match(detail or "")
    if not found or not table.primary_key:
        return None
    values = found.group(1).split(", ")
    if len(values) != len(table.columns):
        return None
    by_name = dict(zip(table.column_names, values, strict=True))
    return ", ".join(f"{n}={by_name[n]}" for n in table.primary_key)


def failing_copy_key(error: psycopg.Error, table: TableDef, source: pa.Table | None) -> str | None:
    """The key of the staging row a COPY error points at (``line N`` of the COPY), if it can be found."""
    found = _LINE.search(error.diag.context or "")
    if not found or source is None:
        return None
    index = int(found.group(1)) - 1
    for batch in read_batches(source):
        if index < batch.num_rows:
            names = table.primary_key or table.column_names
            row = batch.slice(index, 1).to_pylist()[0]
            return ", ".join(f"{n}={row[n]!r}" for n in names)
        index -= batch.num_rows
    return None


def lock_holders(url: str, schema: str, name: str) -> str | None:
    """Who holds a lock on ``schema.name`` now, in words (pid, user, application, since when); None if nobody.

    Asked on a connection of its own after a lock timeout (the failed
    transaction can ask nothing more). Best effort: None when it cannot tell.
    """
    query = (
        "SELECT DISTINCT a.pid, a.usename, a.application_name, a.xact_start, l.mode "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.relation = to_regclass(%s) AND l.granted AND a.pid <> pg_backend_pid() ORDER BY a.pid"
    )
    qualified = ".".join('"' + part.replace('"', '""') + '"' for part in (schema, name))
    try:
        with psycopg.connect(url, connect_timeout=5, application_name="applier lock check") as conn:
            rows: list[Any] = conn.execute(query, [qualified]).fetchall()
    except psycopg.Error:
        return None
    if not rows:
        return None
    return "; ".join(
        f"pid {pid} (user {user}, application {app or '-'}, {mode}, transaction since {since:%Y-%m-%d %H:%M:%S %Z})"
        if since is not None
        else f"pid {pid} (user {user}, application {app or '-'}, {mode})"
        for pid, user, app, since, mode in rows
    )
