"""The measurement behind the extractor's choice of decoder and transport (README "Extracting from PostgreSQL").

``python -m bench.extract_transport [--server CONNINFO] [--changes N]`` makes a
scratch database with a pgbench-like table, writes N changes (half inserts,
half updates in transactions of 1,000), and times over the same WAL: each
plugin decoding in the server alone, each fetched through the SQL function
with a psycopg 3 server-side cursor, pgoutput through ``pg_recvlogical`` (the
streaming protocol), the project's decoder, ``pg_replication_slot_advance``,
and a whole ``applier extract``. The server needs ``wal_level=logical``; the
database, its slots and the files are dropped at the end. It is a quick
measurement, not a step of ``python -m bench``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from applier.config import load_config
from applier.extract import extract, source
from applier.extract.decode import Decoder
from applier.intermediate.schema import TableDef

DATABASE = "applier_extract_transport"
SLOTS = {"m_pgo": "pgoutput", "m_td": "test_decoding", "m_rl": "pgoutput", "m_full": "pgoutput"}


class _NullSink:
    def define_table(self, table: TableDef) -> None: ...
    def row(self, *args: Any) -> None: ...
    def begin(self, xid: str, lsn: int, ts: dt.datetime) -> None: ...
    def commit(self, xid: str, lsn: int, ts: dt.datetime) -> None: ...


def _scalar(conn: psycopg.Connection[Any], query: str, *params: object) -> Any:
    row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    return None if row is None else row[0]


def _prepare(server: str, changes: int) -> tuple[str, int, int]:
    with psycopg.connect(server, dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    url = psycopg.conninfo.make_conninfo(server, dbname=DATABASE)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE acc (id int PRIMARY KEY, bal int, filler char(84), ts timestamptz, n numeric(12,2))")
        conn.execute("CREATE PUBLICATION m_pub FOR ALL TABLES")
        for slot, plugin in SLOTS.items():
            conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
        start = int(
            _scalar(conn, "SELECT restart_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'm_pgo'")
        )
        half = changes // 2
        conn.execute(f"INSERT INTO acc SELECT g, g, 'x', now(), g / 100.0 FROM generate_series(1, {half}) g")
        for k in range(0, half, 1000):
            conn.execute(f"UPDATE acc SET bal = bal + 1 WHERE id > {k} AND id <= {k + 1000}")
        end = int(_scalar(conn, "SELECT pg_current_wal_flush_lsn() - '0/0'::pg_lsn"))
    return url, start, end


def _cursor_fetch(url: str, function: str, upto: str) -> str:
    count = size = 0
    with psycopg.connect(url) as conn, conn.cursor(name="measure") as cur:
        cur.itersize = source.FETCH_ROWS
        cur.execute(f"SELECT data FROM {function}", (upto,))  # type: ignore[arg-type]
        for (data,) in cur:
            count, size = count + 1, size + len(data)
    return f"{count} messages, {size / 2**20:.1f} MiB"


def _measures(url: str, end: int, work: Path) -> dict[str, Callable[[], str]]:
    upto = source.lsn_text(end)
    params = psycopg.conninfo.conninfo_to_dict(url)
    pgo = (
        "pg_logical_slot_peek_binary_changes('m_pgo', %s::pg_lsn, NULL, "
        "'proto_version', '1', 'publication_names', 'm_pub')"
    )
    td = "pg_logical_slot_peek_changes('m_td', %s::pg_lsn, NULL)"

    def in_server(function: str) -> Callable[[], str]:
        def run() -> str:
            with psycopg.connect(url) as conn:
                return f"{_scalar(conn, f'SELECT count(*) FROM {function}', upto)} rows counted in the server"

        return run

    def decoder() -> str:
        sink, count = Decoder(_NullSink(), lambda schema, table: ()), 0
        with source.connect(url, autocommit=False) as conn:
            for data in source.peek(conn, "m_pgo", "m_pub", end):
                sink.handle(data)
                count += 1
        return f"{count} messages decoded"

    def recvlogical() -> str:
        out = work / "recvlogical.bin"
        command = ["pg_recvlogical", "-h", str(params.get("host", "127.0.0.1")), "-p", str(params.get("port", 5432))]
        command += ["-U", str(params.get("user", "postgres")), "-d", DATABASE, "-S", "m_rl", "--start", "--no-loop"]
        command += ["-o", "proto_version=1", "-o", "publication_names=m_pub", "-E", upto, "-f", str(out)]
        subprocess.run(command, check=True)
        return f"{out.stat().st_size / 2**20:.1f} MiB file"

    def advance() -> str:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_replication_slot_advance('m_pgo', %s::pg_lsn)", (upto,))
        return "the peeked slot moved over the same WAL"

    def whole() -> str:
        config = load_config(
            None,
            ["configuration_name=m", f"intermediate_dir={work / 'pairs'}", f"output_dir={work / 'out'}",
             f"target.path={work / 't'}", f"source.url={url}", "source.slot=m_full", "source.publication=m_pub"],
        )  # fmt: skip
        summary = extract(config)
        return f"{summary.pairs} pairs, {summary.rows} rows"

    return {
        "pgoutput, decoded in the server only (count)": in_server(pgo),
        "test_decoding, decoded in the server only (count)": in_server(td),
        "pgoutput, SQL function, psycopg 3 server-side cursor": lambda: _cursor_fetch(url, pgo, upto),
        "test_decoding, SQL function, psycopg 3 server-side cursor": lambda: _cursor_fetch(url, td, upto),
        "pgoutput, pg_recvlogical (streaming protocol)": recvlogical,
        "pgoutput peek + the applier's decoder (no writing)": decoder,
        "pg_replication_slot_advance after the peek": advance,
        "applier extract: peek, decode, write pairs, advance": whole,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--server", default="host=127.0.0.1 port=5432 user=postgres", help="libpq connection string")
    parser.add_argument("--changes", type=int, default=200_000, help="changes written (half inserts, half updates)")
    args = parser.parse_args()
    url, start, end = _prepare(args.server, args.changes)
    work = Path(tempfile.mkdtemp(prefix="extract-transport-"))
    print(f"{args.changes} changes, {(end - start) / 2**20:.1f} MiB of WAL")
    try:
        for label, measure in _measures(url, end, work).items():
            began = time.perf_counter()
            outcome = measure()
            seconds = time.perf_counter() - began
            print(f"{label:58s} {seconds:6.2f} s {args.changes / seconds:10,.0f} changes/s  {outcome}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with psycopg.connect(args.server, dbname="postgres", autocommit=True) as admin:
            for slot in SLOTS:
                admin.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                )
            admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")


if __name__ == "__main__":
    main()
