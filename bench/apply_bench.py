"""The apply-engine benchmark (issue 3): the engine, a calibrated limit and per-transaction commits, side by side.

One invocation generates one update-heavy workload (profile ``bench``) and runs,
each in a fresh process:

1. the engine end to end (``applier run``), once with no cycle size limit and
   once with a limit that gives about six cycles, polling the memory of the
   whole process tree;
2. a small cycle after a bulk run, in one Spark application (the Applier API
   called again with the same session after one small pair is added);
3. the calibrated limit of this machine: read every ``.dat`` file and parse
   every image with typed ``from_json``, plus one delta-rs merge per table of
   the final rows alone into empty tables;
4. a baseline that commits each source transaction on its own, on a prefix of
   the committed transactions, extrapolated linearly to all of them.

Then it writes a Markdown report. Usage::

    python -m bench.apply_bench --out docs/benchmarks.md

Exit code 0 when every measurement ran, whether or not the goals are met;
1 when a step failed (the work folder is then kept for inspection).
"""

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_WORKDIR, progress
from bench.engine import choose_cycle_limit, engine_settings, run_engine, table_rows, write_config
from bench.limit import part_limit
from bench.measure import finish_benchmark, load_average, machine_facts, run_part
from bench.per_transaction import part_pertxn
from bench.report import render
from bench.small_cycle import part_small
from bench.workload import generate, prepare_workdir

PARTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "small": part_small,
    "limit": part_limit,
    "pertxn": part_pertxn,
}


