"""Figures derived from several measurements: extrapolated baselines and ratios.

Pure: results in, numbers out; :mod:`bench.report` writes them as Markdown.
"""

from __future__ import annotations

import statistics
from typing import Any

MIB = 1024 * 1024
GOAL_LIMIT_RATIO = 1.0  # issue 16: the Delta engine at most 1.0x the calibrated limit (issue 3 asked 2x)
GOAL_PG_LIMIT_RATIO = 2.0  # issue 5: the compiled PostgreSQL apply within 2x of its calibrated limit
GOAL_SPEEDUP = 25.0  # issue 3: 25x per-transaction Delta commits; issue 5: 25x log-order row-by-row
GOAL_SMALL_CYCLE_S = 2.0  # issue 3: a small cycle after the first one
GOAL_PG_PER_TRANSACTION = 5.0  # issue 5: 5x per-transaction PostgreSQL apply
GOAL_WIDE_RATIO = 1.5  # issue 12: the wide workload within 1.5x of the narrow one's time
GOAL_COMMIT_RATIO = 1.5  # issue 12: the cycle committing the open transactions within 1.5x of one cycle
GOAL_FLAT_TIME = 1.2  # issue 12: the last cycles' median time within 1.2x of the first's (a busy machine's noise)
GOAL_FLAT_MEMORY = 1.1  # issue 12: the last cycles' median driver peak within 1.1x of the first's


# ---------------------------------------------------------------------------
# From the results


def whole(part: dict[str, Any], committed: int) -> bool:
    """Whether a baseline applied every committed transaction (nothing of it is extrapolated)."""
    return bool(part["transactions"] >= committed)


def linear(part: dict[str, Any], committed: int) -> float:
    """A prefix baseline's seconds extrapolated linearly to ``committed`` transactions."""
    return float(part["seconds"] * committed / part["transactions"])


def steady(part: dict[str, Any], committed: int) -> float:
    """The first half of the prefix (with the initial loads) once, then the second half's rate for the rest."""
    first, rest = part["half_transactions"], part["transactions"] - part["half_transactions"]
    if rest <= 0 or committed <= first:
        return linear(part, committed)
    return float(part["half_s"] + (part["seconds"] - part["half_s"]) / rest * (committed - first))


def committed(r: dict[str, Any]) -> int:
    """The narrow workload's committed transactions (what every baseline is scaled to)."""
    return int(r["workloads"]["narrow"]["committed"])


def limit_s(lim: dict[str, Any]) -> tuple[float, float]:
    """A calibrated limit's work (parse and write) and its seconds with Spark's start."""
    work = lim["parse_s"] + lim.get("merge_s", 0.0) + lim.get("copy_s", 0.0) + lim.get("apply_s", 0.0)
    return work, lim["startup_since_spawn_s"] + work


def overhead_mib(r: dict[str, Any], run: dict[str, Any]) -> tuple[float, str]:
    """The driver's memory beyond the queue, and whence: the many-open one-cycle run, else ``run``'s own start."""
    if "many-open" in r:
        one = r["many-open"]["one"]
        peak = one["driver_peak_rss_mib"] - one["queue"]["peak_bytes"] / MIB
        return peak, "the many-open one-cycle run's driver peak less its queue peak"
    return run["driver_start_rss_mib"], "the run's driver footprint at its start"


def fastest_narrow(r: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The fastest one-cycle ``applier run`` of the narrow workload in the bench, and how many there were.

    ``narrow``'s own, and the DuckDB step's engine rounds when it ran. The
    bench's first run pays for its cold start (14.2 s against 8.1-8.2 s for the
    same run later in one bench), which flattered the wide goal's ratio.
    """
    runs = [r["narrow"]["one"], *(rnd["engine"] for rnd in r.get("duckdb", {}).get("rounds", []))]
    return min(runs, key=lambda run: run["wall_s"]), len(runs)


def commit_cycle(r: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
    """The split many-open run's committing cycle (number, figures; the one committing most), and the one-cycle time."""
    m = r["many-open"]
    i, cycle = max(enumerate(m["split"]["per_cycle"], 1), key=lambda ic: (ic[1]["committed"], ic[0]))
    return i, cycle, m["one"]["cycle_seconds"]


def windows(r: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """The run-length run's first and last cycles: median seconds per cycle (``s``) and driver peak (``rss``)."""
    cycles, w = r["run-length"]["run"]["per_cycle"], r["run-length"]["window"]
    return {
        k: (statistics.median(c[k] for c in cycles[:w]), statistics.median(c[k] for c in cycles[-w:]))
        for k in ("s", "rss")
    }
