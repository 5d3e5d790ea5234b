"""A fresh PostgreSQL database per test, on the server the tests are pointed at.

The server comes from ``APPLIER_TEST_PG`` (a libpq connection string; default
``host=127.0.0.1 port=5432 user=postgres``, the server of these machines).
Each test gets its own database, created before and dropped after it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

SERVER = os.environ.get("APPLIER_TEST_PG", "host=127.0.0.1 port=5432 user=postgres")


def database_url(name: str) -> str:
    return psycopg.conninfo.make_conninfo(SERVER, dbname=name)


@contextmanager
def fresh_database() -> Iterator[str]:
    """A libpq connection string to a new, empty database, dropped afterwards."""
    name = f"applier_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield database_url(name)
    finally:
        with psycopg.connect(database_url("postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def ensure_logical_decoding(timeout_s: float = 60.0) -> None:
    """Make the server run with ``wal_level=logical``: idempotent, and a restart only when it is not.

    ``ALTER SYSTEM SET wal_level = logical`` takes effect at the next start, so
    the server is restarted (``pg_ctlcluster 15 main restart``, as root, as CI
    runs) and waited for. A server already at ``logical`` is left alone.
    """
    import fcntl
    import subprocess

    # One process at a time (pytest-xdist workers): the second finds the level set.
    with open("/tmp/applier-tests-wal-level.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with psycopg.connect(database_url("postgres"), autocommit=True) as admin:
            level = admin.execute("SHOW wal_level").fetchone()
            if level is not None and level[0] == "logical":
                return
            admin.execute("ALTER SYSTEM SET wal_level = logical")
        subprocess.run(["pg_ctlcluster", "15", "main", "restart"], check=True)
        _wait_for_logical(timeout_s)


def _wait_for_logical(timeout_s: float) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(database_url("postgres"), autocommit=True) as admin:
                level = admin.execute("SHOW wal_level").fetchone()
            if level is not None and level[0] == "logical":
                return
            raise RuntimeError(f"wal_level is {level} after the restart")
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@contextmanager
def logical_source() -> Iterator[tuple[str, str, str]]:
    """A fresh database with a unique slot and publication name: ``(url, slot, publication)``.

    The slot (which would keep the database from being dropped) and the
    publication are dropped after the test, whatever created them.
    """
    suffix = uuid.uuid4().hex[:12]
    slot, publication = f"applier_slot_{suffix}", f"applier_pub_{suffix}"
    with fresh_database() as url:
        try:
            yield url, slot, publication
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,),
                )
                conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))
