"""The benchmark harness without running it: which steps run, what a run's cycle reports sum to, what the report says.

Pure and fast: hand-made cycle lines and results, no Spark, no database.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# bench/ is a folder of scripts at the repository root, not an installed package.
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.measure import summarize_cycles  # noqa: E402
from bench.report import render  # noqa: E402
from bench.steps import selected_steps  # noqa: E402

MIB = 1024 * 1024


def test_a_step_brings_in_the_steps_it_needs_in_the_harness_order() -> None:
    assert selected_steps("wide") == ["narrow", "wide"]
    assert selected_steps("pg-limit") == ["pg-compiled", "pg-limit"]
    assert selected_steps("run-length,delta") == ["narrow", "limit", "pertxn", "small", "duckdb", "run-length"]
    assert selected_steps("duckdb") == ["duckdb"]
    assert len(selected_steps("all")) == 13
    assert selected_steps("pg") == ["pg-compiled", "pg-limit", "pg-pertxn", "pg-rowbyrow"]


def test_an_unknown_step_is_refused_with_the_known_ones() -> None:
    with pytest.raises(Exception, match="unknown step 'fast'; steps: narrow, limit"):
        selected_steps("narrow,fast")


def _cycle(seconds: dict[str, float], committed: int, rss: float, queue: dict[str, Any] | None) -> dict[str, Any]:
    line = {"seconds": seconds, "committed": committed, "bytes": MIB, "rows_read": 10, "driver_peak_rss_mib": rss}
    line.update(driver_start_rss_mib=200.0, net_rows={"a.t": {"I": 3}}, spill_created=[{"file": "x"}])
    return {**line, "queue": queue} if queue is not None else line


def test_cycle_reports_sum_phases_and_keep_the_queue_peaks_and_spooled_bytes_by_kind() -> None:
    queue = {"budget_bytes": 16 * MIB, "peak_bytes": 5 * MIB, "spooled": [{"kind": "transactions"}]}
    first = {**queue, "memory_bytes": {"transactions": 4 * MIB}, "spooled_bytes": {"transactions": MIB, "tables": 0}}
    second = {**queue, "peak_bytes": 9 * MIB, "memory_bytes": {"transactions": 0}}
    second["spooled_bytes"] = {"transactions": 2 * MIB}
    cycles = [
        _cycle({"read": 1.0, "spark": 2.0}, 0, 300.0, first),
        _cycle({"read": 0.5, "tables": 1.5}, 7, 350.0, second),
        _cycle({"read": 0.5}, 0, 340.0, None),  # a line written before the queue existed
    ]
    s = summarize_cycles(cycles)
    assert (s["cycles"], s["rows_read"], s["committed"], s["spilled"]) == (3, 30, 7, 3)
    assert s["phases"] == {"read": 2.0, "spark": 2.0, "tables": 1.5}
    assert [c["s"] for c in s["per_cycle"]] == [3.0, 2.0, 0.5]
    assert (s["driver_start_rss_mib"], s["driver_peak_rss_mib"]) == (200.0, 350.0)
    assert s["queue"] == {
        "budget_bytes": 16 * MIB,
        "peak_bytes": 9 * MIB,
        "memory_bytes": {"transactions": 4 * MIB},
        "spooled_bytes": {"transactions": 3 * MIB, "tables": 0},
    }


def _run(wall: float, cycles: list[tuple[float, int, float]], budget_mib: float = 512, peak_mib: float = 10) -> dict:
    """An ``applier run`` result: per cycle (seconds, committed, driver peak)."""
    queue = {"budget_bytes": budget_mib * MIB, "peak_bytes": peak_mib * MIB, "memory_bytes": {}, "spooled_bytes": {}}
    per_cycle = [{"s": s, "mib": 1.0, "committed": n, "rss": rss, "queue_peak_mib": peak_mib} for s, n, rss in cycles]
    return {
        "wall_s": wall,
        "cycles": len(cycles),
        "rows_read": 1_000_000,
        "rows_per_s": 1_000_000 / wall,
        "cycle_seconds": sum(s for s, _, _ in cycles),
        "phases": {"spark": sum(s for s, _, _ in cycles)},
        "per_cycle": per_cycle,
        "peak_tree_mib": 2000.0,
        "driver_start_rss_mib": 200.0,
        "driver_peak_rss_mib": max(rss for _, _, rss in cycles),
        "queue": queue,
        "spilled": 0,
        "net_rows": {"I": 1},
        "committed": 1,
        "rolled_back": 0,
        "load_batches": [],
    }


def _workload(profile: str, tables: int) -> dict[str, Any]:
    return {"profile": profile, "arguments": {}, "transactions": 10, "committed": 9, "rolled_back": 1, "left_open": 0,
            "changes": 1_000_000, "tables": tables, "pairs": 2, "bytes": 3 * MIB, "seconds": 1.0,
            "rows_per_table": {"a.t": 1}, "rows_per_op": {"I": 1}}  # fmt: skip


def _results(last_cycles_s: float, last_rss: float) -> dict[str, Any]:
    one = _run(40.0, [(30.0, 9, 600.0)])
    run_length = [(0.5, 5, 300.0)] * 100 + [(last_cycles_s, 5, last_rss)] * 100
    return {
        "command": "python -m bench", "date": "today", "total_s": 60.0, "steps": ["narrow", "wide"],
        "machine": {"git": "abc", "nproc": 2, "cpu_count": 2, "kernel": "6", "python": "3.11", "versions": {}},
        "load_before": [1.0, 1.0, 1.0], "load_after": [1.0, 1.0, 1.0], "driver_memory": "2g",
        "workloads": {"narrow": _workload("bench", 6), "wide": _workload("wide", 1000)},
        "narrow": {"one": one, "cycles": {**_run(50.0, [(20.0, 4, 600.0), (20.0, 5, 610.0)]), "limit_mib": 8},
                   "agree": True, "rows": {}},
        "wide": {"one": _run(55.0, [(45.0, 9, 700.0)])},
        "many-open": {"split": _run(90.0, [(2.0, 0, 250.0), (12.0, 3948, 260.0), (1.0, 1, 255.0)], 16, 15),
                      "one": _run(30.0, [(10.0, 3949, 280.0)], 16, 12), "agree": True, "chart": "r-queue-memory.png"},
        "run-length": {"run": _run(150.0, run_length), "window": 100,
                       "ledger": {"k.json": 1000, "k.cycles.jsonl": 9000}},
    }  # fmt: skip


def _goal(report: str, start: str) -> str:
    return next(line for line in report.splitlines() if line.startswith(f"| {start}"))


def test_the_report_marks_the_memory_goals_against_their_thresholds() -> None:
    report = render(_results(last_cycles_s=0.55, last_rss=320.0))
    # 55 / 40: within 1.5x of the narrow run.
    assert _goal(report, "the wide workload within 1.5x").endswith("**1.38x** (per change 1.38x) | **met** |")
    # The overhead is the one-cycle many-open run's driver peak less its queue peak: 280 - 12 MiB.
    assert "**700 MiB** against 512 + 268 = 780 | **met** |" in _goal(report, "wide: driver peak")
    # Against the fastest one-cycle narrow run of the bench: the DuckDB step's engine rounds count too.
    faster = _results(last_cycles_s=0.55, last_rss=320.0)
    faster["duckdb"] = {"rounds": [_duckdb_round("engine", 30.0, 5.0), _duckdb_round("duckdb", 45.0, 4.0)]}
    wide_goal = _goal(render(faster), "the wide workload within 1.5x")
    assert "| 55.0 / 30.0 = **1.83x** (per change " in wide_goal
    assert wide_goal.endswith("; the fastest of 3 narrow runs) | **not met** |")
    # The committing cycle is the one that committed most (the second, 12 s) against one cycle of 10 s.
    assert "cycle 2 (3,948 committed) 12.0 s / 10.0 s = **1.20x** | **met** |" in _goal(report, "the committing cycle")
    assert _goal(report, "no growth in 200 cycles: median seconds").endswith("**1.10x** | **met** |")
    assert _goal(report, "no growth in 200 cycles: median driver peak").endswith("**1.07x** | **met** |")
    assert "![Queue memory of the split many-open run, drawn by applier advise](r-queue-memory.png)" in report
    assert "The run ledger holds 2 files, 10 KiB (50 bytes per cycle)." in report


def test_a_run_that_slows_down_or_grows_misses_the_run_length_goals() -> None:
    report = render(_results(last_cycles_s=0.7, last_rss=360.0))
    assert _goal(report, "no growth in 200 cycles: median seconds").endswith("**1.40x** | **not met** |")
    assert _goal(report, "no growth in 200 cycles: median driver peak").endswith("**1.20x** | **not met** |")


def _duckdb_round(first: str, engine_s: float, duckdb_s: float) -> dict[str, Any]:
    engine = {"wall_s": engine_s, "cpu_s": 60.0, "peak_tree_mib": 3000.0, "cycle_seconds": engine_s - 8, "rows_read": 9,
              "load_before": 1.5, "phases": {"read": 10.0, "spark": engine_s - 18}}  # fmt: skip
    duck = {"wall_s": duckdb_s, "cpu_s": 4.0, "peak_tree_mib": 1000.0, "load_before": 2.25, "duckdb": "2.0.0",
            "changes_kept": 950_000,
            "seconds": {"read": 2.0, "net": 1.5, "write": 0.1}, "rows": {"a.t": 1_234}}  # fmt: skip
    return {"first": first, "engine": engine, "duckdb": duck, "tables": {"a.t": "same"}}


def test_the_duckdb_section_marks_the_goal_on_the_best_round_of_each_side() -> None:
    results = _results(last_cycles_s=0.55, last_rss=320.0)
    results["duckdb"] = {"rounds": [_duckdb_round("engine", 40.0, 5.0), _duckdb_round("duckdb", 30.0, 4.0)]}
    report = render(results)
    # The best engine run (30 s) against the best baseline run (4 s): 7.5x, over the goal of 3x.
    assert _goal(report, "engine (Delta) end to end within 3x of a single-process DuckDB apply").endswith(
        "| 30.0 / 4.0 = **7.5x** (CPU 15.0x, memory 3.0x) | **not met** |"
    )
    assert "| 1 (engine first) | `applier run`, 1 cycle | 40.0 | 60.0 | 3,000 | 25,000 | 1.5 |" in report
    assert "| 2 (duckdb first) | DuckDB baseline | 4.0 | 4.0 | 1,000 | 250,000 | 2.2 |" in report
    assert "in all 1 tables: a.t 1,234 rows." in report
    results["duckdb"]["rounds"][1]["engine"]["wall_s"] = 12.0
    assert _goal(render(results), "engine (Delta) end to end within 3x").endswith(
        "**3.0x** (CPU 15.0x, memory 3.0x) | **met** |"
    )


def _scaleout_run(rows: int, cpu: float, executors: float, peak: float, cycles: int = 1) -> dict[str, Any]:
    each = {"rows_read": rows // cycles, "seconds": 10.0, "driver_cpu_s": cpu / cycles}
    each |= {"executors_cpu_s": executors / cycles, "share": cpu / (cpu + executors)}
    return {
        "rows_read": rows, "wall_s": 60.0, "cpu_s": cpu, "executors_cpu_s": executors, "cycles": cycles,
        "driver_share": cpu / (cpu + executors), "peak_tree_mib": peak, "driver_peak_rss_mib": 300.0,
        "phases": {"read": 1.0, "spark": 20.0}, "per_cycle_cpu": [{**each, "cycle": i + 1} for i in range(cycles)],
    }  # fmt: skip


def test_the_report_marks_the_driver_share_and_memory_goals() -> None:
    results = _results(last_cycles_s=0.55, last_rss=320.0)
    results["scaleout"] = {
        "workers": 2,
        "factor": 4,
        "limit_mib": 80.0,
        "runs": {
            "narrow": _scaleout_run(1_000_000, 5.0, 95.0, 1000.0),
            "narrow-x": _scaleout_run(4_000_000, 8.0, 380.0, 1100.0),
            "narrow-x-cycles": _scaleout_run(4_000_000, 16.0, 384.0, 1000.0, cycles=4),
            "narrow-x-pg-cycles": _scaleout_run(4_000_000, 60.0, 340.0, 900.0, cycles=4),
        },
    }
    results["scaleout"]["runs"]["narrow-x-cycles"]["per_cycle_cpu"][0]["driver_cpu_s"] = 40.0  # the start
    report = render(results)
    assert "| narrow-x-pg-cycles | 4 | 4,000,000 | 60.0 | 60.0 | 340.0 | 15% | 900 |" in report
    said = "in cycles of at most 80.00 MiB of pairs in one application; `narrow-x-pg-cycles` applies the same cycles"
    assert said in report and "into a PostgreSQL database, each cycle in parts" in report
    assert "| narrow-x | 1 | 4,000,000 | 60.0 | 8.0 | 380.0 | 2% | 1,100 | 300 | read 1.0, spark 20.0 |" in report
    assert "| narrow-x-cycles | 2 | 1,000,000 | 10.0 | 4.0 | 96.0 | 4% |" in report  # a cycle's own figures
    goals = report.split("## Goals")[1].split("\n## ")[0]
    row = _goal(goals, "on a standalone cluster of 2 workers, the driver at most 10%")
    assert "**4%** in cycles 2-4 of the 4x workload in 4 cycles" in row and "start included: 5% and 2%" in row
    assert row.endswith("**met** |") and "1,000 and 1,100 MiB: **1.10x** for 4.0x the changes" in goals
    assert _goal(goals, "the driver's peak memory independent").endswith("**met** |")
    results["scaleout"]["runs"]["narrow-x-cycles"]["per_cycle_cpu"][2]["driver_cpu_s"] = 30.0  # a costly cycle
    results["scaleout"]["runs"]["narrow-x"]["peak_tree_mib"] = 3000.0  # and the peak grew with the cycle
    goals = render(results).split("## Goals")[1].split("\n## ")[0]
    assert _goal(goals, "on a standalone cluster").endswith("**not met** |")
    assert _goal(goals, "the driver's peak memory independent").endswith("**not met** |")
    del results["scaleout"]["runs"]["narrow-x-cycles"]  # a report from before the step measured cycles
    results["scaleout"]["runs"]["narrow"] = _scaleout_run(1_000_000, 30.0, 70.0, 1000.0)  # the driver did 30%
    goals = render(results).split("## Goals")[1].split("\n## ")[0]
    assert _goal(goals, "on a standalone cluster").endswith("**not met** |")
