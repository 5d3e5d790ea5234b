"""The PostgreSQL apply benchmark (issue 5): compiled apply against per-transaction, row-by-row and the limit.

One invocation generates one update-heavy workload (profile ``bench``) and
runs, each in a fresh process against a fresh database on the same server:

1. the compiled apply end to end (``applier run`` with ``target.type:
   postgres``), once with no cycle size limit and once with a limit giving
   about six cycles;
2. the calibrated limit: Spark reading every ``.dat`` file and parsing every
   image, plus COPY of the final rows alone into staging tables and their
   set-wise apply (:mod:`bench.pg_limit`);
3. ``MERGE`` against ``INSERT … ON CONFLICT`` on the same staged rows
   (:mod:`bench.pg_forms`);
4. per-transaction apply: each source transaction staged and applied on its
   own (:mod:`bench.pg_pertxn`);
5. log-order row-by-row apply: one statement per change, one commit per source
   transaction (:mod:`bench.pg_rowbyrow`);
6. across an emulated network: the compiled apply whole, and both baselines on
   their first ``--network-prefix`` transactions, through a relay delaying
   every byte (:mod:`bench.pg_delay`), at each round-trip time of
   ``--network-rtt-ms``.

Both baselines apply every committed transaction unless ``--pertxn-prefix`` or
``--rowbyrow-prefix`` limits them to the first ones (then the report
extrapolates). Baselines that apply everything must leave exactly the rows of
the compiled run; the report says whether they do.

Then it writes a Markdown report. Usage::

    python -m bench.pg_bench --out docs/benchmarks-postgres.md

Exit code 0 when every measurement ran, whether or not the goals are met;
1 when a step failed (the work folder is then kept for inspection). The
databases are dropped either way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import SPARK_MASTER, BenchError, progress
from bench.engine import choose_cycle_limit, read_cycles, summarize_cycles, write_config
from bench.measure import finish_benchmark, load_average, machine_facts, run_measured, run_part, tail
from bench.pg_delay import delayed_server
from bench.pg_forms import part_forms
from bench.pg_limit import part_limit
from bench.pg_pertxn import part_pertxn
from bench.pg_report import render
from bench.pg_rowbyrow import part_rowbyrow
from bench.pg_server import DEFAULT_SERVER, Databases, database_url, fingerprints, round_trip_ms
from bench.workload import generate, latest_table_defs, prepare_workdir

MODULE = "bench.pg_bench"
DEFAULT_WORKDIR = Path("/tmp/cdc-pg-bench")
PARTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "limit": part_limit,
    "forms": part_forms,
    "pertxn": part_pertxn,
    "rowbyrow": part_rowbyrow,
}
# Round-trip times the benchmark emulates by default: a neighbouring machine, and a cross-zone warehouse.
NETWORK_RTTS_MS = (0.25, 1.0)


def _rtts(text: str) -> tuple[float, ...]:
    """``--network-rtt-ms``: positive milliseconds, comma-separated."""
    values = tuple(float(v) for v in text.split(",") if v.strip())
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"round-trip times must be positive milliseconds, not {text!r}")
    return values


def run_part_here(name: str, params_path: Path) -> int:
    """The child side of :func:`bench.measure.run_part`: run one part and write its JSON result."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    params = json.loads(params_path.read_text(encoding="utf-8"))
    result = PARTS[name](params)
    Path(params["result"]).write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    return 0


def compiled_settings(
    workdir: Path, name: str, intermediate: Path, url: str, limit_mib: float, args: argparse.Namespace
) -> list[str]:
    """The ``--set`` overrides of one compiled run (its files under ``workdir/name``, its tables at ``url``)."""
    return [
        f"configuration_name={name}",
        f"intermediate_dir={intermediate}",
        f"output_dir={workdir / name / 'output'}",
        "target.type=postgres",
        f"target.url={url}",
        f"apply.threads={args.threads}",
        f"apply.process_intermediate_size_per_job={limit_mib}",
        "apply.max_cycles_per_run=0",
        f"spark.master={SPARK_MASTER}",
        f"spark.conf.spark.driver.memory={args.driver_memory}",
    ]


