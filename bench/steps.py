"""The benchmark's steps, in order: what each measures, in which child processes, into the results.

Each step reads and writes one results dict (saved as ``report.json`` in the
work folder) that :func:`bench.report.render` turns into Markdown. Every
measurement runs in a fresh process (:mod:`bench.measure`). A step that needs
another's result brings it in (:data:`NEEDS`): ``limit`` reads ``narrow``'s
target, ``wide`` is compared with ``narrow``, and the PostgreSQL steps after
``pg-compiled`` read its database. The benchmark's PostgreSQL databases are
dropped at the end, also when a step fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.duckdb_bench import step_duckdb
from bench.measure import (
    BenchError,
    applier_settings,
    choose_cycle_limit,
    load_average,
    machine_facts,
    progress,
    run_applier,
    run_part,
    spark_env,
    tail,
    write_config,
)
from bench.pg_server import Databases, fingerprints
from bench.scaleout import step_scaleout
from bench.workload import (
    generate,
    latest_table_defs,
    prepare_workdir,
    write_run_length_pairs,
)

GROUPS = {
    "delta": ("narrow", "limit", "pertxn", "small", "duckdb"),
    "memory": ("wide", "many-open", "run-length"),
    "pg": ("pg-compiled", "pg-limit", "pg-pertxn", "pg-rowbyrow"),
    "scale": ("scaleout",),
}
ORDER = tuple(step for steps in GROUPS.values() for step in steps)
NEEDS = {
    "limit": ("narrow",),
    "wide": ("narrow",),
    "pg-limit": ("pg-compiled",),
}
RUN_KEY = "bench-run-length"


def selected_steps(text: str) -> list[str]:
    """The steps named by ``--steps`` (step and group names), with the steps they need, in the harness's order."""
    chosen: set[str] = set()
    for word in (w.strip() for w in text.split(",") if w.strip()):
        if word not in (*ORDER, *GROUPS, "all"):
            raise argparse.ArgumentTypeError(
                f"unknown step {word!r}; steps: {', '.join(ORDER)}; groups: {', '.join(GROUPS)}, all"
            )
        chosen |= set(ORDER if word == "all" else GROUPS.get(word, (word,)))
    for step in list(chosen):
        chosen |= set(NEEDS.get(step, ()))
    return [step for step in ORDER if step in chosen]


