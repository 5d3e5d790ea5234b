"""The PostgreSQL server the benchmark runs against: its databases, its settings, and what its tables hold.

Every approach gets a database of its own on the same server, created before
its step and dropped when the benchmark ends (or fails). Database names carry
the benchmark's process id, so concurrent benchmarks and test runs on a shared
server never meet.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from bench.measure import BenchError, progress

DEFAULT_SERVER = "host=127.0.0.1 port=5432 user=postgres"
# The settings that decide what a commit and a bulk load cost, shown in the report.
SETTINGS = (
    "shared_buffers",
    "work_mem",
    "maintenance_work_mem",
    "synchronous_commit",
    "fsync",
    "full_page_writes",
    "wal_level",
    "max_wal_size",
    "checkpoint_timeout",
)


def database_url(server: str, name: str) -> str:
    """The libpq connection string of database ``name`` on ``server``."""
    import psycopg

    return psycopg.conninfo.make_conninfo(server, dbname=name)


def is_local(server: str) -> bool:
    """Whether the connection string names this machine (loopback, a Unix socket, or no host)."""
    import psycopg

    host = str(psycopg.conninfo.conninfo_to_dict(server).get("host") or "")
    return host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")


def safe_server(server: str) -> str:
    """The server's connection string without a password, for the report and messages."""
    from applier.targets.pg_connections import redacted

    return redacted(server)


class Databases:
    """The benchmark's databases on one server: created on demand, all dropped by :meth:`drop_all`.

    Args:
        server: a libpq connection string without ``dbname`` (the ``postgres``
            database is used for administration).
        prefix: the start of every database name.
    """

    def __init__(self, server: str, prefix: str = "cdc_bench") -> None:
        self.server = server
        self.prefix = f"{prefix}_{os.getpid()}"
        self.created: list[str] = []

    def _admin(self) -> Any:
        import psycopg

        try:
            return psycopg.connect(database_url(self.server, "postgres"), autocommit=True)
        except psycopg.Error as e:
            raise BenchError(f"cannot connect to PostgreSQL at {safe_server(self.server)}: {e}") from e

    def _run(self, statement: Any, doing: str) -> None:
        """One administrative statement; a database error becomes a BenchError saying what was being done."""
        import psycopg

        with self._admin() as admin:
            try:
                admin.execute(statement)
            except psycopg.Error as e:
                raise BenchError(f"PostgreSQL at {safe_server(self.server)}: {doing} failed: {e}") from e

    def create(self, role: str) -> str:
        """A new, empty database for ``role`` (``compiled``, ``pertxn`` ...), after a :meth:`checkpoint`; its URL."""
        from psycopg import sql

        name = f"{self.prefix}_{role}"
        self._run(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)), f"creating database {name}")
        self.created.append(name)
        self.checkpoint()
        return database_url(self.server, name)

    def drop(self, url: str) -> None:
        """Drop one of the benchmark's databases (closing any connection still open to it)."""
        from psycopg import conninfo, sql

        name = conninfo.conninfo_to_dict(url)["dbname"]
        if name not in self.created:
            raise BenchError(f"database {name} was not created by this benchmark; not dropping it")
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        self._run(drop, f"dropping database {name}")
        self.created.remove(name)

    def drop_all(self) -> None:
        """Drop every database still there; a failure is reported, not raised (this runs while cleaning up)."""
        for name in list(self.created):
            try:
                self.drop(database_url(self.server, name))
            except Exception as e:
                progress(f"could not drop database {name}: {e}")

    def checkpoint(self) -> None:
        """``CHECKPOINT``: write out what earlier steps left dirty, so the next step does not pay for it.

        It needs a superuser or the ``pg_checkpoint`` role.
        """
        self._run("CHECKPOINT", "CHECKPOINT (needs a superuser or the pg_checkpoint role)")

    def facts(self) -> dict[str, Any]:
        """The server's version, the settings in :data:`SETTINGS` and the round-trip time of a trivial statement."""
        with self._admin() as admin:
            version = admin.execute("SHOW server_version").fetchone()
            rows = admin.execute(
                "SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s) ORDER BY name", [list(SETTINGS)]
            ).fetchall()
            round_trip_ms = _round_trip_ms(admin)
        shown = {}
        for name, setting, unit in rows:
            shown[name] = _with_unit(setting, unit)
        import psycopg

        return {
            "server": safe_server(self.server),
            "version": version[0] if version else "?",
            "settings": shown,
            "psycopg": psycopg.__version__,
            "round_trip_ms": round_trip_ms,
        }


def _round_trip_ms(conn: Any, times: int = 2000) -> float:
    """The median time of a prepared ``SELECT 1``: what one statement a client waits for costs at the least."""
    import statistics
    import time

    samples = []
    for _ in range(times):
        started = time.perf_counter()
        conn.execute("SELECT 1", prepare=True).fetchone()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def _with_unit(setting: str, unit: str | None) -> str:
    """A ``pg_settings`` value in readable units (``16384`` of ``8kB`` is ``128 MiB``)."""
    sizes = {"8kB": 8 * 1024, "kB": 1024, "MB": 1024 * 1024}
    if unit in sizes and setting.lstrip("-").isdigit():
        size = int(setting) * sizes[unit]
        return f"{size / 1024 / 1024:g} MiB" if size >= 1024 * 1024 else f"{size / 1024:g} KiB"
    return f"{setting} {unit}" if unit else setting


def fingerprints(url: str, tables: Iterable[str]) -> dict[str, list[Any]]:
    """Per table (``schema.table``): its row count and an order-free digest of its rows (a multiset).

    Two databases whose tables have equal fingerprints hold the same rows,
    duplicates included; a missing table reads as ``[0, None]``.
    """
    import psycopg
    from psycopg import sql

    out: dict[str, list[Any]] = {}
    with psycopg.connect(url) as conn:
        for table in tables:
            schema, name = table.split(".", 1)
            exists = conn.execute("SELECT to_regclass(%s)", [sql.Identifier(schema, name).as_string(conn)]).fetchone()
            if exists is None or exists[0] is None:
                out[table] = [0, None]
                continue
            query = sql.SQL(
                "SELECT count(*), md5(coalesce(string_agg(h, '' ORDER BY h), '')) "
                "FROM (SELECT md5(t::text) AS h FROM {} AS t) AS x"
            ).format(sql.Identifier(schema, name))
            row = conn.execute(query).fetchone()
            out[table] = [int(row[0]), row[1]] if row else [0, None]
    return out
