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
