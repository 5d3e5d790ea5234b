"""Running the benchmark's steps in measured child processes, the ``applier run``s, and the machine they ran on.

Every measurement runs in a fresh process: ``applier run`` itself, or
``python -m bench --part NAME`` for the parts the harness implements. A thread
polls the summed VmRSS of that process and all its descendants (the Python
driver, its JVM and the PySpark workers) every 0.2 s and keeps the maximum.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
VENV_BIN = REPO / ".venv" / "bin"
MIB = 1024 * 1024
SPARK_MASTER = "local[2]"

_T0 = time.perf_counter()


def progress(message: str) -> None:
    """One progress line on stdout, with the seconds since the benchmark started."""
    print(f"[{time.perf_counter() - _T0:8.1f}s] {message}", flush=True)


class BenchError(Exception):
    """A step of the benchmark failed (not a missed goal)."""


def spark_env() -> dict[str, str]:
    """The environment every process of the benchmark runs with."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = str(VENV_BIN / "python")
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def parent_pids() -> dict[int, int]:
    """pid -> parent pid of every process, from ``/proc``."""
    found: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as fh:
                    found[int(entry.name)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return found


def tree_rss_kib(root: int) -> int:
    """VmRSS summed over ``root`` and all its descendants (from ``/proc``), in KiB."""
    kids: dict[int, list[int]] = defaultdict(list)
    for pid, parent in parent_pids().items():
        kids[parent].append(pid)
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        stack.extend(kids.get(pid, ()))
        try:
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
                total += next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), 0)
        except OSError:
            pass  # it has gone
    return total


class TreeMemory:
    """Polls a process tree's summed VmRSS every ``interval`` seconds and keeps the maximum."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval, self.peak_kib = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, tree_rss_kib(self.pid))
            self._stop.wait(self.interval)

    def stop(self) -> float:
        """Stop polling; the peak in MiB."""
        self._stop.set()
        self._thread.join()
        return self.peak_kib / 1024


def _cpu_s(pid: int) -> float | None:
    """A process's own user and system CPU seconds so far (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return None


