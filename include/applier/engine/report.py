"""The cycle report: one JSON line per cycle in ``cycles.jsonl`` and one log line.

Operators read the log line; tools and the Airflow tasks read the JSON.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from applier.engine.jsonlines import last_lines, read_lines
from applier.targets import collisions

log = logging.getLogger("applier")


@dataclass
class CycleReport:
    """What one apply cycle did.

    ``changes_total``: the rows read by every cycle of the file so far, this one
    too. ``started_at`` and ``ended_at``: when the cycle began reading its pairs
    and when it was done, in UTC (ISO 8601), so an operator or a tool can line a
    cycle up with what else ran on the machine then. ``dat_read_by_executors``:
    Spark's executors read its ``.dat`` files for the driver's checks
    (:mod:`~applier.engine.dat_facts`).
    """

    cycle_id: int
    seqs: list[int]
    bytes: int = 0
    rows_read: int = 0
    committed: int = 0
    rolled_back: int = 0
    open: int = 0
    net_rows: dict[str, dict[str, int]] = field(default_factory=dict)
    log_order_segments: list[str] = field(default_factory=list)
    spill_created: list[dict[str, Any]] = field(default_factory=list)
    spill_removed: list[dict[str, Any]] = field(default_factory=list)
    skipped_tables: list[str] = field(default_factory=list)
    load_batches: list[list[str]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    table_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    applied_seq: int = 0
    restart_seq: int = 0
    driver_peak_rss_mib: float = 0.0
    driver_start_rss_mib: float = 0.0
    queue: dict[str, Any] = field(default_factory=dict)
    compiled_file_bytes: int = 0
    dat_read_by_executors: bool = False
    groups: list[dict[str, Any]] = field(default_factory=list)
    exceptions: list[dict[str, Any]] = field(default_factory=list)
    collisions: dict[str, dict[str, int]] = field(default_factory=dict)
    changes_total: int = 0
    started_at: str = ""
    ended_at: str = ""

    def add_net_rows(self, table: str, counts: dict[str, int]) -> None:
        """Add a part's rows per operation to ``table``'s (a cycle applied in parts adds each part's)."""
        net = self.net_rows.setdefault(table, {})
        for op, n in counts.items():
            if n:
                net[op] = net.get(op, 0) + n

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase of the cycle into ``seconds[name]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 3)

    def log_line(self) -> str:
        """One readable line with the cycle's figures."""
        net = sum(sum(ops.values()) for ops in self.net_rows.values())
        first, last = (self.seqs[0], self.seqs[-1]) if self.seqs else (0, 0)
        return (
            f"cycle {self.cycle_id}: pairs {first}..{last} ({self.bytes / 1048576:.2f} MiB), "
            f"{self.rows_read} rows read, {self.committed} committed, {self.rolled_back} rolled back, "
            f"{self.open} open, {net} net rows to {len(self.net_rows)} tables, "
            f"{len(self.spill_created)} spilled, {sum(self.seconds.values()):.2f}s"
            + (
                f", {collided} collisions"
                if (collided := sum(map(sum, map(dict.values, self.collisions.values()))))
                else ""
            )
        )


def peak_rss_mib(status: Path = Path("/proc/self/status")) -> float:
    """The driver process's peak resident memory so far, in MiB.

    Linux's ``VmHWM``, the high-water mark of this program's own memory. Not
    ``getrusage``'s ``ru_maxrss``: Linux carries that across ``exec``, so a run
    started by a large process (the Airflow task runner, a benchmark harness)
    would report the parent's size as its own. Elsewhere, ``ru_maxrss``.
    """
    try:
        with open(status, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def reset_peak_rss(clear_refs: Path = Path("/proc/self/clear_refs")) -> None:
    """Start a new high-water mark of the driver's memory (Linux: ``5`` to ``clear_refs``; elsewhere nothing).

    Each cycle then reports its own peak: a mark kept for the whole run could
    only grow, and one spike would hide whether later cycles need more.
    """
    try:
        with open(clear_refs, "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass


def append_report(path: Path, report: CycleReport) -> None:
    """Append the cycle's JSON line (with the driver's peak memory in the cycle) and log its readable line.

    The peak covers the cycle (the first cycle's, the run's start too), and a
    new one starts after it.
    """
    report.driver_peak_rss_mib = peak_rss_mib()
    reset_peak_rss()
    report.changes_total = changes_before(path) + report.rows_read
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(asdict(report), sort_keys=True) + "\n")
    log.info(report.log_line())


def changes_before(path: Path) -> int:
    """Row changes read by the cycles ``path`` reports: the last line's running total (``changes_total``).

    A file written before the total existed is summed once, line by line;
    the next line appended carries the total on.
    """
    last = last_report(path)
    if last is None:
        return 0
    if "changes_total" in last:
        return int(last["changes_total"])
    return sum(int(line.get("rows_read", 0)) for line in read_lines(path))


def set_aside_counts(reports: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Transactions error actions let by in ``reports`` (cycle reports), per action (``log``, ``warn``, ...)."""
    counts: dict[str, int] = {}
    for report in reports:
        for passed in report.get("exceptions", []):
            counts[passed["action"]] = counts.get(passed["action"], 0) + 1
    return dict(sorted(counts.items()))


def collision_counts(reports: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Collisions in ``reports`` (cycle reports), per table and kind."""
    counts: dict[str, dict[str, int]] = {}
    for report in reports:
        for table, kinds in report.get("collisions", {}).items():
            collisions.add(counts, table, kinds)
    return dict(sorted(counts.items()))


def last_report(path: Path) -> dict[str, Any] | None:
    """The last cycle's JSON line, if any: read from the end of the file, whatever its length.

    A last line without its newline (an append a crash cut short) is skipped.
    """
    last = last_lines(path, 1)
    return dict(last[0]) if last else None
