"""The ``extract`` and ``pgbench-tps`` steps: the extractor against ``pg_recvlogical``, and its cost to the source.

``extract`` loads a pgbench stream (TPC-B-like, ``--source-changes`` row
changes) into a scratch database whose slots, one per consumer, were created
before the load, then reads the same WAL with each consumer: first the
decoder and transport choices in one fresh process (part
``extract-transport``: each plugin decoding in the server alone, each fetched
through the SQL function with a psycopg 3 server-side cursor, the project's
decoder writing nothing), then ``pg_recvlogical`` writing its slot's pgoutput
stream to a file, then one bounded ``applier extract`` writing pairs.
``pgbench-tps`` runs the same pgbench twice on one database, without and then
with ``applier extract --follow`` reading it throughout.
"""

from __future__ import annotations

import math
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.measure import MIB, Background, BenchError, progress, run_measured, run_part, tail, write_config
from bench.pg_source import (
    TPCB_CHANGES,
    client_args,
    client_env,
    create_slot,
    dbname,
    extractor_settings,
    folder_mib,
    pgbench_init,
    pgbench_run,
    scalar,
    wal_end,
)

if TYPE_CHECKING:
    from bench.steps import Bench

LOAD_SETTINGS = {"synchronous_commit": "off"}  # the load only writes the WAL to be read; its speed is not measured
SUMMARY = re.compile(r"(\d+) pairs written, (\d+) transactions, (\d+) rows")


def setup_extractor(
    b: Bench, name: str, url: str, target: dict[str, Any] | None = None, *more: str
) -> tuple[Path, str, list[str]]:
    """An Applier configuration file reading ``url`` (pairs in ``<workdir>/<name>/pairs``), with --setup done.

    ``--setup`` creates the publication (of all tables, or of ``source.include`` in ``more``), then the slot,
    both named after the benchmark's process and ``name``. Returns the file, that name and the settings.
    """
    from applier.config import load_config
    from applier.extract import setup_source

    names = f"{b.dbs.prefix}_{name.replace('-', '_')}"
    target = target or {"path": b.workdir / name / "target"}
    settings = extractor_settings(b.workdir, name, url, names, b.args.driver_memory, target)
    settings += more
    config = write_config(b.workdir / name / "config.yaml", settings)
    setup_source(load_config(config))
    return config, names, settings


def extract_summary(log: str) -> dict[str, int]:
    """pairs, transactions and rows from ``applier extract``'s last line."""
    found = SUMMARY.findall(log)
    if not found:
        return {"pairs": 0, "transactions": 0, "rows": 0}
    pairs, transactions, rows = (int(v) for v in found[-1])
    return {"pairs": pairs, "transactions": transactions, "rows": rows}


def step_extract(b: Bench) -> None:
    """A pgbench stream read by each consumer, its slot created before the load: throughput and memory."""
    a, folder = b.args, b.workdir / "extract"
    url = b.dbs.create("extract")
    pgbench_init(url, a.pgbench_scale, folder / "init.log")
    config, names, _ = setup_extractor(b, "extract", url)
    query = "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
    start = int(scalar(url, query, names))
    create_slot(url, f"{names}_rl")  # pg_recvlogical's, which the transport part peeks first
    create_slot(url, f"{names}_td", "test_decoding")
    per_client = math.ceil(a.source_changes / TPCB_CHANGES / 2)
    load = pgbench_run(url, ["-n", "-c", "2", "-j", "2", "-t", str(per_client)], folder, "load", False, **LOAD_SETTINGS)
    end = wal_end(url)
    progress(f"extract: {load['transactions']:,} transactions, {(end - start) / MIB:,.1f} MiB of WAL to read")
    params = {"url": url, "publication": names, "slot": f"{names}_rl", "td_slot": f"{names}_td", "end": end}
    transport = run_part("extract-transport", params, b.workdir)
    recv = _recvlogical(b, url, params)
    b.dbs.checkpoint()
    cmd = [sys.executable, "-m", "applier.cli", "extract", "--config", str(config)]
    cmd += ["--max-wal-mb", f"{(end - start + 1) / MIB:.9f}"]  # the WAL pg_recvlogical read, not what came after
    code, wall, peak = run_measured(cmd, folder / "extract.log", "applier extract")
    log_text = (folder / "extract.log").read_text(encoding="utf-8")
    if code != 0:
        raise BenchError(
            f"applier extract exited {code}; log {folder / 'extract.log'}:\n{tail(folder / 'extract.log')}"
        )
    extractor = {
        "wall_s": wall,
        "peak_tree_mib": peak,
        "written_mib": folder_mib(folder / "pairs"),
        **extract_summary(log_text),
    }
    b.r["extract"] = {"load": load, "scale": a.pgbench_scale, "wal_mib": (end - start) / MIB,
                      "transport": transport, "recvlogical": recv, "extractor": extractor}  # fmt: skip
    b.dbs.drop(url)