def _is_worker_daemon(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"org.apache.spark.deploy.worker.Worker" in fh.read()
    except OSError:
        return False


def _ignores_children(pid: int) -> bool:
    """Whether ``pid`` ignores ``SIGCHLD``: the kernel then reaps its children and discards their resource usage."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            ignored = next((int(line.split()[1], 16) for line in fh if line.startswith("SigIgn:")), 0)
    except (OSError, ValueError):
        return False
    return bool(ignored >> (signal.SIGCHLD - 1) & 1)


class TreeCpu:
    """Samples the CPU seconds of process trees every 0.2 s, until :meth:`stop`.

    ``series`` holds ``(time, CPU seconds)`` at each sample: every process seen
    so far at the last figure seen for it. The roots themselves count when
    ``with_roots`` (the driver), not otherwise (a worker daemon's own JVM is the
    cluster's, not the run's). Worker daemon JVMs never count. With
    ``unreaped_only``, only the processes whose parent ignores ``SIGCHLD``
    count: the kernel reaps those and drops their usage, so no ``wait4``
    counts them (PySpark's daemon ignores it, so its Python workers' CPU
    reaches no one).
    """

    def __init__(self, roots: list[int], *, with_roots: bool, unreaped_only: bool = False) -> None:
        self.roots, self.with_roots, self.unreaped_only = set(roots), with_roots, unreaped_only
        self.seen: dict[int, float] = {}
        self.series: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def add_root(self, pid: int) -> None:
        self.roots = self.roots | {pid}

    def _tree(self) -> set[int]:
        parent_of = parent_pids()
        roots = set(self.roots)
        found: set[int] = roots & set(parent_of) if self.with_roots else set()
        frontier = {pid for pid, parent in parent_of.items() if parent in roots}
        while frontier:
            found |= frontier
            frontier = {pid for pid, parent in parent_of.items() if parent in frontier and pid not in found}
        if self.unreaped_only:
            found = {pid for pid in found if pid in parent_of and _ignores_children(parent_of[pid])}
        return {pid for pid in found if not _is_worker_daemon(pid)}

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            for pid in self._tree():
                cpu = _cpu_s(pid)
                if cpu is not None:
                    self.seen[pid] = max(cpu, self.seen.get(pid, 0.0))
            self.series.append((time.time(), sum(self.seen.values())))

    def stop(self) -> float:
        """Stop sampling; the CPU seconds of every process seen."""
        self._stop.set()
        self._thread.join()
        return sum(self.seen.values())

    def between(self, start: float, end: float) -> float:
        """CPU seconds spent from ``start`` to ``end`` (UNIX times), interpolated between samples."""
        if not self.series:
            return 0.0
        times = [t for t, _ in self.series]
        totals = [c for _, c in self.series]
        return float(np.interp(end, times, totals) - np.interp(start, times, totals))


def run_measured(
    cmd: list[str], log_path: Path, label: str, env: dict[str, str] | None = None
) -> tuple[int, float, float]:
    """Run ``cmd`` with its output in ``log_path``; return (exit code, wall seconds, peak tree MiB)."""
    progress(f"{label}: {' '.join(cmd[1:])}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env or spark_env(), stdout=log, stderr=subprocess.STDOUT)
        memory = TreeMemory(proc.pid)
        code = proc.wait()
        wall = time.perf_counter() - started
    peak = memory.stop()
    progress(f"{label}: exit {code}, {wall:.1f} s, peak tree RSS {peak:.0f} MiB")
    return code, wall, peak


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log, for an error message; empty if it cannot be read."""
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_part(part: str, params: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run one part in a fresh Python process (``python -m bench --part``) and return its JSON result.

    Raises:
        BenchError: the part failed.
    """
    params_path, result_path = workdir / f"part-{part}.params.json", workdir / f"part-{part}.result.json"
    log_path = workdir / f"part-{part}.log"
    params_path.write_text(json.dumps({**params, "result": str(result_path), "spawned_at": time.time()}), "utf-8")
    cmd = [sys.executable, "-m", "bench", "--part", part, "--part-params", str(params_path)]
    code, wall, peak = run_measured(cmd, log_path, part)
    if code != 0 or not result_path.exists():
        raise BenchError(f"part {part} failed (exit {code}); log {log_path}:\n{tail(log_path)}")
    result: dict[str, Any] = json.loads(result_path.read_text(encoding="utf-8"))
    result.update(process_wall_s=wall, process_peak_tree_mib=peak)
    return result


# ---------------------------------------------------------------------------
# applier run


def applier_settings(
    workdir: Path, name: str, intermediate: Path, limit_mib: float, driver_memory: str, target: dict[str, Any]
) -> list[str]:
    """The ``--set`` overrides of one configuration (its files under ``workdir/name``).

    ``target`` holds the target's keys (``{"path": ...}`` or ``{"type": "postgres", "url": ...}``) and any
    ``apply.*`` keys to add (named with their prefix, e.g. ``{"apply.queue_memory_mb": 16}``).
    """
    keys = {k if k.startswith(("apply.", "errors.")) else f"target.{k}": v for k, v in target.items()}
    return [
        f"configuration_name={name}",
        f"intermediate_dir={intermediate}",
        f"output_dir={workdir / name / 'output'}",
        f"apply.process_intermediate_size_per_job={limit_mib}",
        "apply.max_cycles_per_run=0",
        f"spark.master={SPARK_MASTER}",
        f"spark.conf.spark.driver.memory={driver_memory}",
        *(f"{k}={v}" for k, v in keys.items()),
    ]


def write_config(path: Path, settings: list[str]) -> Path:
    """A YAML configuration file holding ``settings``, checked by the Applier's own loader."""
    import yaml

    from applier.config import load_config, parse_override

    raw: dict[str, Any] = {}
    for text in settings:
        key, value = parse_override(text)
        if key.startswith("spark.conf."):
            raw.setdefault("spark", {}).setdefault("conf", {})[key[len("spark.conf.") :]] = value
            continue
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    load_config(path)  # refuses a bad file now rather than in the subprocess
    return path


def read_cycles(path: Path) -> list[dict[str, Any]]:
    """The cycle reports of a run, one per line of ``cycles.jsonl``; none if the file is missing."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def summarize_cycles(cycles: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over a run's cycle reports (phases are whatever keys ``seconds`` holds), and each cycle's figures."""
    phases: dict[str, float] = defaultdict(float)
    net: dict[str, int] = defaultdict(int)
    held: dict[str, int] = defaultdict(int)
    spooled: dict[str, int] = defaultdict(int)
    for c in cycles:
        for key, value in c.get("seconds", {}).items():
            phases[key] += value
        for ops in c.get("net_rows", {}).values():
            for op, n in ops.items():
                net[op] += n
        queue = c.get("queue") or {}
        for kind, n in queue.get("memory_bytes", {}).items():
            held[kind] = max(held[kind], n)
        for kind, n in queue.get("spooled_bytes", {}).items():
            spooled[kind] += n
    queues = [c["queue"] for c in cycles if c.get("queue")]
    return {
        "cycles": len(cycles),
        **{k: sum(c.get(k, 0) for c in cycles) for k in ("rows_read", "committed", "rolled_back", "bytes")},
        "phases": dict(phases),
        "cycle_seconds": sum(phases.values()),
        "per_cycle": [
            {
                "s": round(sum(c.get("seconds", {}).values()), 3),
                "mib": round(c.get("bytes", 0) / MIB, 2),
                "committed": c.get("committed", 0),
                "rss": c.get("driver_peak_rss_mib", 0.0),
                "queue_peak_mib": round((c.get("queue") or {}).get("peak_bytes", 0) / MIB, 1),
            }
            for c in cycles
        ],
        "driver_peak_rss_mib": max((c.get("driver_peak_rss_mib", 0.0) for c in cycles), default=0.0),
        "driver_start_rss_mib": max((c.get("driver_start_rss_mib", 0.0) for c in cycles), default=0.0),
        "queue": {
            "budget_bytes": max((q.get("budget_bytes", 0) for q in queues), default=0),
            "peak_bytes": max((q.get("peak_bytes", 0) for q in queues), default=0),
            "memory_bytes": dict(held),
            "spooled_bytes": dict(spooled),
        },
        "net_rows": dict(net),
        "spilled": sum(len(c.get("spill_created", [])) for c in cycles),
        "load_batches": [c.get("load_batches", []) for c in cycles],
    }


def run_applier(workdir: Path, name: str, settings: list[str], extra_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """``applier run`` of the configuration ``settings`` in a fresh process; wall, tree memory and its cycles.

    Raises:
        BenchError: the run failed.
    """
    config = write_config(workdir / name / "config.yaml", settings)
    cmd = [sys.executable, "-m", "applier.cli", "run", "--config", str(config), *extra_args]
    log_path = workdir / name / "run.log"
    code, wall, peak = run_measured(cmd, log_path, f"applier run {name}")
    if code != 0:
        raise BenchError(f"applier run ({name}) exited {code}; log {log_path}:\n{tail(log_path)}")
    cycles = summarize_cycles(read_cycles(workdir / name / "output" / name / "cycles.jsonl"))
    result = {"name": name, "config": str(config), "wall_s": wall, "peak_tree_mib": peak, **cycles}
    result["rows_per_s"] = cycles["rows_read"] / wall if wall else 0.0
    phases = ", ".join(f"{k} {v:.1f}" for k, v in cycles["phases"].items())
    progress(f"{name}: {cycles['cycles']} cycles, {cycles['rows_read']} rows in {wall:.1f} s; phases {phases}")
    return result


def choose_cycle_limit(intermediate: Path, want: int = 6) -> tuple[float, int]:
    """A per-cycle limit in MiB giving about ``want`` cycles (4-8 if the pairs allow it), and its cycle count."""
    from applier.intermediate.pairs import list_pairs
    from applier.planner import plan_backlog

    pairs = list_pairs(intermediate).pairs
    total = sum(p.size for p in pairs)
    candidates = {round(total / n / MIB + 0.005, 2) for n in range(1, 41)}
    candidates |= {round(p.size / MIB + 0.005, 2) for p in pairs}
    counted = sorted((len(plan_backlog(pairs, 0, int(c * MIB))), c) for c in candidates if c > 0)
    in_range = [(abs(n - want), -c, n, c) for n, c in counted if 4 <= n <= 8]
    if in_range:
        _, _, n, c = min(in_range)
        return c, n
    n, c = max(counted)  # the most cycles the pairs allow (fewer than 4) or the fewest above 8
    return c, n


# ---------------------------------------------------------------------------
# The machine


def machine_facts() -> dict[str, Any]:
    """Cores, memory, CPU model, the versions that matter and the commit under test."""
    facts: dict[str, Any] = {"nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count()}
    try:
        meminfo = Path("/proc/meminfo").read_text(encoding="ascii").splitlines()
        kib = {line.split(":")[0]: int(line.split()[1]) for line in meminfo if line.split()[1].isdigit()}
        facts["mem_total_gib"] = round(kib["MemTotal"] / 1024 / 1024, 1)
        facts["mem_available_gib"] = round(kib.get("MemAvailable", 0) / 1024 / 1024, 1)
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
        facts["cpu_model"] = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, KeyError, IndexError, StopIteration):
        pass
    facts["kernel"], facts["python"] = platform.release(), platform.python_version()
    versions = {}
    for module in ("pyspark", "deltalake", "pyarrow", "psycopg"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:
            versions[module] = "?"
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, env=spark_env(), check=False)
        versions["java"] = (java.stderr or java.stdout).splitlines()[0].strip()
    except (OSError, IndexError):
        versions["java"] = "?"
    facts["versions"] = versions
    facts["git"] = git_state()
    return facts


def git_state() -> str:
    """The commit the code under test is at, and whether the library or bench/ has uncommitted changes."""
    try:
        git = ["git", "-C", str(REPO)]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        changed = subprocess.run(
            [*git, "status", "--porcelain", "--", "include", "bench"], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    files = [line[3:] for line in changed.stdout.split("\n") if line.strip()]
    return head.stdout.strip() + (f" plus uncommitted changes to {', '.join(files)}" if files else "")


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages."""
    return os.getloadavg()
