"""The PostgreSQL side of extraction: the slot, the publication, the server's readiness.

Transport: the SQL functions through psycopg 3 (already a dependency), with
pgoutput. A batch is ``pg_logical_slot_peek_binary_changes`` bounded by an
``upto_lsn`` (never unbounded: an unbounded peek decodes to the end of the
WAL), read through a server-side cursor so the client holds a few thousand
messages at a time, and the slot is moved only afterwards, with
``pg_replication_slot_advance``, once the pairs holding what it passes are in
place (see :mod:`applier.extract.run`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.types.string import TextLoader

from applier.errors import ExtractError, SourceUnavailableError
from applier.extract.decode import MARKER_PREFIX
from applier.extract.pgoutput import Relation, RelationColumn
from applier.extract.types import SESSION_SETTINGS

FETCH_ROWS = 2000


def connect(url: str, *, autocommit: bool, timeout_s: int | None = None) -> psycopg.Connection[tuple[object, ...]]:
    """A connection to the source whose output settings make pgoutput's text what types.py reads.

    Args:
        url: the libpq connection string.
        autocommit: whether each statement commits on its own.
        timeout_s: how long connecting may take (default: the connection string's, else libpq's: none).

    Raises:
        SourceUnavailableError: the source cannot be reached.
    """
    if timeout_s is not None:
        url = psycopg.conninfo.make_conninfo(url, connect_timeout=timeout_s)
    try:
        conn = psycopg.connect(url, autocommit=autocommit, application_name="applier extract")
    except psycopg.OperationalError as e:
        raise SourceUnavailableError(f"the source cannot be reached: {str(e).strip().splitlines()[0]}") from e
    for name, value in SESSION_SETTINGS.items():
        conn.execute(sql.SQL("SELECT set_config({}, {}, false)").format(sql.Literal(name), sql.Literal(value)))
    if autocommit is False:
        conn.commit()
    return conn


@dataclass(frozen=True)
class SlotState:
    """Where the slot stands and how far the server's WAL reaches."""

    confirmed_flush: int
    wal_end: int