def run_part_here(name: str, params_path: Path) -> int:
    """The child side of :func:`bench.measure.run_part`: run one part and write its JSON result."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    params = json.loads(params_path.read_text(encoding="utf-8"))
    result = PARTS[name](params)
    Path(params["result"]).write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: delta-rs's runtime can abort the process while it exits
    # ("terminate called without an active exception"), after the result is safely written.
    os._exit(0)


def _parser() -> argparse.ArgumentParser:
    """The command line of the benchmark (``--part`` and ``--part-params`` are for its own child processes)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.apply_bench",
        description="The apply-engine benchmark: engine, calibrated limit and per-transaction commits side by side.",
    )
    parser.add_argument("--out", type=Path, help="write the Markdown report here (e.g. docs/benchmarks.md)")
    parser.add_argument("--transactions", type=int, default=100_000, help="workload transactions (default 100000)")
    parser.add_argument(
        "--workdir", type=Path, default=DEFAULT_WORKDIR, help=f"scratch folder (default {DEFAULT_WORKDIR})"
    )
    parser.add_argument(
        "--prefix-transactions",
        type=int,
        default=2000,
        help="committed transactions the per-transaction baseline applies",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder afterwards")
    parser.add_argument(
        "--file-size-mb",
        type=float,
        default=16.0,
        help="pair size of the generated workload (default 16; the profile's 64 makes too few pairs for ~6 cycles)",
    )
    parser.add_argument("--driver-memory", default="2g", help="spark.driver.memory of every Spark application")
    parser.add_argument("--small-transactions", type=int, default=50, help="transactions in each small pair")
    parser.add_argument("--small-cycles", type=int, default=3, help="small cycles to time after the bulk run")
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    parser.add_argument("--part-params", type=Path, help=argparse.SUPPRESS)
    return parser


# Arguments that must be at least 1.
_COUNTS = ("transactions", "prefix_transactions", "small_transactions", "small_cycles")


def main(argv: list[str] | None = None) -> int:
    """Run the whole benchmark (or, with ``--part``, one measurement in this process); the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.part:
        return run_part_here(args.part, args.part_params)
    return finish_benchmark('apply_bench', args, _COUNTS, run_benchmark, render, parser)


def _file_size_note(file_size_mb: float) -> str:
    """Why the pairs are not the profile's 64 MiB, when they are not."""
    if file_size_mb == 64.0:
        return ""
    return (
        f"pairs of {file_size_mb:g} MiB instead of the profile's 64 MiB: with 64 MiB the stream is 4 pairs "
        "of very unequal size and a cycle takes whole pairs, so no limit gives 4-8 comparable cycles (the "
        "profile's long transactions span 3 pairs, so they are smaller here and the stream more update-heavy)"
    )


def _run_small(args: argparse.Namespace, workdir: Path, intermediate: Path) -> dict[str, Any]:
    """The small-cycle part, on its own copy of the folder (hard links), since it adds pairs."""
    small_dir = workdir / "bench_small" / "intermediate"
    small_dir.mkdir(parents=True)
    for f in sorted(intermediate.iterdir()):
        try:
            os.link(f, small_dir / f.name)
        except OSError:
            shutil.copy2(f, small_dir / f.name)
    small_config = write_config(
        workdir / "bench_small" / "config.yaml",
        engine_settings(workdir, "bench_small", small_dir, 0, args.driver_memory),
    )
    return run_part(
        "small",
        {"config": str(small_config), "tails": args.small_cycles, "tail_transactions": args.small_transactions},
        workdir,
    )


def _run_limit(args: argparse.Namespace, workdir: Path, intermediate: Path, engine_target: str) -> dict[str, Any]:
    """The calibrated-limit part, reading the final rows from the one-cycle engine run's target."""
    return run_part(
        "limit",
        {
            "intermediate_dir": str(intermediate),
            "settings": engine_settings(workdir, "bench_limit", intermediate, 0, args.driver_memory),
            "engine_target": engine_target,
            "engine_app_id": "bench_one",
            "out_dir": str(workdir / "bench_limit" / "target"),
        },
        workdir,
    )


def _run_pertxn(args: argparse.Namespace, workdir: Path, intermediate: Path, committed: int) -> dict[str, Any]:
    """The per-transaction part, on the first ``--prefix-transactions`` committed transactions."""
    per = run_part(
        "pertxn",
        {
            "intermediate_dir": str(intermediate),
            "prefix": min(args.prefix_transactions, committed),
            "out_dir": str(workdir / "bench_pertxn" / "target"),
        },
        workdir,
    )
    progress(f"per-transaction: {per['transactions']} transactions, {per['commits']} commits in {per['seconds']:.1f} s")
    return per


def run_benchmark(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every measurement in order; the result the report is rendered from (also saved as ``report.json``).

    Raises:
        BenchError: a step failed.
    """
    argv = ["python", "-m", "bench.apply_bench", *sys.argv[1:]]
    report: dict[str, Any] = {
        "command": " ".join(argv),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "transactions": args.transactions,
        "driver_memory": args.driver_memory,
        "load_before": load_average(),
    }
    started = time.perf_counter()
    progress(f"load average {report['load_before']}; work folder {workdir}")
    report["machine"] = machine_facts()
    prepare_workdir(workdir)
    intermediate = workdir / "intermediate"
    report["workload"] = w = generate(intermediate, args.transactions, args.file_size_mb)
    report["file_size_note"] = _file_size_note(args.file_size_mb)

    report["engine_one"] = run_engine(workdir, "bench_one", intermediate, 0, args.driver_memory)
    limit_mib, planned = choose_cycle_limit(intermediate)
    progress(f"cycle limit {limit_mib} MiB plans {planned} cycles")
    report["engine_cycles"] = run_engine(workdir, "bench_cycles", intermediate, limit_mib, args.driver_memory)
    report["small"] = _run_small(args, workdir, intermediate)
    report["target_rows"] = rows = {
        name: table_rows(workdir / name / "target") for name in ("bench_one", "bench_cycles")
    }
    report["targets_agree"] = rows["bench_one"] == rows["bench_cycles"] and _small_bulk_agrees(workdir, rows)
    report["limit"] = _run_limit(args, workdir, intermediate, report["engine_one"]["target"])
    report["pertxn"] = _run_pertxn(args, workdir, intermediate, w["committed"])
    report["load_after"] = load_average()
    report["total_s"] = time.perf_counter() - started
    progress(f"load average after {report['load_after']}")
    (workdir / "report.json").write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    return report


def _small_bulk_agrees(workdir: Path, rows: dict[str, dict[str, int]]) -> bool:
    """Whether the small-cycle run's bulk left what the one-cycle run left (checked from its first checkpoint)."""
    # The small run's target has the small pairs applied on top; compare the tables the small pairs leave alone.
    small = table_rows(workdir / "bench_small" / "target")
    rows["bench_small (after the small pairs)"] = small
    untouched = [t for t in rows["bench_one"] if t not in ("shop.customers", "shop.events")]
    return all(small.get(t) == rows["bench_one"][t] for t in untouched) and small.get("shop.customers") == rows[
        "bench_one"
    ].get("shop.customers")


if __name__ == "__main__":
    sys.exit(main())
