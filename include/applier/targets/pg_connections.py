"""The PostgreSQL target's connections, and its database errors turned into :class:`TargetError`.

The target keeps up to ``threads`` connections: the first runs each cycle's
transaction, the others load staging tables beside it. Each is opened on first
use with the configured ``lock_timeout`` and ``statement_timeout``, and opened
again after it was closed (a broken transaction closes them all). Messages
never carry the connection password.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from applier.errors import TargetError
from applier.intermediate.schema import TableDef
from applier.targets import pg_sql as q
from applier.targets.pg_errors import (
    LOCK_NOT_AVAILABLE,
    error_class,
    failing_copy_key,
    key_of_failing_row,
    lock_holders,
    quiet_detail,
)


def redacted(url: str) -> str:
    """The connection string without its password, for messages and logs."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "<unparsable connection string>"
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


@dataclass
class Staged:
    """One table's net changes on their way through a staging table."""

    table: TableDef
    stage: sql.Identifier
    source: pa.Table | None  # the staging rows while they load; None once in staging
    rows: int
    truncate: bool


class Connections:
    """The target's connections to one database (see the module docstring).

    Args:
        url: a libpq connection string or URI.
        name: the configuration, in each connection's ``application_name``.
        schema_map: source schema -> target schema, to name a locked table.
        show_row_values: errors keep the database's detail with the row's values.
        lock_timeout_s, statement_timeout_s: the session's timeouts (0: none).
    """

    def __init__(
        self,
        url: str,
        name: str,
        *,
        schema_map: Mapping[str, str],
        show_row_values: bool,
        lock_timeout_s: float,
        statement_timeout_s: float,
    ) -> None:
        self._url, self._name, self._schema_map = url, name, schema_map
        self._show_row_values = show_row_values
        self._lock_timeout_s, self._statement_timeout_s = lock_timeout_s, statement_timeout_s
        self._open: list[psycopg.Connection[Any]] = []

    def get(self, i: int) -> psycopg.Connection[Any]:
        """Connection ``i``, opened on first use and opened again when it was closed."""
        while len(self._open) <= i:
            self._open.append(self._connect())
        if self._open[i].closed:
            self._open[i] = self._connect()
        return self._open[i]

    def _connect(self) -> psycopg.Connection[Any]:
        with self.errors("connect", None):
            conn = psycopg.connect(self._url, application_name=f"applier {self._name}", autocommit=False)
            conn.execute(
                "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)",
                [f"{round(self._lock_timeout_s * 1000)}ms", f"{round(self._statement_timeout_s * 1000)}ms"],
            )
            conn.commit()
            return conn

    def close(self) -> None:
        """Close every connection (a broken one too)."""
        for conn in self._open:
            conn.close()
        self._open = []

    @contextmanager
    def errors(self, doing: str, table: str | None, source: Staged | None = None) -> Iterator[None]:
        """Turn a database error into a TargetError naming the table, the key when known, and the error."""
        try:
            yield
        except psycopg.Error as e:
            where = f"table {table}: " if table else ""
            key = None
            if source is not None:
                key = failing_copy_key(e, source.table, source.source)
                key = key or key_of_failing_row(e.diag.message_detail, source.table)
            shown = e.diag.message_detail if self._show_row_values else quiet_detail(e.diag.message_detail)
            detail = "; ".join(x for x in (e.diag.message_primary or str(e).strip(), shown) if x)
            at_key = f" at key {key}" if key else ""
            if e.sqlstate == LOCK_NOT_AVAILABLE and source is not None:
                holders = lock_holders(self._url, *q.target_name(source.table.name, self._schema_map))
                detail += f" (lock_timeout {self._lock_timeout_s:g} s; held by {holders or 'a transaction now gone'})"
            raise TargetError(
                f"PostgreSQL target {redacted(self._url)}: {where}{doing}{at_key} failed: {detail}",
                error_class=error_class(e),
                table=table,
                code=e.sqlstate,
            ) from e