class Bench:
    """One benchmark run: its options, work folder, workloads (generated on first use), databases and results."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        self.r: dict[str, Any] = {"workloads": {}}
        self.dbs = Databases(args.server)
        self.pg_one_url = ""

    def workload(self, key: str) -> Path:
        """The pairs of workload ``key`` (``narrow``, ``narrow-x``, ``wide``, ``many-open``, ...), written once."""
        a, folder = self.args, self.workdir / f"pairs-{key}"
        wide = {"tables": a.wide_tables, "columns": a.wide_columns}
        makers: dict[str, Callable[[], dict[str, Any]]] = {
            "narrow": lambda: generate(folder, "bench", a.transactions, a.file_size_mb),
            "narrow-x": lambda: generate(folder, "bench", a.transactions * a.scaleout_factor, a.file_size_mb),
            "wide": lambda: generate(folder, "wide", a.wide_transactions, a.wide_file_size_mb, **wide),
            "many-open": lambda: generate(folder, "many-open", a.many_open_transactions, None),
            "run-length": lambda: write_run_length_pairs(folder, a.run_length_cycles, a.run_length_transactions),
        }
        if key not in self.r["workloads"]:
            self.r["workloads"][key] = makers[key]()
        return folder

    def committed(self) -> int:
        return int(self.r["workloads"]["narrow"]["committed"])

    def delta(self, name: str, key: str, limit_mib: float = 0.0, **apply: Any) -> list[str]:
        """The settings of a Delta run of workload ``key`` (``apply`` keys without their ``apply.`` prefix)."""
        target = {"path": self.workdir / name / "target", **{f"apply.{k}": v for k, v in apply.items()}}
        return applier_settings(self.workdir, name, self.workload(key), limit_mib, self.args.driver_memory, target)

    def postgres(self, name: str, url: str, limit_mib: float = 0.0, key: str = "narrow") -> list[str]:
        """The settings of a PostgreSQL run of workload ``key`` into the database ``url``."""
        target = {"type": "postgres", "url": url, "apply.threads": self.args.threads}
        return applier_settings(self.workdir, name, self.workload(key), limit_mib, self.args.driver_memory, target)

    def run(self, steps: list[str]) -> dict[str, Any]:
        """Every step in order; the results the report is rendered from (also saved as ``report.json``)."""
        a, r = self.args, self.r
        r.update(command=" ".join(["python", "-m", "bench", *sys.argv[1:]]), steps=steps, load_before=load_average())
        r.update(date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), driver_memory=a.driver_memory)
        started = time.perf_counter()
        progress(f"steps {', '.join(steps)}; load average {r['load_before']}; work folder {self.workdir}")
        if any(s.startswith("pg-") or s == "scaleout" for s in steps):
            r["server"], r["threads"] = self.dbs.facts(), a.threads  # refuses an unreachable server first
        r["machine"] = machine_facts()
        prepare_workdir(self.workdir)
        try:
            for step in steps:
                STEPS[step](self)
        finally:
            self.dbs.drop_all()
        r["load_after"], r["total_s"] = load_average(), time.perf_counter() - started
        (self.workdir / "report.json").write_text(json.dumps(r, indent=1, default=str), encoding="utf-8")
        return r


def delta_rows(target_root: Path) -> dict[str, int]:
    """Rows per Delta table under a target root (``schema/table`` folders)."""
    from deltalake import DeltaTable

    return {
        f"{schema.name}.{table.name}": DeltaTable(str(table)).to_pyarrow_dataset().count_rows()
        for schema in sorted(p for p in target_root.iterdir() if p.is_dir())
        for table in sorted(p for p in schema.iterdir() if p.is_dir())
        if DeltaTable.is_deltatable(str(table))
    }


# ---------------------------------------------------------------------------
# The Delta steps


def step_narrow(b: Bench) -> None:
    """``applier run`` of the six-table workload in one cycle, then with a limit giving about six cycles."""
    one = run_applier(b.workdir, "narrow_one", b.delta("narrow_one", "narrow"))
    limit_mib, planned = choose_cycle_limit(b.workload("narrow"))
    progress(f"cycle limit {limit_mib} MiB plans {planned} cycles")
    many = run_applier(b.workdir, "narrow_cycles", b.delta("narrow_cycles", "narrow", limit_mib))
    rows = {name: delta_rows(b.workdir / name / "target") for name in ("narrow_one", "narrow_cycles")}
    b.r["narrow"] = {"one": one, "cycles": {**many, "limit_mib": limit_mib}, "rows": rows}
    b.r["narrow"]["agree"] = rows["narrow_one"] == rows["narrow_cycles"]


def step_limit(b: Bench) -> None:
    """The calibrated limit, reading the final rows from the one-cycle run's target."""
    params = {"settings": b.delta("limit", "narrow"), "engine_target": str(b.workdir / "narrow_one" / "target")}
    params |= {"intermediate_dir": str(b.workload("narrow")), "engine_app_id": "narrow_one"}
    b.r["limit"] = run_part("limit", {**params, "out_dir": str(b.workdir / "limit" / "target")}, b.workdir)


def step_pertxn(b: Bench) -> None:
    """The per-transaction Delta baseline, on the first ``--prefix-transactions`` committed transactions."""
    intermediate = b.workload("narrow")
    params = {"intermediate_dir": str(intermediate), "prefix": min(b.args.prefix_transactions, b.committed())}
    b.r["pertxn"] = run_part("pertxn", {**params, "out_dir": str(b.workdir / "pertxn" / "target")}, b.workdir)


