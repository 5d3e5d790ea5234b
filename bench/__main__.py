"""The benchmark's command line: ``python -m bench --out docs/benchmarks.md [--steps ...] [sizes ...]``.

Runs the chosen steps (:mod:`bench.steps`; all by default) and writes the
Markdown report (:func:`bench.report.render`); ``--render RESULTS`` renders a
saved results file instead. ``--part`` and ``--part-params`` are for the
benchmark's own child processes. Exit code 0 when every measurement ran,
whether or not the goals are met; 1 when a step failed (the work folder is
then kept for inspection).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.measure import BenchError, progress, spark_env
from bench.pg_server import DEFAULT_SERVER
from bench.report import render
from bench.steps import GROUPS, ORDER, Bench, selected_steps

DEFAULT_WORKDIR = Path("/tmp/cdc-bench")


def _part(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The function of one part (imported only in the child process that runs it)."""
    from bench import limit, pertxn, pg_rowbyrow, small_cycle

    return {
        "small": small_cycle.part_small,
        "limit": limit.part_limit,
        "pertxn": pertxn.part_pertxn,
        "pg-limit": limit.part_pg_limit,
        "pg-pertxn": pertxn.part_pg_pertxn,
        "pg-rowbyrow": pg_rowbyrow.part_rowbyrow,
    }[name]


def run_part_here(name: str, params_path: Path) -> int:
    """The child side of :func:`bench.measure.run_part`: run one part and write its JSON result."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    params = json.loads(params_path.read_text(encoding="utf-8"))
    result = _part(name)(params)
    Path(params["result"]).write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: delta-rs's runtime can abort the process while it exits
    # ("terminate called without an active exception"), after the result is safely written.
    os._exit(0)


def _columns(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description="The apply benchmarks (see bench/README.md).")
    add = p.add_argument
    add("--out", type=Path, help="write the Markdown report here (e.g. docs/benchmarks.md); default: stdout")
    add(
        "--steps",
        type=selected_steps,
        default=list(ORDER),
        help=f"steps or groups ({', '.join(GROUPS)}, all; default all): {','.join(ORDER)}",
    )
    add(
        "--workdir",
        type=Path,
        default=DEFAULT_WORKDIR,
        help=f"scratch folder, emptied first (default {DEFAULT_WORKDIR})",
    )
    add("--keep", action="store_true", help="keep the scratch folder afterwards")
    add("--results", type=Path, help="also save the results (JSON) here")
    add("--render", type=Path, metavar="RESULTS", help="render a saved results file and run nothing")
    add("--driver-memory", default="2g", help="spark.driver.memory of every Spark application (default 2g)")
    add(
        "--transactions",
        type=int,
        default=100_000,
        help="narrow (bench profile) workload transactions (default 100000)",
    )
    add("--file-size-mb", type=float, default=16.0, help="narrow workload pair size (default 16)")
    add("--prefix-transactions", type=int, default=2000, help="transactions of the per-transaction Delta baseline")
    add("--small-transactions", type=int, default=50, help="transactions in each small pair (default 50)")
    add("--small-cycles", type=int, default=3, help="small cycles timed after the bulk run (default 3)")
    add("--duckdb-rounds", type=int, default=2, help="rounds of the engine and the DuckDB baseline (default 2)")
    add("--scaleout-workers", type=int, default=2, help="one-core workers of the scale-out cluster (default 2)")
    add("--scaleout-factor", type=int, default=4, help="the larger scale-out workload: times --transactions (4)")
    add("--wide-tables", type=int, default=1000, help="tables of the wide workload (default 1000)")
    add("--wide-columns", type=_columns, default=(10, 60), help="MIN-MAX columns of a wide table (default 10-60)")
    add("--wide-transactions", type=int, default=90_000, help="wide workload transactions (default 90000)")
    add("--wide-file-size-mb", type=float, default=64.0, help="wide workload pair size (default 64)")
    add("--many-open-transactions", type=int, help="many-open workload transactions (default: the profile's 4,000)")
    add("--many-open-queue-mb", type=float, default=16.0, help="apply.queue_memory_mb of both many-open runs")
    add("--many-open-limit-mb", type=float, default=0.2, help="cycle size limit of the split many-open run")
    add("--run-length-cycles", type=int, default=2000, help="one-pair cycles of the run-length run (default 2000)")
    add("--run-length-transactions", type=int, default=5, help="transactions in each run-length pair (default 5)")
    add("--run-length-window", type=int, default=100, help="first and last cycles compared (default 100)")
    add(
        "--server",
        default=os.environ.get("APPLIER_BENCH_PG", DEFAULT_SERVER),
        help=f"PostgreSQL libpq connection string without dbname (default $APPLIER_BENCH_PG or {DEFAULT_SERVER!r})",
    )
    add("--threads", type=int, default=2, help="apply.threads of the PostgreSQL compiled runs (default 2)")
    add("--pertxn-prefix", type=int, help="PostgreSQL per-transaction baseline: the first N transactions only")
    add("--rowbyrow-prefix", type=int, help="PostgreSQL row-by-row baseline: the first N transactions only")
    add("--part", help=argparse.SUPPRESS)
    add("--part-params", type=Path, help=argparse.SUPPRESS)
    return p


_COUNTS = (
    "transactions",
    "prefix_transactions",
    "small_transactions",
    "small_cycles",
    "duckdb_rounds",
    "scaleout_workers",
    "scaleout_factor",
    "wide_tables",
    "wide_transactions",
    "many_open_transactions",
    "run_length_cycles",
    "run_length_transactions",
    "run_length_window",
    "threads",
    "pertxn_prefix",
    "rowbyrow_prefix",
)


def _write(text: str, out: Path | None) -> None:
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        progress(f"report written to {out}")
    else:
        print(text)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with ``--part``, one measurement in this process); the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.part:
        return run_part_here(args.part, args.part_params)
    if args.render:
        _write(render(json.loads(args.render.read_text(encoding="utf-8"))), args.out)
        return 0
    for name in _COUNTS:
        if (value := getattr(args, name)) is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not (args.file_size_mb > 0 and args.wide_file_size_mb > 0 and args.many_open_limit_mb > 0):
        parser.error("--file-size-mb, --wide-file-size-mb and --many-open-limit-mb must be positive")
    if args.run_length_cycles < 2:
        parser.error("--run-length-cycles must be at least 2")
    workdir = args.workdir.resolve()
    os.environ.update({k: spark_env()[k] for k in ("PATH", "PYSPARK_PYTHON", "SPARK_LOCAL_IP")})
    try:
        results = Bench(args, workdir).run(args.steps)
    except BenchError as e:
        print(f"bench: error: {e}", file=sys.stderr)
        if workdir.exists():
            print(f"bench: the work folder {workdir} is kept for inspection", file=sys.stderr)
        return 1
    if args.results:
        args.results.write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    _write(render(results), args.out.resolve() if args.out else None)
    if args.keep:
        progress(f"work folder kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