def slot_state(conn: psycopg.Connection[tuple[object, ...]], slot: str) -> SlotState:
    """The slot's confirmed position and the server's flushed WAL end.

    Raises:
        ExtractError: the slot does not exist or is not a pgoutput slot.
    """
    row = conn.execute(
        "SELECT confirmed_flush_lsn - '0/0'::pg_lsn, pg_current_wal_flush_lsn() - '0/0'::pg_lsn, plugin "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        raise ExtractError(f"replication slot {slot} does not exist; run applier extract --setup")
    if row[2] != "pgoutput":
        raise ExtractError(f"replication slot {slot} uses plugin {row[2]}, not pgoutput; drop it and run --setup")
    return SlotState(int(str(row[0])), int(str(row[1])))


@dataclass(frozen=True)
class SlotWal:
    """What a slot costs the source and how far extraction is behind, in bytes of WAL.

    Attributes:
        retained_bytes: the server's WAL end minus the slot's ``restart_lsn``:
            the WAL the server keeps for the slot (None once the slot lost it).
        lag_bytes: the WAL end minus the slot's ``confirmed_flush_lsn``: WAL
            not extracted yet (other databases' WAL counts too).
        wal_status: ``reserved``, ``extended``, ``unreserved`` or ``lost``
            (``max_slot_wal_keep_size`` passed), as ``pg_replication_slots`` says.
    """

    retained_bytes: int | None
    lag_bytes: int
    wal_status: str


def slot_wal(conn: psycopg.Connection[tuple[object, ...]], slot: str) -> SlotWal:
    """The slot's retained WAL and extraction lag.

    Raises:
        ExtractError: the slot does not exist.
    """
    row = conn.execute(
        "SELECT pg_current_wal_lsn() - restart_lsn, pg_current_wal_lsn() - confirmed_flush_lsn, wal_status "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        raise ExtractError(f"replication slot {slot} does not exist; run applier extract --setup")
    retained = None if row[0] is None else max(0, int(str(row[0])))
    return SlotWal(retained, max(0, int(str(row[1] or 0))), str(row[2] or "unknown"))


def lsn_text(position: int) -> str:
    """A WAL position as PostgreSQL writes it (``16/B374D848``)."""
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


def peek(
    conn: psycopg.Connection[tuple[object, ...]], slot: str, publication: str, upto: int
) -> Generator[bytes, None, None]:
    """The slot's pgoutput messages of the transactions committed up to ``upto``, in order.

    Reads through a server-side cursor inside one transaction of ``conn``
    (which must not be in autocommit), ended when the iteration ends or the
    generator is closed early.
    """
    query = (
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, "
        "'proto_version', '1', 'publication_names', %s, 'messages', 'true')"
    )
    try:
        with conn.cursor(name="applier_extract_peek") as cur:
            cur.itersize = FETCH_ROWS
            cur.execute(query, (slot, lsn_text(upto), publication))
            for (data,) in cur:
                yield bytes(data)  # type: ignore[call-overload]
        conn.commit()
    except GeneratorExit:  # the caller stopped early (flow control, an error): end the transaction, nothing moved
        with contextlib.suppress(psycopg.Error):  # a lost connection has no transaction left to end
            conn.rollback()
        raise
    except psycopg.errors.ObjectNotInPrerequisiteState as e:
        conn.rollback()
        raise ExtractError(f"slot {slot}: {str(e).strip().splitlines()[0]}") from e


def advance(conn: psycopg.Connection[tuple[object, ...]], slot: str, position: int) -> None:
    """Move the slot's confirmed position to ``position`` (never back)."""
    conn.execute(
        "SELECT pg_replication_slot_advance(%s, %s::pg_lsn) FROM pg_replication_slots "
        "WHERE slot_name = %s AND confirmed_flush_lsn < %s::pg_lsn",
        (slot, lsn_text(position), slot, lsn_text(position)),
    )


def primary_key(conn: psycopg.Connection[tuple[object, ...]], schema: str, table: str) -> tuple[str, ...]:
    """A table's primary-key columns in key order, from the catalog as it stands now."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_index i JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, n) ON true "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indisprimary AND i.indrelid = (quote_ident(%s) || '.' || quote_ident(%s))::regclass ORDER BY k.n",
        (schema, table),
    ).fetchall()
    return tuple(str(r[0]) for r in rows)


def readiness_problems(conn: psycopg.Connection[tuple[object, ...]], slot: str) -> list[str]:
    """What the server or role lacks for logical decoding, each with its fix; empty when ready."""
    problems = []
    (wal_level,) = conn.execute("SHOW wal_level").fetchone() or ("",)
    if wal_level != "logical":
        problems.append(f"wal_level is {wal_level}: ALTER SYSTEM SET wal_level = logical, then restart the server")
    row = conn.execute(
        "SELECT current_setting('max_replication_slots')::int, count(*) FILTER (WHERE slot_name <> %s), "
        "bool_or(slot_name = %s) FROM pg_replication_slots",
        (slot, slot),
    ).fetchone()
    if row is not None and not row[2] and int(str(row[1])) >= int(str(row[0])):
        problems.append(f"max_replication_slots ({row[0]}) are all in use: raise it and restart the server")
    role = conn.execute("SELECT rolreplication OR rolsuper, rolname FROM pg_roles WHERE rolname = current_user")
    rights = role.fetchone()
    if rights is not None and not rights[0]:
        problems.append(f"role {rights[1]} lacks the REPLICATION right: ALTER ROLE {rights[1]} REPLICATION")
    return problems


def keyless_without_full(conn: psycopg.Connection[tuple[object, ...]], publication: str) -> list[str]:
    """Published tables with no primary key whose replica identity is not FULL (or an index)."""
    rows = conn.execute(
        "SELECT p.schemaname || '.' || p.tablename FROM pg_publication_tables p "
        "JOIN pg_class c ON c.oid = (quote_ident(p.schemaname) || '.' || quote_ident(p.tablename))::regclass "
        "WHERE p.pubname = %s AND c.relreplident IN ('d', 'n') AND (c.relreplident = 'n' OR NOT EXISTS "
        "(SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)) ORDER BY 1",
        (publication,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def create_publication(conn: psycopg.Connection[tuple[object, ...]], publication: str, tables: Sequence[str]) -> bool:
    """Create the publication (of ``tables``, or of all tables) unless it exists; True when created."""
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone():
        return False
    if tables:
        names = sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in tables)
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(publication), names))
    else:
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(publication)))
    return True


def create_slot(conn: psycopg.Connection[tuple[object, ...]], slot: str) -> bool:
    """Create the pgoutput slot unless it exists; True when created."""
    if conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone():
        return False
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    return True


def emit_marker(conn: psycopg.Connection[tuple[object, ...]], payload: str) -> None:
    """Commit a transactional logical message: a marker the decoder meets at its commit position."""
    conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", (MARKER_PREFIX, payload))
    if not conn.autocommit:
        conn.commit()


def relation(conn: psycopg.Connection[tuple[object, ...]], table: str) -> Relation:
    """A table as pgoutput's Relation message would describe it, from the catalog as it stands now.

    Raises:
        ExtractError: the table does not exist.
    """
    schema, name = table.split(".", 1)
    row = conn.execute(
        "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
        (schema, name),
    ).fetchone()
    if row is None:
        raise ExtractError(f"table {table} does not exist in the source")
    oid, identity = int(str(row[0])), str(row[1])
    if identity == "i":
        key_filter = "SELECT unnest(indkey) FROM pg_index WHERE indrelid = %s AND indisreplident"
    else:  # pgoutput flags the primary key under the default identity; FULL and NOTHING look it up
        key_filter = "SELECT unnest(indkey) FROM pg_index WHERE indrelid = %s AND indisprimary"
    columns = conn.execute(
        "SELECT attname, atttypid, atttypmod, attnum IN (" + key_filter + ") FROM pg_attribute "
        "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
        (oid, oid),
    ).fetchall()
    return Relation(
        oid,
        schema,
        name,
        identity,
        tuple(
            RelationColumn(str(c[0]), int(str(c[1])), int(str(c[2])), bool(c[3]) and identity in "di") for c in columns
        ),
    )


def select_text(
    conn: psycopg.Connection[tuple[object, ...]], table: Relation, tail: sql.Composable | None = None, *, name: str = ""
) -> psycopg.Cursor[tuple[object, ...]]:
    """A cursor over every column of ``table`` as its type's text output, as pgoutput sends it, then ``tail``.

    The values load as the server's text (a cast to ``text`` would not do: it
    trims a ``char(n)``'s padding). ``name``: a server-side cursor that streams.
    """
    cursor: psycopg.Cursor[tuple[object, ...]] = conn.cursor(name=name) if name else conn.cursor()
    for column in table.columns:
        cursor.adapters.register_loader(column.type_oid, TextLoader)
    query = sql.SQL("SELECT {} FROM {} {}").format(
        sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns),
        sql.Identifier(table.namespace, table.name),
        tail if tail is not None else sql.SQL(""),
    )
    if isinstance(cursor, psycopg.ServerCursor):
        cursor.itersize = FETCH_ROWS
    cursor.execute(query)
    return cursor


def select_settled(
    conn: psycopg.Connection[tuple[object, ...]], table: Relation, tail: sql.Composable | None = None
) -> list[tuple[object, ...]]:
    """:func:`select_text`'s rows, read in a snapshot that sees every transaction committed before it was taken.

    PostgreSQL records a commit (in the WAL, then in the commit log) before it
    makes the transaction visible to new snapshots. A snapshot taken between
    the two misses a transaction whose commit comes before it in the WAL: a
    nonatomic chunk read so, just after its low marker, misses a change the
    decoder places before the marker (outside the window), and the chunk's
    older row then overwrites it (a pgbench account lost its updates once, under
    load). The read is repeated while its snapshot holds a transaction the
    commit log says is committed: a matter of moments.

    Raises:
        ExtractError: the snapshot did not settle after :data:`SETTLE_TRIES` reads.
    """
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.commit()  # the marker just emitted is committed already; nothing else is open here
    isolation, conn.isolation_level = conn.isolation_level, psycopg.IsolationLevel.REPEATABLE_READ
    try:
        for _ in range(SETTLE_TRIES):
            with conn.transaction():
                rows = select_text(conn, table, tail).fetchall()
                (late,) = conn.execute(_LATE_COMMITS).fetchone() or (0,)
            if not late:
                return rows
            time.sleep(0.001)
    finally:
        conn.isolation_level = isolation
    raise ExtractError(f"table {table.namespace}.{table.name}: no snapshot without a commit not yet visible")


SETTLE_TRIES = 1000
_LATE_COMMITS = "SELECT count(*) FROM pg_snapshot_xip(pg_current_snapshot()) AS x WHERE pg_xact_status(x) = 'committed'"


def column_types(conn: psycopg.Connection[tuple[object, ...]], table: Relation, columns: Sequence[str]) -> list[str]:
    """The SQL types of ``columns`` (``format_type``), to cast a key's text back in a comparison."""
    rows = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s AND attnum > 0",
        (table.oid,),
    ).fetchall()
    types = {str(r[0]): str(r[1]) for r in rows}
    return [types[c] for c in columns]


def publish(conn: psycopg.Connection[tuple[object, ...]], publication: str, table: str) -> None:
    """Add ``table`` to the publication unless it publishes it already (or all tables)."""
    schema, name = table.split(".", 1)
    published = conn.execute(
        "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
        (publication, schema, name),
    ).fetchone()
    if published is None:
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                sql.Identifier(publication), sql.Identifier(schema, name)
            )
        )
