"""Issue 16's scale-out step: the engine on a Spark standalone cluster of two workers on loopback.

A master and ``--scaleout-workers`` (2) workers of one core each are started
on 127.0.0.1 with the venv's ``spark-class``; ``applier run`` applies the
narrow workload, then one with ``--scaleout-factor`` (4) times its
transactions, each in one cycle, with ``spark.master`` the cluster. Measured:

- the **driver's** CPU seconds: the ``applier run`` process tree (the Python
  driver and the driver JVM it starts), counted by the kernel when each is
  reaped (:func:`bench.duckdb_bench.run_tree`);
- the **executors'** CPU seconds: every process under a worker daemon
  (executor JVMs and their Python workers), sampled from ``/proc`` every 0.2 s
  while the run lasts, each process at the last figure seen (a process's last
  0.2 s before it ends can be missed: the share errs towards the driver);
- the driver's peak memory (summed VmRSS of its tree, and the Python driver's
  own peak from ``cycles.jsonl``).

The cluster is stopped at the end of the step, also when it fails.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.duckdb_bench import run_tree
from bench.measure import (
    MIB,
    BenchError,
    TreeCpu,
    progress,
    read_cycles,
    spark_env,
    summarize_cycles,
    tail,
    write_config,
)

if TYPE_CHECKING:
    from bench.report import Add
    from bench.steps import Bench

GOAL_DRIVER_SHARE = 0.10  # issue 16: the driver at most 10% of a cycle's CPU seconds
GOAL_MEMORY_RATIO = 1.25  # issue 16: the driver's peak independent of the cycle's size (a fifth for noise)
STARTUP_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            data: dict[str, Any] = json.load(response)
            return data
    except (OSError, ValueError):
        return {}


@contextmanager
def standalone_cluster(folder: Path, workers: int) -> Iterator[tuple[str, list[int]]]:
    """A master and ``workers`` one-core workers on loopback: ``(master URL, the workers' daemon pids)``."""
    folder.mkdir(parents=True, exist_ok=True)
    properties = folder / "spark-defaults.conf"
    properties.write_text("spark.master.rest.enabled false\n", encoding="utf-8")
    spark_class = str(Path(sys.executable).parent / "spark-class")
    env = {**spark_env(), "SPARK_DAEMON_MEMORY": "512m"}
    port, ui = _free_port(), _free_port()
    status_url = f"http://127.0.0.1:{ui}/json/"
    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(folder / log, "wb") as out:
            proc = subprocess.Popen([spark_class, *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # fmt: skip
        procs.append(proc)
        return proc

    def wait(what: str, ready: Any) -> None:
        deadline = time.monotonic() + STARTUP_S
        while not ready(_status(status_url)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise BenchError(f"the Spark cluster was not {what}; logs in {folder}:\n{tail(folder / 'master.log')}")
            time.sleep(1)

    try:
        start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
               "--webui-port", str(ui), "--properties-file", str(properties)], "master.log")  # fmt: skip
        wait("alive", lambda s: s.get("status") == "ALIVE")
        master = f"spark://127.0.0.1:{port}"
        for i in range(workers):
            start(["org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1", "--cores", "1",
                   "--memory", "2g", "--webui-port", str(_free_port()), "--work-dir", str(folder / f"work{i}"),
                   "--properties-file", str(properties)], f"worker{i}.log")  # fmt: skip
        wait(f"given its {workers} workers", lambda s: s.get("aliveworkers") == workers)
        progress(f"standalone cluster at {master} with {workers} workers")
        yield master, [p.pid for p in procs[1:]]
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)


def _run(b: Bench, name: str, settings: list[str], master: str, workers: list[int]) -> dict[str, Any]:
    """``applier run`` of ``settings`` (the bench's, for a local master) on the cluster ``master``: CPU and memory."""
    settings = [s for s in settings if not s.startswith("spark.master=")]
    settings += [f"spark.master={master}", "spark.conf.spark.executor.memory=1500m"]
    config = write_config(b.workdir / name / "config.yaml", settings)
    executors, driver = TreeCpu(workers, with_roots=False), TreeCpu([], with_roots=True)
    try:
        cmd = [sys.executable, "-m", "applier.cli", "run", "--config", str(config)]
        run = run_tree(cmd, b.workdir / name / "run.log", f"applier run {name}", on_start=driver.add_root)
    finally:
        executors_cpu = executors.stop()
        # The driver's tree as sampled, not run_tree's count: an executor's Python workers outlive its JVM
        # when the application ends, are reparented to this process (run_tree's subreaper) and were counted
        # there as the driver's (21.8 CPU s of the 4x run's, once).
        driver_cpu = driver.stop()
    run["cpu_s"] = driver_cpu
    if run["code"] != 0:
        raise BenchError(f"applier run ({name}) exited {run['code']}; log {b.workdir / name / 'run.log'}:\n"
                         f"{tail(b.workdir / name / 'run.log')}")  # fmt: skip
    reports = read_cycles(b.workdir / name / "output" / name / "cycles.jsonl")
    cycles = summarize_cycles(reports)
    share = run["cpu_s"] / (run["cpu_s"] + executors_cpu) if executors_cpu else 1.0
    per_cycle = [_cycle_cpu(report, driver, executors) for report in reports]
    later = ", ".join(f"{c['share']:.0%}" for c in per_cycle)
    progress(f"{name}: driver CPU {run['cpu_s']:.1f} s, executors {executors_cpu:.1f} s: driver share {share:.0%}; "
             f"per cycle {later}")  # fmt: skip
    keep = ("cycles", "rows_read", "committed", "cycle_seconds", "phases", "driver_peak_rss_mib")
    return {
        **run,
        "executors_cpu_s": executors_cpu,
        "driver_share": share,
        "per_cycle_cpu": per_cycle,
        **{k: cycles[k] for k in keep},
    }


def _cycle_cpu(report: dict[str, Any], driver: TreeCpu, executors: TreeCpu) -> dict[str, Any]:
    """The driver's and the executors' CPU seconds from the cycle's start to its end (its report's times)."""
    start = dt.datetime.fromisoformat(report["started_at"]).timestamp()
    end = dt.datetime.fromisoformat(report["ended_at"]).timestamp()
    mine, theirs = driver.between(start, end), executors.between(start, end)
    return {
        "cycle": report["cycle_id"],
        "rows_read": report["rows_read"],
        "seconds": end - start,
        "driver_cpu_s": mine,
        "executors_cpu_s": theirs,
        "share": mine / (mine + theirs) if mine + theirs else 1.0,
    }


def steady_share(run: dict[str, Any]) -> float | None:
    """The driver's share of the CPU over a run's cycles after the first (which starts the Spark application)."""
    later = run["per_cycle_cpu"][1:]
    mine = sum(c["driver_cpu_s"] for c in later)
    total = mine + sum(c["executors_cpu_s"] for c in later)
    return mine / total if total else None


def step_scaleout(b: Bench) -> None:
    """The narrow workload and a ``--scaleout-factor`` times larger one, each in one cycle on the cluster.

    Then the larger one in ``--scaleout-factor`` cycles, each about the narrow
    workload's size, in one application: its cycles after the first measure the
    driver's share of a cycle's CPU once the application has started.
    """
    keys = ("narrow", "narrow-x")
    for key in keys:
        b.workload(key)
    limit_mib = round(b.r["workloads"]["narrow"]["bytes"] / MIB + 0.01, 2)  # cycles of the narrow one's size
    with standalone_cluster(b.workdir / "cluster", b.args.scaleout_workers) as (master, workers):
        runs = {}
        for key in keys:
            name = f"scaleout_{key.replace('-', '_')}"
            runs[key] = _run(b, name, b.delta(name, key), master, workers)
        name = "scaleout_narrow_x_cycles"
        runs["narrow-x-cycles"] = _run(b, name, b.delta(name, "narrow-x", limit_mib), master, workers)
        name = "scaleout_narrow_x_pg_cycles"
        url = b.dbs.create(name)
        runs["narrow-x-pg-cycles"] = _run(b, name, b.postgres(name, url, limit_mib, "narrow-x"), master, workers)
        b.dbs.drop(url)
    b.r["scaleout"] = {"workers": b.args.scaleout_workers, "factor": b.args.scaleout_factor, "runs": runs,
                       "limit_mib": limit_mib}  # fmt: skip


# ---------------------------------------------------------------------------
# The report


def goal_rows(r: dict[str, Any]) -> list[list[str]]:
    """The driver's CPU share per cycle, and its peak memory at the two sizes."""
    if "scaleout" not in r:
        return []
    s = r["scaleout"]
    small, large = s["runs"]["narrow"], s["runs"]["narrow-x"]
    goal = f"on a standalone cluster of {s['workers']} workers, the driver at most {GOAL_DRIVER_SHARE:.0%} of the CPU"
    goal += " seconds per cycle"
    whole = f"whole runs of one cycle, the application's start included: {small['driver_share']:.0%} and "
    whole += f"{large['driver_share']:.0%}"
    cycled = s["runs"].get("narrow-x-cycles")
    steady = steady_share(cycled) if cycled else None
    if steady is None:  # a report of a run from before the step measured cycles
        worst = max(small["driver_share"], large["driver_share"])
        rows = [[goal, whole, "**met**" if worst <= GOAL_DRIVER_SHARE else "**not met**"]]
    else:
        n = len(cycled["per_cycle_cpu"])
        got = f"**{steady:.0%}** in cycles 2-{n} of the {s['factor']}x workload in {n} cycles of one application "
        got += f"({cycled['rows_read'] / n:,.0f} changes a cycle); {whole}"
        rows = [[goal, got, "**met**" if steady <= GOAL_DRIVER_SHARE else "**not met**"]]
    ratio = large["peak_tree_mib"] / small["peak_tree_mib"]
    got = f"{small['peak_tree_mib']:,.0f} and {large['peak_tree_mib']:,.0f} MiB: **{ratio:.2f}x** for "
    got += f"{large['rows_read'] / small['rows_read']:.1f}x the changes"
    verdict = "**met**" if ratio <= GOAL_MEMORY_RATIO else "**not met**"
    rows.append(["the driver's peak memory independent of the cycle's size", got, verdict])
    return rows


def section(r: dict[str, Any], add: Add) -> None:
    """Each scale-out run's figures, and each cycle's CPU."""
    from bench.report import para, table

    if "scaleout" not in r:
        return
    s = r["scaleout"]
    add(f"## Scale-out: a standalone cluster of {s['workers']} one-core workers (issue 16)")
    add("")
    rows, cycles = [], []
    for key, x in s["runs"].items():
        rows.append([key, f"{x['cycles']}", f"{x['rows_read']:,}", f"{x['wall_s']:.1f}", f"{x['cpu_s']:.1f}"])
        rows[-1] += [f"{x['executors_cpu_s']:.1f}", f"{x['driver_share']:.0%}", f"{x['peak_tree_mib']:,.0f}"]
        rows[-1] += [f"{x['driver_peak_rss_mib']:,.0f}", ", ".join(f"{k} {v:.1f}" for k, v in x["phases"].items())]
        for c in x.get("per_cycle_cpu", []):
            cycles.append([key, f"{c['cycle']}", f"{c['rows_read']:,}", f"{c['seconds']:.1f}"])
            cycles[-1] += [f"{c['driver_cpu_s']:.1f}", f"{c['executors_cpu_s']:.1f}", f"{c['share']:.0%}"]
    head = ["workload", "cycles", "changes", "wall s", "driver CPU s", "executors CPU s", "driver share"]
    head += ["driver tree peak MiB", "Python driver peak MiB", "seconds per phase"]
    table(add, head, rows, right=1, text=9)
    para(
        add,
        "The driver's CPU is the `applier run` process tree (Python and the driver JVM, JVM start included), the ",
        "executors' every process under the worker daemons (sampled every 0.2 s), so the share counts the whole run. ",
        f"`narrow-x-cycles` applies the {s['factor']}x workload in cycles of at most {s.get('limit_mib', 0):.2f} MiB ",
        "of pairs in one application; `narrow-x-pg-cycles` applies the same cycles into a PostgreSQL database, ",
        "each cycle in parts (its compilable groups, one transaction each): the executors compile, a part whose ",
        "changes weigh `apply.executor_write_mb` (4 MiB) or more is COPYed into staging by the executors, a smaller ",
        "one by the driver, and the driver runs each part's transaction, whose set-wise apply is the PostgreSQL ",
        "server's CPU, counted on neither side. ",
        "Intermediate files, spill files and the Delta target are on the one machine's disk, which the driver and ",
        "executors share.",
    )
    if cycles:
        para(
            add,
            "Each cycle, from its report's start to its end (both trees sampled every 0.2 s; the first cycle of a ",
            "run starts the Spark application: the driver's JVM, the executors and their Python workers):",
        )
        head = ["run", "cycle", "changes", "wall s", "driver CPU s", "executors CPU s", "driver share"]
        table(add, head, cycles, right=1)
