"""What every part of the apply benchmark shares: paths, units, the issue's goals, progress lines and the error."""

from __future__ import annotations

import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
DEFAULT_WORKDIR = Path("/tmp/cdc-bench")
MARKER = ".cdc-bench"  # a folder holding this file is ours to delete
MIB = 1024 * 1024
SPARK_MASTER = "local[2]"

# The goals.
GOAL_LIMIT_RATIO = 2.0  # the engine within 2x of the calibrated limit
GOAL_SPEEDUP = 25.0  # the engine more than 25x faster than per-transaction commits
GOAL_SMALL_CYCLE_S = 2.0  # a small cycle after the first one
# Issue 5 (PostgreSQL): compiled at least 25x log-order row-by-row (GOAL_SPEEDUP) and 5x per-transaction,
# and within 2x of the calibrated limit (GOAL_LIMIT_RATIO).
GOAL_PG_PER_TRANSACTION = 5.0

_T0 = time.perf_counter()


def progress(message: str) -> None:
    """One progress line on stdout, with the seconds since the benchmark started."""
    print(f"[{time.perf_counter() - _T0:8.1f}s] {message}", flush=True)


class BenchError(Exception):
    """A step of the benchmark failed (not a missed goal)."""