def _recvlogical(b: Bench, url: str, params: dict[str, Any]) -> dict[str, Any]:
    """``pg_recvlogical --start --endpos`` writing its slot's pgoutput stream to a file."""
    from applier.extract.source import lsn_text

    out = b.workdir / "extract" / "recvlogical.bin"
    cmd = ["pg_recvlogical", *client_args(url), "-d", dbname(url), "-S", params["slot"], "--start", "--no-loop"]
    cmd += ["-o", "proto_version=1", "-o", f"publication_names={params['publication']}"]
    cmd += ["-E", lsn_text(params["end"]), "-f", str(out)]
    b.dbs.checkpoint()
    code, wall, peak = run_measured(cmd, b.workdir / "extract" / "recvlogical.log", "pg_recvlogical", client_env(url))
    if code != 0:
        raise BenchError(f"pg_recvlogical exited {code}; log:\n{tail(b.workdir / 'extract' / 'recvlogical.log')}")
    return {"wall_s": wall, "peak_tree_mib": peak, "written_mib": out.stat().st_size / MIB}


# ---------------------------------------------------------------------------
# Part extract-transport: the decoder and transport choices, in a fresh process


def part_transport(params: dict[str, Any]) -> dict[str, Any]:
    """Each way of reading the slots' stream up to ``end``, timed: what the extractor's choice rests on.

    Peeks, then the test_decoding slot advanced: pgoutput's slot stays where it was, for ``pg_recvlogical`` next.
    """
    import psycopg

    from applier.extract import source

    url, upto, pub = params["url"], source.lsn_text(params["end"]), params["publication"]
    pgo = f"pg_logical_slot_peek_binary_changes('{params['slot']}', %s::pg_lsn, NULL, 'proto_version', '1', " \
          f"'publication_names', '{pub}')"  # fmt: skip
    td = f"pg_logical_slot_peek_changes('{params['td_slot']}', %s::pg_lsn, NULL)"
    changes = {"pgoutput": "get_byte(data, 0) IN (73, 85, 68)", "test_decoding": "data ~ '^table '"}  # I, U, D
    out: dict[str, Any] = {}

    def timed(label: str, run: Any) -> None:
        started = time.perf_counter()
        result = run()
        out[label] = {"s": time.perf_counter() - started, **result}

    for plugin, function in (("pgoutput", pgo), ("test_decoding", td)):

        def in_server(function: str = function, plugin: str = plugin) -> dict[str, Any]:
            query = (
                f"SELECT count(*) FILTER (WHERE {changes[plugin]}), count(*), sum(octet_length(data)) FROM {function}"
            )
            with psycopg.connect(url) as conn:
                row = conn.execute(query, (upto,)).fetchone()
            assert row is not None
            return {"changes": int(row[0]), "messages": int(row[1]), "mib": int(row[2] or 0) / MIB}

        timed(f"{plugin}, decoded in the server only (count)", in_server)
    for plugin, function in (("pgoutput", pgo), ("test_decoding", td)):

        def fetched(function: str = function) -> dict[str, Any]:
            count = size = 0
            with psycopg.connect(url) as conn, conn.cursor(name="bench_fetch") as cur:
                cur.itersize = source.FETCH_ROWS
                cur.execute(f"SELECT data FROM {function}", (upto,))
                for (data,) in cur:
                    count, size = count + 1, size + len(data)
            return {"messages": count, "mib": size / MIB}

        timed(f"{plugin}, SQL function, psycopg 3 server-side cursor", fetched)
    timed("pgoutput peek + the applier's decoder (no writing)", lambda: _decode_only(params, url))

    def advance() -> dict[str, Any]:  # fast-forward decoding, what the extractor's advance costs
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (params["td_slot"], upto))
        return {"messages": 0}

    timed("pg_replication_slot_advance over the same WAL (test_decoding's slot, last)", advance)
    return {"ways": out}


