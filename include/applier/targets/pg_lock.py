"""The PostgreSQL target's run lock: a session-level advisory lock held for a whole run.

The folder lock (:mod:`applier.engine.runlock`) keeps two runs of one work
folder apart; two runs whose folders differ (two machines, or two output
folders) would still share the target's checkpoint row. So a run also takes
``pg_try_advisory_lock(hashtext('applier run'), hashtext(<configuration name>))``
on a connection of its own, held open until the run ends. The two-key form
lives in another key space than the single ``bigint`` key of the cycle
commit's ``pg_advisory_xact_lock(hashtext('applier ' || name))``, so the run
never waits on its own commit.

A refused run names the holder from ``pg_locks`` and ``pg_stat_activity``:
its ``application_name`` (``applier <name> run, pid <pid> on <host>``), client
address, backend pid and connection time. A run that ends unlocks it before
it closes the connection; when a run dies its connection drops and the server
frees the lock.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from applier.errors import RunLockedError, TargetError

LOCK_SPACE = "applier run"
_MAX_APPLICATION_NAME = 63

_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtext(%s), hashtext(%s))"
_UNLOCK = "SELECT pg_advisory_unlock(hashtext(%s), hashtext(%s))"
# Advisory locks of the two-int4 form show their keys as oids, with objsubid 2.
_HOLDER = """
SELECT a.application_name, host(a.client_addr), a.client_hostname, l.pid, a.backend_start
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid::bigint = (hashtext(%s)::bigint & 4294967295)
  AND l.objid::bigint = (hashtext(%s)::bigint & 4294967295)
"""


def lock_application_name(configuration_name: str) -> str:
    """The ``application_name`` of the lock connection: the configuration, this pid and host (63 bytes at most)."""
    name = f"applier {configuration_name} run, pid {os.getpid()} on {socket.gethostname()}"
    return name.encode()[:_MAX_APPLICATION_NAME].decode(errors="ignore")


@contextmanager
def advisory_run_lock(url: str, configuration_name: str, shown_url: str) -> Iterator[None]:
    """Hold the configuration's advisory run lock on a dedicated connection while the block runs.

    Args:
        url: the target's libpq connection string.
        configuration_name: the lock's key (with :data:`LOCK_SPACE`).
        shown_url: the connection string as messages may show it (without the password).

    Raises:
        RunLockedError: another session holds the lock; the message names it.
        TargetError: the server cannot be reached or refuses the query.
    """
    conn = _connect(url, configuration_name, shown_url)
    held = False
    try:
        with _errors(shown_url, "take the run lock"):
            row = conn.execute(_TRY_LOCK, [LOCK_SPACE, configuration_name]).fetchone()
            if row is None or not row[0]:
                holder = _holder(conn, configuration_name)
                lock = f"the PostgreSQL run lock of configuration {configuration_name} on {shown_url}"
                raise RunLockedError(lock, holder)
            held = True
        yield
    finally:
        try:
            if held and not conn.closed:
                # Freed now: a closed connection's backend frees it only as it exits, after close() returns,
                # and a run started right after this one could find it still held.
                conn.execute(_UNLOCK, [LOCK_SPACE, configuration_name])
        except psycopg.Error:
            pass  # the connection is gone: the server frees the lock with its session
        finally:
            conn.close()


def _connect(url: str, configuration_name: str, shown_url: str) -> psycopg.Connection[Any]:
    with _errors(shown_url, "connect for the run lock"):
        return psycopg.connect(url, autocommit=True, application_name=lock_application_name(configuration_name))


def _holder(conn: psycopg.Connection[Any], configuration_name: str) -> str:
    """The session holding the lock, in words (its fields may be hidden from other roles)."""
    row = conn.execute(_HOLDER, [LOCK_SPACE, configuration_name]).fetchone()
    if row is None:
        return "a session that has just ended"
    application, address, hostname, pid, started = row
    client = hostname or address or "a local socket"
    since = "an unknown time"
    if started is not None:
        since = started.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    text = f"the session '{application or 'unknown'}' from {client}, backend pid {pid}, connected since {since}"
    return " ".join(text.split())


@contextmanager
def _errors(shown_url: str, doing: str) -> Iterator[None]:
    """A database error as a TargetError naming the server (never the password)."""
    try:
        yield
    except psycopg.Error as e:
        detail = e.diag.message_primary or str(e).strip()
        raise TargetError(f"PostgreSQL target {shown_url}: {doing} failed: {' '.join(detail.split())}") from e
