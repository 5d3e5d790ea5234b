"""The ``duckdb`` step (issue 16): the engine end to end against a single-process DuckDB apply of the same pairs.

On the narrow workload, each round runs ``applier run`` (one cycle, a fresh
process: interpreter, JVM start and shutdown included) and
``python -m bench.duckdb_apply`` (:mod:`bench.duckdb_apply`), each into a new
target, back to back, the order alternating between rounds. Each is measured
as a process tree: wall seconds until it exits, CPU seconds of every process in
it (:func:`run_tree`) and the peak of their summed VmRSS. Then every table of
the two targets is compared, rows as multisets and types; a difference fails
the step. The report shows each round and marks the issue's goal (the engine
within 3x of the baseline) on the best wall time of each side.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from bench.measure import (
    REPO,
    BenchError,
    TreeCpu,
    TreeMemory,
    parent_pids,
    progress,
    read_cycles,
    spark_env,
    summarize_cycles,
    tail,
    write_config,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from bench.report import Add
    from bench.steps import Bench

GOAL_RATIO = 3.0  # issue 16: the engine end to end within 3x of a single-process DuckDB apply
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
ORPHANS_WAIT_S = 120.0


def _subreaper(on: bool) -> None:
    """Make this process the reaper of its orphaned descendants (or stop being it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl(PR_SET_CHILD_SUBREAPER, {int(on)}) failed")


def _children() -> set[int]:
    """The processes whose parent is this one (zombies included), from ``/proc``."""
    me = os.getpid()
    return {pid for pid, parent in parent_pids().items() if parent == me}


def _reap_orphans(before: set[int], sampled: Collection[int] = ()) -> float:
    """Wait for the descendants reparented to this process (not its children ``before``); their CPU seconds.

    Those still running after :data:`ORPHANS_WAIT_S` are killed, then reaped.
    Those in ``sampled`` are reaped but not counted: their CPU was sampled.
    """
    cpu, deadline = 0.0, time.perf_counter() + ORPHANS_WAIT_S
    while orphans := _children() - before:
        for pid in orphans:
            if time.perf_counter() > deadline:
                os.kill(pid, signal.SIGKILL)
            try:
                done, _, usage = os.wait4(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if done and pid not in sampled:
                cpu += usage.ru_utime + usage.ru_stime
        time.sleep(0.05)
    return cpu


def run_tree(
    cmd: list[str], log_path: Path, label: str, on_start: Callable[[int], object] | None = None
) -> dict[str, Any]:
    """Run ``cmd`` (output in ``log_path``): exit code, wall s, CPU s, peak summed VmRSS (MiB) of its tree, load.

    ``on_start`` is called with the command's pid as soon as it runs.

    CPU seconds come from the kernel's accounting of each process when it is
    reaped (``wait4``), which includes the descendants it reaped itself. Some
    are not reaped by their parent: Spark's JVM outlives the Python driver that
    started it. So this process is a child subreaper while the command runs:
    such orphans are reparented here, waited for and counted too. And some
    are reaped by no one: PySpark's daemon ignores ``SIGCHLD``, so the kernel
    drops its Python workers' usage as they end; those are sampled from
    ``/proc`` every 0.2 s instead (:class:`~bench.measure.TreeCpu`, each at
    the last figure seen). Wall time ends when ``cmd`` exits.
    """
    progress(f"{label}: {' '.join(cmd[1:])}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    before = _children()
    _subreaper(True)
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            started = time.perf_counter()
            proc = subprocess.Popen(cmd, cwd=REPO, env=spark_env(), stdout=log, stderr=subprocess.STDOUT)
            memory, unreaped = TreeMemory(proc.pid), TreeCpu([proc.pid], with_roots=False, unreaped_only=True)
            if on_start is not None:
                on_start(proc.pid)
            _, raw, usage = os.wait4(proc.pid, 0)  # not Popen.wait(): it would reap without the usage
            wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(raw)
        peak = memory.stop()
        orphans = _reap_orphans(before, unreaped.seen)
        cpu = usage.ru_utime + usage.ru_stime + orphans + unreaped.stop()
    finally:
        _subreaper(False)
    progress(f"{label}: exit {proc.returncode}, {wall:.1f} s, CPU {cpu:.1f} s, peak tree RSS {peak:.0f} MiB")
    return {"code": proc.returncode, "wall_s": wall, "cpu_s": cpu, "peak_tree_mib": peak, "load_before": load}


# ---------------------------------------------------------------------------
# Comparing two targets


def delta_tables(root: Path) -> dict[str, pa.Table]:
    """Every Delta table under a target root (``<schema>/<table>`` folders; ``_`` folders are the Applier's)."""
    from deltalake import DeltaTable

    return {
        f"{schema.name}.{table.name}": DeltaTable(str(table)).to_pyarrow_table()
        for schema in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("_"))
        for table in sorted(p for p in schema.iterdir() if p.is_dir())
        if DeltaTable.is_deltatable(str(table))
    }


def sorted_rows(table: pa.Table) -> pa.Table:
    """``table``'s rows in one order of all columns, NaN made comparable (Arrow's equality holds NaN != NaN).

    Each floating-point column becomes its NaN flag and its value with NaN as 0.
    """
    columns: dict[str, pa.ChunkedArray] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_floating(column.type):
            nan = pc.is_nan(column)
            columns[f"{name} is NaN"] = nan
            column = pc.if_else(nan, pa.scalar(0.0, column.type), column)
        columns[name] = column
    flat = pa.table(columns)
    return flat.sort_by([(name, "ascending") for name in flat.column_names]) if flat.num_columns else flat


def compare_targets(engine: Path, baseline: Path) -> dict[str, str]:
    """Per table, ``same`` or what differs between two targets (a table absent on one side must be empty)."""
    ours, theirs = delta_tables(engine), delta_tables(baseline)
    verdicts = {}
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name), theirs.get(name)
        if a is None or b is None:
            rows = (b if a is None else a).num_rows  # type: ignore[union-attr]
            absent = "the engine" if a is None else "the baseline"
            verdicts[name] = f"same (empty, absent from {absent})" if not rows else f"absent from {absent}: {rows} rows"
        elif not a.schema.equals(b.schema):
            verdicts[name] = f"columns differ: engine {a.schema.to_string(show_schema_metadata=False)!r}, " + (
                f"baseline {b.schema.to_string(show_schema_metadata=False)!r}"
            )
        elif a.num_rows != b.num_rows:
            verdicts[name] = f"engine {a.num_rows:,} rows, baseline {b.num_rows:,}"
        else:
            same = sorted_rows(a).equals(sorted_rows(b))
            verdicts[name] = "same" if same else f"same count ({a.num_rows:,}), different rows"
    return verdicts


# ---------------------------------------------------------------------------
# The step


def _engine(b: Bench, name: str) -> dict[str, Any]:
    """One ``applier run`` of the narrow workload in one cycle, measured as a tree."""
    config = write_config(b.workdir / name / "config.yaml", b.delta(name, "narrow"))
    cmd = [sys.executable, "-m", "applier.cli", "run", "--config", str(config)]
    run = run_tree(cmd, b.workdir / name / "run.log", f"applier run {name}")
    if run["code"] != 0:
        raise BenchError(f"applier run ({name}) exited {run['code']}; log {b.workdir / name / 'run.log'}:\n"
                         f"{tail(b.workdir / name / 'run.log')}")  # fmt: skip
    cycles = summarize_cycles(read_cycles(b.workdir / name / "output" / name / "cycles.jsonl"))
    keep = ("cycles", "rows_read", "committed", "cycle_seconds", "phases", "driver_peak_rss_mib")
    return {**run, **{k: cycles[k] for k in keep}, "target": str(b.workdir / name / "target")}


def _baseline(b: Bench, name: str) -> dict[str, Any]:
    """One ``python -m bench.duckdb_apply`` of the narrow workload, measured as a tree."""
    folder, target = b.workdir / name, b.workdir / name / "target"
    cmd = [sys.executable, "-m", "bench.duckdb_apply", str(b.workload("narrow")), str(target)]
    run = run_tree([*cmd, "--result", str(folder / "result.json")], folder / "run.log", name)
    if run["code"] != 0:
        raise BenchError(f"the DuckDB baseline ({name}) exited {run['code']}; log {folder / 'run.log'}:\n"
                         f"{tail(folder / 'run.log')}")  # fmt: skip
    return {**run, **json.loads((folder / "result.json").read_text(encoding="utf-8")), "target": str(target)}


def step_duckdb(b: Bench) -> None:
    """``--duckdb-rounds`` rounds of the engine and the DuckDB baseline, back to back; both must leave the same rows.

    Raises:
        BenchError: a run failed, or the two targets differ (named table by table).
    """
    b.workload("narrow")
    rounds = []
    for i in range(1, b.args.duckdb_rounds + 1):
        sides = ("engine", "duckdb") if i % 2 else ("duckdb", "engine")
        done = {s: (_engine if s == "engine" else _baseline)(b, f"duckdb_{s}{i}") for s in sides}
        verdicts = compare_targets(Path(done["engine"]["target"]), Path(done["duckdb"]["target"]))
        differ = {t: v for t, v in verdicts.items() if not v.startswith("same")}
        if differ:
            raise BenchError(
                f"round {i}: the engine and the DuckDB baseline left different tables: "
                + "; ".join(f"{t}: {v}" for t, v in differ.items())
            )
        progress(f"round {i}: both left the same rows in {len(verdicts)} tables")
        rounds.append({"first": sides[0], **done, "tables": verdicts})
    b.r["duckdb"] = {"rounds": rounds}


# ---------------------------------------------------------------------------
# The report


def best(r: dict[str, Any], side: str) -> dict[str, Any]:
    """The round with the side's shortest wall time (the least disturbed by the machine's other work)."""
    return min((x[side] for x in r["duckdb"]["rounds"]), key=lambda run: run["wall_s"])


def goal_row(r: dict[str, Any]) -> list[str]:
    """The goal's line: the engine's best wall time against the baseline's."""
    engine, duck = best(r, "engine"), best(r, "duckdb")
    ratio = engine["wall_s"] / duck["wall_s"]
    got = f"{engine['wall_s']:.1f} / {duck['wall_s']:.1f} = **{ratio:.1f}x** (CPU "
    got += f"{engine['cpu_s'] / duck['cpu_s']:.1f}x, memory {engine['peak_tree_mib'] / duck['peak_tree_mib']:.1f}x)"
    verdict = "**met**" if ratio <= GOAL_RATIO else "**not met**"
    return [f"engine (Delta) end to end within {GOAL_RATIO:g}x of a single-process DuckDB apply", got, verdict]


def section(r: dict[str, Any], add: Add) -> None:
    """The engine against the DuckDB baseline: each round's figures, the tables compared."""
    from bench.report import para, table

    if "duckdb" not in r:
        return
    rounds, n = r["duckdb"]["rounds"], r["workloads"]["narrow"]["changes"]
    add("## The engine against a single-process DuckDB apply (issue 16)")
    add("")
    rows = []
    for i, x in enumerate(rounds, 1):
        for side, label in (("engine", "`applier run`, 1 cycle"), ("duckdb", "DuckDB baseline")):
            run = x[side]
            rows.append([f"{i} ({x['first']} first)", label, f"{run['wall_s']:.1f}", f"{run['cpu_s']:.1f}"])
            load = f"{run['load_before']:.1f}" if "load_before" in run else "?"
            rows[-1] += [f"{run['peak_tree_mib']:,.0f}", f"{n / run['wall_s']:,.0f}", load]
    head = ["round", "approach", "wall s", "CPU s (process tree)", "peak MiB (process tree)", "changes / s"]
    head.append("load average (1 min) at its start")
    table(add, head, rows, right=2)
    engine, duck = best(r, "engine"), best(r, "duckdb")
    phases = ", ".join(f"{k} {v:.1f}" for k, v in engine["phases"].items())
    mine = ", ".join(f"{k} {v:.1f}" for k, v in duck["seconds"].items())
    para(
        add,
        f"Best of {len(rounds)}: engine {engine['wall_s']:.1f} s ({engine['cycle_seconds']:.1f} s inside its cycle: ",
        f"{phases}), DuckDB {duck['wall_s']:.1f} s ({mine}; DuckDB {duck['duckdb']}, {duck['changes_kept']:,} ",
        f"committed changes kept): **{engine['wall_s'] / duck['wall_s']:.1f}x** the wall time, ",
        f"{engine['cpu_s'] / duck['cpu_s']:.1f}x the CPU, {engine['peak_tree_mib'] / duck['peak_tree_mib']:.1f}x the ",
        f"memory; goal {GOAL_RATIO:g}x. What the baseline skips: the docstring of `bench/duckdb_apply.py`.",
    )
    tables = rounds[-1]["tables"]
    para(
        add,
        f"Every round, both left the same rows (sorted, as multisets) and column types in all {len(tables)} tables: ",
        ", ".join(f"{t} {duck['rows'].get(t, 0):,} rows" for t in tables),
        ".",
    )