def step_small(b: Bench) -> None:
    """Small cycles after a bulk run, on the workload's own copy (hard links), since they add pairs."""
    small_dir = b.workdir / "small" / "intermediate"
    small_dir.mkdir(parents=True)
    for f in sorted(b.workload("narrow").iterdir()):
        try:
            os.link(f, small_dir / f.name)
        except OSError:
            shutil.copy2(f, small_dir / f.name)
    settings = [*b.delta("small", "narrow"), f"intermediate_dir={small_dir}"]
    config = b.workdir / "small" / "config.yaml"
    params = {"config": str(write_config(config, settings)), "tails": b.args.small_cycles}
    b.r["small"] = run_part("small", {**params, "tail_transactions": b.args.small_transactions}, b.workdir)
    if "narrow" in b.r:  # the bulk must leave what the one-cycle run left in the tables the small pairs leave alone
        small, one = delta_rows(b.workdir / "small" / "target"), b.r["narrow"]["rows"]["narrow_one"]
        b.r["narrow"]["rows"]["small (after the small pairs)"] = small
        b.r["small"]["bulk_agrees"] = all(small.get(t) == n for t, n in one.items() if t != "shop.events")


# ---------------------------------------------------------------------------
# The memory steps (issue 12)


def step_wide(b: Bench) -> None:
    """``applier run`` of the 1,000-table workload in one cycle, compared in the report with ``narrow``'s."""
    b.r["wide"] = {"one": run_applier(b.workdir, "wide", b.delta("wide", "wide"))}


def step_many_open(b: Bench) -> None:
    """Thousands of open transactions: a cycle per pair with a small queue, then the same pairs in one cycle."""
    a = b.args
    split = run_applier(
        b.workdir,
        "many_open_split",
        b.delta("many_open_split", "many-open", a.many_open_limit_mb, queue_memory_mb=a.many_open_queue_mb),
    )
    one = run_applier(
        b.workdir, "many_open_one", b.delta("many_open_one", "many-open", queue_memory_mb=a.many_open_queue_mb)
    )
    rows = {name: delta_rows(b.workdir / name / "target") for name in ("many_open_split", "many_open_one")}
    b.r["many-open"] = {"split": split, "one": one, "agree": rows["many_open_split"] == rows["many_open_one"]}
    b.r["many-open"]["chart"] = _chart(b, "many_open_split")