def load_batches(cycles: list[dict[str, Any]]) -> list[list[list[str]]]:
    """Each cycle's load batches (the tables loaded together), as the cycle reports hold them."""
    return [c.get("load_batches", c.get("batches", [])) for c in cycles]


def run_compiled(
    workdir: Path, name: str, intermediate: Path, url: str, limit_mib: float, args: argparse.Namespace
) -> dict[str, Any]:
    """``applier run`` with the PostgreSQL target in a fresh process; wall, tree memory and the cycle reports.

    Raises:
        BenchError: the run failed.
    """
    settings = compiled_settings(workdir, name, intermediate, url, limit_mib, args)
    config = write_config(workdir / name / "config.yaml", settings)
    cmd = [sys.executable, "-m", "applier.cli", "run", "--config", str(config)]
    log_path = workdir / name / "run.log"
    code, wall, peak = run_measured(cmd, log_path, f"compiled {name}")
    if code != 0:
        raise BenchError(f"applier run ({name}) exited {code}; log {log_path}:\n{tail(log_path)}")
    cycles = read_cycles(workdir / name / "output" / name / "cycles.jsonl")
    result = {
        "name": name,
        "limit_mib": limit_mib,
        "wall_s": wall,
        "peak_tree_mib": peak,
        "load_batches": load_batches(cycles),
        **summarize_cycles(cycles),
    }
    result["rows_per_s"] = result["rows_read"] / wall if wall else 0.0
    progress(f"compiled {name}: {result['cycles']} cycles, {result['rows_read']} rows in {wall:.1f} s")
    return result


def _baseline(
    name: str, dbs: Databases, workdir: Path, intermediate: Path, prefix: int, *, role: str = "", via: str = ""
) -> tuple[dict[str, Any], str]:
    """One prefix baseline (``pertxn`` or ``rowbyrow``) on a new database; its result and the database.

    ``role`` names the database (default: the baseline's name); ``via`` is a
    relay's connection string (:func:`bench.pg_delay.delayed_server`) to reach
    the database through instead of directly.
    """
    url = dbs.create(role or name)
    dbs.checkpoint()
    params = {"intermediate_dir": str(intermediate), "url": _through(url, via), "prefix": prefix}
    result = run_part(role or name, params, workdir, MODULE, part=name)
    progress(
        f"{name}: {result['transactions']} transactions, {result['rows']} changes, {result['statements']} "
        f"statements in {result['seconds']:.1f} s"
    )
    return result, url


def _through(url: str, via: str) -> str:
    """The database of ``url`` reached through the relay ``via`` (``url`` itself without one)."""
    import psycopg

    return database_url(via, psycopg.conninfo.conninfo_to_dict(url)["dbname"]) if via else url


def _measure_network(args: argparse.Namespace, workdir: Path, dbs: Databases, report: dict[str, Any]) -> None:
    """Each approach through a relay delaying every byte, at each of ``--network-rtt-ms``, into ``report``.

    The relay holds each byte so that a round trip through it, its own hop
    included, takes the time asked (or its own hop alone, when that is
    longer). Through it, the compiled apply runs whole and must leave the rows
    it left directly. Each baseline applies its first ``--network-prefix``
    transactions directly and then through the relay, back to back, so the
    two differ in the relay alone and not in what else the machine was doing.

    Raises:
        BenchError: a step failed.
    """
    intermediate = workdir / "intermediate"
    tables = list(latest_table_defs(intermediate))
    prefix = min(args.network_prefix, report["workload"]["committed"])
    network: dict[str, Any] = {"prefix": prefix, "direct_rtt_ms": round_trip_ms(database_url(args.server, "postgres"))}
    with delayed_server(args.server, 0.0, workdir) as via:
        # The relay's own hop (threads handing bytes on) is part of every round trip through it.
        network["relay_rtt_ms"] = round_trip_ms(database_url(via, "postgres"))
    network["runs"] = []
    for i, rtt in enumerate(args.network_rtt_ms, 1):
        hold_ms = max(0.0, rtt - network["relay_rtt_ms"]) / 2
        with delayed_server(args.server, hold_ms, workdir) as via:
            run: dict[str, Any] = {"rtt_ms": rtt, "hold_ms": hold_ms, "direct": {}}
            run["measured_rtt_ms"] = round_trip_ms(database_url(via, "postgres"))
            progress(f"relay for {rtt:g} ms: a round trip through it takes {run['measured_rtt_ms']:.3f} ms")
            url = dbs.create(f"net{i}_compiled")
            dbs.checkpoint()
            run["compiled"] = run_compiled(workdir, f"pg_net{i}", intermediate, _through(url, via), 0, args)
            run["compiled_agrees"] = fingerprints(url, tables) == report["target_rows"]["one"]
            dbs.drop(url)
            for name in ("pertxn", "rowbyrow"):
                run["direct"][name], url = _baseline(name, dbs, workdir, intermediate, prefix, role=f"net{i}d_{name}")
                dbs.drop(url)
                run[name], url = _baseline(name, dbs, workdir, intermediate, prefix, role=f"net{i}_{name}", via=via)
                dbs.drop(url)
        network["runs"].append(run)
    report["network"] = network


