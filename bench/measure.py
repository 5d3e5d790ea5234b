"""Running the benchmark's steps as measured subprocesses, and the facts about the machine they ran on.

Each step runs in a fresh process; a thread polls the summed VmRSS of that
process and all its descendants (the Python driver, its JVM and the PySpark
workers) and keeps the maximum.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import REPO, VENV_BIN, BenchError, progress


def spark_env() -> dict[str, str]:
    """The environment every Spark process of the benchmark runs with."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = str(VENV_BIN / "python")
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _children() -> dict[int, list[int]]:
    """Every running process's children, from ``/proc/<pid>/stat``."""
    kids: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        kids[int(fields[1])].append(int(entry.name))
    return kids


def _rss_kib(pid: int) -> int:
    """The VmRSS of one process in KiB; 0 once it has gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kib(root: int) -> int:
    """VmRSS summed over ``root`` and all its descendants, in KiB."""
    kids = _children()
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _rss_kib(pid)
        stack.extend(kids.get(pid, ()))
    return total


class TreeMemory:
    """Polls a process tree's summed VmRSS every 0.2 s and keeps the maximum."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval, self.peak_kib = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        """The polling thread: sample until stopped."""
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, tree_rss_kib(self.pid))
            self._stop.wait(self.interval)

    def stop(self) -> float:
        """Stop polling; the peak in MiB."""
        self._stop.set()
        self._thread.join()
        return self.peak_kib / 1024


def run_measured(cmd: list[str], log_path: Path, label: str) -> tuple[int, float, float]:
    """Run ``cmd`` with its output in ``log_path``; return (exit code, wall seconds, peak tree MiB)."""
    progress(f"{label}: {' '.join(cmd[1:])}")
    with open(log_path, "w", encoding="utf-8") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, env=spark_env(), stdout=log, stderr=subprocess.STDOUT)
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


def run_part(
    name: str, params: dict[str, Any], workdir: Path, module: str = "bench.apply_bench", part: str = ""
) -> dict[str, Any]:
    """Run one measurement in a fresh Python process (``python -m <module> --part``) and return its JSON result.

    ``name`` names its files in ``workdir``; ``part`` is the part to run when it is not ``name``.
    """
    params_path = workdir / f"part-{name}.params.json"
    result_path = workdir / f"part-{name}.result.json"
    log_path = workdir / f"part-{name}.log"
    params = {**params, "result": str(result_path), "spawned_at": time.time()}
    params_path.write_text(json.dumps(params, indent=1), encoding="utf-8")
    cmd = [sys.executable, "-m", module, "--part", part or name, "--part-params", str(params_path)]
    code, wall, peak = run_measured(cmd, log_path, name)
    if code != 0 or not result_path.exists():
        raise BenchError(f"part {name} failed (exit {code}); log {log_path}:\n{tail(log_path)}")
    result: dict[str, Any] = json.loads(result_path.read_text(encoding="utf-8"))
    result.update(process_wall_s=wall, process_peak_tree_mib=peak, log=str(log_path))
    return result


# ---------------------------------------------------------------------------
# The machine


def machine_facts() -> dict[str, Any]:
    """Cores, memory, CPU model and the versions that matter."""
    facts: dict[str, Any] = {"nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count()}
    try:
        meminfo = Path("/proc/meminfo").read_text(encoding="ascii")
        kib = {line.split(":")[0]: int(line.split()[1]) for line in meminfo.splitlines() if line.split()[1].isdigit()}
        facts["mem_total_gib"] = round(kib["MemTotal"] / 1024 / 1024, 1)
        facts["mem_available_gib"] = round(kib.get("MemAvailable", 0) / 1024 / 1024, 1)
    except (OSError, KeyError, IndexError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                facts["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts["kernel"] = platform.release()
    facts["python"] = platform.python_version()
    versions = {}
    for module in ("pyspark", "deltalake", "pyarrow"):
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
    """The commit the code under test is at, and whether the library has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "include", "bench"], cwd=REPO, capture_output=True, text=True
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    files = [line[3:] for line in changed if line.strip()]
    return f"{head}" + (f" plus uncommitted changes to {', '.join(files)}" if files else "")


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages."""
    return os.getloadavg()


def finish_benchmark(
    prog: str,
    args: Any,
    counts: tuple[str, ...],
    run: Callable[[Any, Path], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    parser: Any,
) -> int:
    """What each benchmark's ``main`` does once its arguments are parsed: check, run, write the report, tidy up.

    Args:
        prog: the benchmark's name, in error lines.
        args: the parsed arguments (``workdir``, ``out``, ``keep``, ``file_size_mb`` and the ``counts``).
        counts: argument names that must be at least 1 when given.
        run: runs the benchmark in the work folder and returns its results.
        render: the Markdown report of the results.
        parser: the argument parser, for usage errors.

    Returns:
        0 when every measurement ran, 1 when a step failed (the work folder is then kept).
    """
    for name in counts:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.file_size_mb > 0:
        parser.error("--file-size-mb must be positive")
    workdir = args.workdir.resolve()
    out = args.out.resolve() if args.out else None
    os.environ.update({k: spark_env()[k] for k in ("PATH", "PYSPARK_PYTHON", "SPARK_LOCAL_IP")})
    try:
        report = run(args, workdir)
    except BenchError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        print(f"{prog}: the work folder {workdir} is kept for inspection", file=sys.stderr)
        return 1
    text = render(report)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        progress(f"report written to {out}")
    else:
        print(text)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        progress(f"work folder kept: {workdir}")
    return 0