def _decode_only(params: dict[str, Any], url: str) -> dict[str, Any]:
    import datetime as dt

    from applier.extract import source
    from applier.extract.decode import Decoder
    from applier.intermediate.schema import TableDef

    class NullSink:
        def define_table(self, table: TableDef) -> None: ...
        def row(self, *args: Any) -> None: ...
        def begin(self, xid: str, lsn: int, ts: dt.datetime) -> None: ...
        def commit(self, xid: str, lsn: int, ts: dt.datetime) -> None: ...
        def rollback(self, xid: str, lsn: int, ts: dt.datetime) -> None: ...

    decoder, count = Decoder(NullSink(), lambda schema, table: ()), 0
    with source.connect(url, autocommit=False) as conn:
        for data in source.peek(conn, params["slot"], params["publication"], params["end"]):
            decoder.handle(data)
            count += 1
    return {"messages": count, "changes": decoder.rows}


# ---------------------------------------------------------------------------
# pgbench-tps


def step_pgbench_tps(b: Bench) -> None:
    """pgbench without the extractor, then with ``applier extract --follow`` reading the database throughout."""
    a, folder = b.args, b.workdir / "pgbench_tps"
    seconds = a.tps_seconds or tps_seconds(a.source_changes)
    url = b.dbs.create("tps")
    pgbench_init(url, a.pgbench_scale, folder / "init.log")
    args = ["-T", str(seconds), "-c", str(a.tps_clients), "-j", "2"]  # pgbench vacuums first, each run alike
    b.dbs.checkpoint()
    without = pgbench_run(url, args, folder, "without")
    config, names, _ = setup_extractor(b, "pgbench_tps", url)
    b.dbs.checkpoint()
    cmd = [sys.executable, "-m", "applier.cli", "extract", "--config", str(config), "--follow"]
    with Background(cmd, folder / "follow.log", "applier extract --follow") as follower:
        time.sleep(2)  # its imports and first (empty) batch, before the load starts
        with_extractor = pgbench_run(url, args, folder, "with")
        query = "SELECT pg_current_wal_flush_lsn() - confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s"
        behind = int(scalar(url, query, names))
        stopped = follower.stop()
    if stopped["code"] != 0:
        raise BenchError(f"applier extract --follow exited {stopped['code']}; log:\n{tail(folder / 'follow.log')}")
    log_text = (folder / "follow.log").read_text(encoding="utf-8")
    extractor = {**stopped, **extract_summary(log_text), "behind_mib": behind / MIB}
    b.r["pgbench-tps"] = {"seconds": seconds, "clients": a.tps_clients, "scale": a.pgbench_scale,
                          "without": without, "with": with_extractor, "extractor": extractor}  # fmt: skip
    b.dbs.drop(url)


def tps_seconds(source_changes: int) -> int:
    """The default duration of each pgbench-tps run: 30 s at 1M changes, less for a quick check (at least 5 s)."""
    return max(5, min(30, round(30 * source_changes / 1_000_000)))