def _measure(args: argparse.Namespace, workdir: Path, dbs: Databases, report: dict[str, Any]) -> None:
    """Every measurement in order, into ``report``.

    Raises:
        BenchError: a step failed.
    """
    intermediate = workdir / "intermediate"
    tables = list(latest_table_defs(intermediate))
    one_url = dbs.create("compiled")
    dbs.checkpoint()
    report["compiled_one"] = run_compiled(workdir, "pg_one", intermediate, one_url, 0, args)
    limit_mib, planned = choose_cycle_limit(intermediate)
    progress(f"cycle limit {limit_mib} MiB plans {planned} cycles")
    many_url = dbs.create("cycles")
    dbs.checkpoint()
    report["compiled_cycles"] = run_compiled(workdir, "pg_cycles", intermediate, many_url, limit_mib, args)
    report["target_rows"] = {"one": fingerprints(one_url, tables), "cycles": fingerprints(many_url, tables)}
    report["compiled_agree"] = report["target_rows"]["one"] == report["target_rows"]["cycles"]
    dbs.drop(many_url)

    settings = compiled_settings(workdir, "pg_limit", intermediate, one_url, 0, args)
    for part, extra in (("limit", {"settings": settings}), ("forms", {"repeats": args.forms_repeats})):
        url = dbs.create(part)
        dbs.checkpoint()
        params = {"intermediate_dir": str(intermediate), "source_url": one_url, "url": url, **extra}
        report[part] = run_part(part, params, workdir, MODULE)
        dbs.drop(url)

    committed = report["workload"]["committed"]
    per_prefix, row_prefix = (min(p or committed, committed) for p in (args.pertxn_prefix, args.rowbyrow_prefix))
    report["pertxn"], per_url = _baseline("pertxn", dbs, workdir, intermediate, per_prefix)
    report["rowbyrow"], row_url = _baseline("rowbyrow", dbs, workdir, intermediate, row_prefix)
    report["baseline_rows"] = {"pertxn": fingerprints(per_url, tables), "rowbyrow": fingerprints(row_url, tables)}
    same_prefix = report["pertxn"]["transactions"] == report["rowbyrow"]["transactions"]
    rows = report["baseline_rows"]
    report["baselines_agree"] = rows["pertxn"] == rows["rowbyrow"] if same_prefix else None
    # A baseline that applied every committed transaction must hold what the compiled apply holds.
    report["baselines_match_compiled"] = {
        name: rows[name] == report["target_rows"]["one"]
        for name in ("pertxn", "rowbyrow")
        if report[name]["transactions"] == committed
    }
    if args.network_rtt_ms:
        _measure_network(args, workdir, dbs, report)
    dbs.drop(one_url)


