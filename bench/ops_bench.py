"""The ``ops`` step: what an operator waits for: validating the demo load, and each fast failure.

Validation of the demo load (``applier generate --seed 1``, applied by one
``applier run``) is timed twice from the command line, each a fresh process:
in memory (the default for tables under ``validate.in_memory_max_rows``) and
through Spark (``validate.in_memory_max_rows=0``, every table as before).

Each failure an operator meets (issue 15) is timed three times (the median is
reported) with its exit code and how many lines it wrote to stderr: one line,
never a traceback, and under 3 s for those that need no Spark.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.measure import REPO, BenchError, progress, run_measured, spark_env, write_config
from bench.report import Add, para, table

REPEATS = 3


def _applier(*args: str) -> list[str]:
    return [sys.executable, "-m", "applier.cli", *args]


def _timed(command: list[str] | str, label: str) -> dict[str, Any]:
    """Run ``command`` REPEATS times: its exit code, median wall seconds and stderr lines (of the last run)."""
    walls, done = [], None
    for _ in range(REPEATS):
        started = time.perf_counter()
        done = subprocess.run(
            command, cwd=REPO, env=spark_env(), capture_output=True, text=True, shell=isinstance(command, str),
            check=False,
        )  # fmt: skip
        walls.append(time.perf_counter() - started)
    assert done is not None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    flagged = [line for line in done.stdout.splitlines() if "refused" in line.lower()]  # plan and status, exit 0
    said = (lines or flagged or [""])[0][:160]
    result = {"code": done.returncode, "wall_s": statistics.median(walls), "stderr_lines": len(lines),
              "first_line": said, "traceback": "Traceback" in done.stderr}  # fmt: skip
    progress(f"{label}: exit {done.returncode}, {result['wall_s']:.2f} s, {len(lines)} stderr lines")
    return result


def step_ops(b: Any) -> None:
    """Validation of the demo load in memory and through Spark; the fast failures' times."""
    folder = b.workdir / "ops"
    intermediate = folder / "intermediate"
    generated = subprocess.run(
        _applier("generate", "--out", str(intermediate), "--seed", "1"), cwd=REPO, env=spark_env(),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if generated.returncode != 0:
        raise BenchError(f"applier generate failed: {generated.stderr[-2000:]}")
    settings = [f"intermediate_dir={intermediate}", f"output_dir={folder / 'out'}", f"target.path={folder / 'target'}",
                "configuration_name=ops"]  # fmt: skip
    config = write_config(folder / "ops.yaml", settings)
    code, wall, peak = run_measured(_applier("run", "--config", str(config)), folder / "run.log", "applier run (demo)")
    if code != 0:
        raise BenchError(f"applier run exited {code}; log {folder / 'run.log'}")
    validation: dict[str, Any] = {"run_s": wall, "run_peak_mib": peak}
    for name, extra in (("in memory", []), ("Spark", ["--set", "validate.in_memory_max_rows=0"])):
        cmd = _applier("validate", "--config", str(config), *extra)
        code, wall, peak = run_measured(cmd, folder / f"validate-{name.replace(' ', '-')}.log", f"validate ({name})")
        if code != 0:
            raise BenchError(f"applier validate ({name}) exited {code}")
        validation[name] = {"wall_s": wall, "peak_mib": peak}

    failures: dict[str, dict[str, Any]] = {}
    missing = write_config(folder / "missing.yaml", [f"intermediate_dir={folder / 'nowhere'}",
                                                    f"output_dir={folder / 'out2'}", f"target.path={folder / 't2'}",
                                                    "configuration_name=ops"])  # fmt: skip
    for command in ("run", "plan", "status"):
        failures[f"`{command}`, missing `intermediate_dir`"] = _timed(
            _applier(command, "--config", str(missing)), f"{command}, missing folder"
        )
    wrong_db = ["--set", "target.type=postgres", "--set", "target.url=host=127.0.0.1 user=postgres dbname=cdc_no_such"]
    failures["`run`, wrong PostgreSQL database"] = _timed(
        _applier("run", "--config", str(config), *wrong_db), "run, wrong database"
    )
    failures["`validate --table`, unknown table"] = _timed(
        _applier("validate", "--config", str(config), "--table", "shop.nope"), "validate, unknown table"
    )
    failures["`run`, nothing to do"] = _timed(_applier("run", "--config", str(config)), "run, nothing to do")
    cut = folder / "cut"
    shutil.copytree(intermediate, cut)
    dat = cut / "000000000001.dat"
    dat.write_bytes(dat.read_bytes()[: dat.stat().st_size // 2])
    cut_settings = [f"intermediate_dir={cut}", f"output_dir={folder / 'out3'}", f"target.path={folder / 't3'}",
                    "configuration_name=ops"]  # fmt: skip
    cut_config = write_config(folder / "cut.yaml", cut_settings)
    for command in ("run", "plan", "status"):
        failures[f"`{command}`, a `.dat` cut in half"] = _timed(
            _applier(command, "--config", str(cut_config)), f"{command}, cut .dat"
        )
    pipe = f"{sys.executable} -m applier.cli status --config {config} | head -n 0"
    failures["`status` piped into `head -n 0`"] = _timed(pipe, "status into head")
    b.r["ops"] = {"validation": validation, "failures": failures}


def section(r: dict[str, Any], add: Add) -> None:
    """The report's section of the ``ops`` step (left out when it did not run)."""
    if not (ops := r.get("ops")):
        return
    v = ops["validation"]
    memory, spark = v["in memory"], v["Spark"]
    add("## What an operator waits for: validation and failures")
    add("")
    para(
        add,
        "**Validating the demo load** (`applier generate --seed 1`, six tables, applied by one `applier run` in ",
        f"{v['run_s']:.1f} s), `applier validate` from the command line, each a fresh process: ",
        f"**{memory['wall_s']:.1f} s in memory** (Arrow and Great Expectations' pandas engine, no JVM; peak ",
        f"{memory['peak_mib']:.0f} MiB) against ",
        f"**{spark['wall_s']:.1f} s through Spark** (`--set validate.in_memory_max_rows=0`, how every table was ",
        f"validated before; peak {spark['peak_mib']:.0f} MiB): {spark['wall_s'] / memory['wall_s']:.1f}x.",
    )
    add("")
    para(
        add,
        f"**Failures**, each the median of {REPEATS} runs of the command line on the demo configuration, damaged as ",
        "named; the bound is 3 s for a failure that needs no Spark, and every error is one line without a traceback ",
        "(*what it says*: its stderr line, or for `plan` and `status` the line that flags the pair).",
    )
    add("")
    rows = [
        [name, str(f["code"]), f"{f['wall_s']:.2f}", str(f["stderr_lines"]), "no" if f["traceback"] else "yes",
         "yes" if f["wall_s"] < 3 else "**no**", f"`{f['first_line']}`" if f["first_line"] else ""]
        for name, f in ops["failures"].items()
    ]  # fmt: skip
    table(add, ["failure", "exit", "s", "stderr lines", "no traceback", "under 3 s", "what it says"], rows)