def _chart(b: Bench, name: str) -> str:
    """``applier advise`` draws the queue-memory chart of run ``name``; it is copied beside the report, named."""
    log_path = b.workdir / name / "advise.log"
    cmd = [sys.executable, "-m", "applier.cli", "advise", "--config", str(b.workdir / name / "config.yaml")]
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.run(cmd, env=spark_env(), stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    chart = b.workdir / name / "output" / name / "queue-memory.png"
    if code != 0 or not chart.exists():
        raise BenchError(f"applier advise ({name}) exited {code} without a chart; log {log_path}:\n{tail(log_path)}")
    out = b.args.out.resolve() if b.args.out else b.workdir / "report.md"
    kept = out.parent / f"{out.stem}-queue-memory.png"
    shutil.copy2(chart, kept)
    progress(f"queue-memory chart of {name}: {kept}")
    return kept.name


def step_run_length(b: Bench) -> None:
    """Thousands of one-pair cycles in one keyed ``applier run``; the ledger's size after it."""
    settings = b.delta("run_length", "run-length", 0.001)  # below a pair's size: one pair per cycle
    run = run_applier(b.workdir, "run_length", settings, ("--run-key", RUN_KEY))
    if run["cycles"] != b.args.run_length_cycles:
        raise BenchError(f"the run-length run made {run['cycles']} cycles of {b.args.run_length_cycles} pairs")
    ledger = [p for p in (b.workdir / "run_length" / "output" / "run_length" / "ledger").rglob("*") if p.is_file()]
    b.r["run-length"] = {"run": run, "window": min(b.args.run_length_window, run["cycles"] // 2)}
    b.r["run-length"]["ledger"] = {p.name: p.stat().st_size for p in ledger}


# ---------------------------------------------------------------------------
# The PostgreSQL steps


def step_pg_compiled(b: Bench) -> None:
    """``applier run`` with the PostgreSQL target, in one cycle and in about six, each on a new database."""
    tables = list(latest_table_defs(b.workload("narrow")))
    b.pg_one_url = b.dbs.create("compiled")
    one = run_applier(b.workdir, "pg_one", b.postgres("pg_one", b.pg_one_url))
    limit_mib, planned = choose_cycle_limit(b.workload("narrow"))
    progress(f"cycle limit {limit_mib} MiB plans {planned} cycles")
    many_url = b.dbs.create("cycles")
    many = run_applier(b.workdir, "pg_cycles", b.postgres("pg_cycles", many_url, limit_mib))
    rows = {"one": fingerprints(b.pg_one_url, tables), "cycles": fingerprints(many_url, tables)}
    b.dbs.drop(many_url)
    b.r["pg-compiled"] = {"one": one, "cycles": {**many, "limit_mib": limit_mib}, "rows": rows}
    b.r["pg-compiled"]["agree"] = rows["one"] == rows["cycles"]


def step_pg_limit(b: Bench) -> None:
    """The calibrated limit on a new database, from the one-cycle compiled run's rows."""
    url = b.dbs.create("limit")
    params = {"intermediate_dir": str(b.workload("narrow")), "source_url": b.pg_one_url, "url": url}
    b.r["pg-limit"] = run_part("pg-limit", {**params, "settings": b.delta("pg_limit", "narrow")}, b.workdir)
    b.dbs.drop(url)


def step_pg_baseline(b: Bench, part: str, prefix: int | None) -> None:
    """A baseline on every committed transaction (or a prefix), on a new database; whether it leaves the same rows."""
    committed, url = b.committed(), b.dbs.create(part[3:])
    params = {"intermediate_dir": str(b.workload("narrow")), "url": url, "prefix": min(prefix or committed, committed)}
    b.r[part] = result = run_part(part, params, b.workdir)
    done = f"{result['transactions']} transactions, {result['statements']} statements"
    progress(f"{part}: {done} in {result['seconds']:.1f} s")
    checks = b.r.setdefault("pg-baselines", {"rows": {}, "match_compiled": {}})
    checks["rows"][part] = fingerprints(url, list(latest_table_defs(b.workload("narrow"))))
    b.dbs.drop(url)
    if result["transactions"] == committed and "pg-compiled" in b.r:
        checks["match_compiled"][part] = checks["rows"][part] == b.r["pg-compiled"]["rows"]["one"]
    if {"pg-pertxn", "pg-rowbyrow"} <= set(b.r):
        same = b.r["pg-pertxn"]["transactions"] == b.r["pg-rowbyrow"]["transactions"]
        checks["agree"] = checks["rows"]["pg-pertxn"] == checks["rows"]["pg-rowbyrow"] if same else None


STEPS: dict[str, Callable[[Bench], None]] = {
    "narrow": step_narrow,
    "limit": step_limit,
    "pertxn": step_pertxn,
    "small": step_small,
    "duckdb": step_duckdb,
    "wide": step_wide,
    "many-open": step_many_open,
    "run-length": step_run_length,
    "pg-compiled": step_pg_compiled,
    "pg-limit": step_pg_limit,
    "pg-pertxn": lambda b: step_pg_baseline(b, "pg-pertxn", b.args.pertxn_prefix),
    "pg-rowbyrow": lambda b: step_pg_baseline(b, "pg-rowbyrow", b.args.rowbyrow_prefix),
    "scaleout": step_scaleout,
}
