"""The engine end to end: ``applier run`` in a fresh process, its cycle reports, and the cycle limit to give it."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.common import MIB, SPARK_MASTER, BenchError, progress
from bench.measure import run_measured, tail
from bench.report import fmt_phases


def engine_settings(workdir: Path, name: str, intermediate: Path, limit_mib: float, driver_memory: str) -> list[str]:
    """The ``--set`` overrides of one engine configuration (everything under ``workdir/name``)."""
    base = workdir / name
    return [
        f"configuration_name={name}",
        f"intermediate_dir={intermediate}",
        f"output_dir={base / 'output'}",
        f"target.path={base / 'target'}",
        f"apply.process_intermediate_size_per_job={limit_mib}",
        "apply.max_cycles_per_run=0",
        f"spark.master={SPARK_MASTER}",
        f"spark.conf.spark.driver.memory={driver_memory}",
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
    """Totals over a run's cycle reports; phases are whatever keys ``seconds`` holds."""
    phases: dict[str, float] = defaultdict(float)
    for c in cycles:
        for key, value in c.get("seconds", {}).items():
            phases[key] += value
    net: dict[str, int] = defaultdict(int)
    for c in cycles:
        for ops in c.get("net_rows", {}).values():
            for op, n in ops.items():
                net[op] += n
    return {
        "cycles": len(cycles),
        "rows_read": sum(c.get("rows_read", 0) for c in cycles),
        "committed": sum(c.get("committed", 0) for c in cycles),
        "rolled_back": sum(c.get("rolled_back", 0) for c in cycles),
        "bytes": sum(c.get("bytes", 0) for c in cycles),
        "phases": dict(phases),
        "cycle_seconds": sum(phases.values()),
        "per_cycle_seconds": [round(sum(c.get("seconds", {}).values()), 2) for c in cycles],
        "per_cycle_mib": [round(c.get("bytes", 0) / MIB, 1) for c in cycles],
        "driver_peak_rss_mib": max((c.get("driver_peak_rss_mib", 0.0) for c in cycles), default=0.0),
        "net_rows": dict(net),
        "spilled": sum(len(c.get("spill_created", [])) for c in cycles),
    }


def run_engine(workdir: Path, name: str, intermediate: Path, limit_mib: float, driver_memory: str) -> dict[str, Any]:
    """``applier run`` in a fresh process; wall, tree memory and the cycle reports."""
    config = write_config(
        workdir / name / "config.yaml", engine_settings(workdir, name, intermediate, limit_mib, driver_memory)
    )
    cmd = [sys.executable, "-m", "applier.cli", "run", "--config", str(config)]
    log_path = workdir / name / "run.log"
    code, wall, peak = run_measured(cmd, log_path, f"engine {name}")
    if code != 0:
        raise BenchError(f"applier run ({name}) exited {code}; log {log_path}:\n{tail(log_path)}")
    cycles = summarize_cycles(read_cycles(workdir / name / "output" / name / "cycles.jsonl"))
    result = {
        "name": name,
        "limit_mib": limit_mib,
        "wall_s": wall,
        "peak_tree_mib": peak,
        "config": str(config),
        "target": str(workdir / name / "target"),
        **cycles,
    }
    result["rows_per_s"] = cycles["rows_read"] / wall if wall else 0.0
    progress(
        f"engine {name}: {cycles['cycles']} cycles, {cycles['rows_read']} rows in {wall:.1f} s "
        f"({result['rows_per_s']:.0f} rows/s); phases {fmt_phases(cycles['phases'])}"
    )
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


def table_rows(target_root: Path) -> dict[str, int]:
    """Rows per Delta table under a target root (``schema/table`` folders)."""
    from deltalake import DeltaTable

    counts = {}
    for schema_dir in sorted(p for p in target_root.iterdir() if p.is_dir()):
        for table_dir in sorted(p for p in schema_dir.iterdir() if p.is_dir()):
            if DeltaTable.is_deltatable(str(table_dir)):
                dataset = DeltaTable(str(table_dir)).to_pyarrow_dataset()
                counts[f"{schema_dir.name}.{table_dir.name}"] = dataset.count_rows()
    return counts