def run_benchmark(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Generate the workload, run every measurement, drop the databases; the result the report is rendered from.

    Raises:
        BenchError: a step failed.
    """
    report: dict[str, Any] = {
        "command": " ".join(["python", "-m", MODULE, *sys.argv[1:]]),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "transactions": args.transactions,
        "driver_memory": args.driver_memory,
        "threads": args.threads,
        "load_before": load_average(),
    }
    started = time.perf_counter()
    progress(f"load average {report['load_before']}; work folder {workdir}")
    dbs = Databases(args.server)
    report["server"] = dbs.facts()
    report["machine"] = machine_facts()
    prepare_workdir(workdir)
    report["workload"] = generate(workdir / "intermediate", args.transactions, args.file_size_mb)
    report["file_size_note"] = file_size_note(args.file_size_mb)
    try:
        _measure(args, workdir, dbs, report)
    finally:
        dbs.drop_all()
    report["load_after"] = load_average()
    report["total_s"] = time.perf_counter() - started
    progress(f"load average after {report['load_after']}")
    (workdir / "report.json").write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    return report


def file_size_note(file_size_mb: float) -> str:
    """Why the pairs are not the profile's 64 MiB, when they are not."""
    if file_size_mb == 64.0:
        return ""
    return (
        f"pairs of {file_size_mb:g} MiB instead of the profile's 64 MiB, as in the Delta benchmark: a cycle takes "
        "whole pairs, and 64 MiB pairs allow no cycle limit giving about six comparable cycles"
    )


def _parser() -> argparse.ArgumentParser:
    """The command line (``--part`` and ``--part-params`` are for the benchmark's own child processes)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="The PostgreSQL apply benchmark: compiled apply, per-transaction, row-by-row and the limit.",
    )
    parser.add_argument("--out", type=Path, help="write the Markdown report here (e.g. docs/benchmarks-postgres.md)")
    parser.add_argument("--transactions", type=int, default=100_000, help="workload transactions (default 100000)")
    parser.add_argument(
        "--pertxn-prefix",
        type=int,
        help="apply only the first N committed transactions in the per-transaction baseline and extrapolate "
        "(default: all of them)",
    )
    parser.add_argument(
        "--rowbyrow-prefix",
        type=int,
        help="apply only the first N committed transactions in the row-by-row baseline and extrapolate "
        "(default: all of them)",
    )
    parser.add_argument(
        "--network-rtt-ms",
        type=_rtts,
        default=NETWORK_RTTS_MS,
        help="round-trip times (ms, comma-separated; '' for none) to emulate with a delay relay "
        f"(default {','.join(f'{v:g}' for v in NETWORK_RTTS_MS)})",
    )
    parser.add_argument(
        "--network-prefix",
        type=int,
        default=2000,
        help="committed transactions each baseline applies through the relay (default 2000)",
    )
    parser.add_argument("--threads", type=int, default=2, help="apply.threads of the compiled runs (default 2)")
    parser.add_argument("--forms-repeats", type=int, default=3, help="trials per statement form and scenario")
    parser.add_argument(
        "--server",
        default=os.environ.get("APPLIER_BENCH_PG", DEFAULT_SERVER),
        help=f"libpq connection string of the server, without dbname (default $APPLIER_BENCH_PG or {DEFAULT_SERVER!r})",
    )
    parser.add_argument(
        "--workdir", type=Path, default=DEFAULT_WORKDIR, help=f"scratch folder (default {DEFAULT_WORKDIR})"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder afterwards")
    parser.add_argument("--file-size-mb", type=float, default=16.0, help="pair size of the workload (default 16)")
    parser.add_argument("--driver-memory", default="2g", help="spark.driver.memory of every Spark application")
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    parser.add_argument("--part-params", type=Path, help=argparse.SUPPRESS)
    return parser


# Arguments that must be at least 1.
_COUNTS = ("transactions", "pertxn_prefix", "rowbyrow_prefix", "network_prefix", "threads", "forms_repeats")


def main(argv: list[str] | None = None) -> int:
    """Run the whole benchmark (or, with ``--part``, one measurement in this process); the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.part:
        return run_part_here(args.part, args.part_params)
    return finish_benchmark('pg_bench', args, _COUNTS, run_benchmark, render, parser)


if __name__ == "__main__":
    sys.exit(main())
