"""The queue-memory chart: memory over the recent cycles, in memory against spooled (reads and writes files).

Each cycle's line in ``cycles.jsonl`` carries a ``queue`` object: the budget,
the peak bytes held in memory during the cycle, and the bytes spooled to
spill files by kind. The chart draws, per cycle, the peak in memory and the
sum of the spooled bytes, with the budget as a line, from the last
:data:`RECENT_CYCLES` lines, and is written as ``<work_dir>/queue-memory.png``
beside the cycle reports. Lines written before the budget existed lack
``queue``: they are drawn as zero, without a budget (when no line has one,
the configured budget is drawn across). The file is read from its end, so the cost
does not grow with the number of cycles; the PNG is drawn with matplotlib's
Agg canvas (no display, no global pyplot state) and replaced atomically.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from applier.config import Config
from applier.intermediate.pairs import MIB

CHART_NAME = "queue-memory.png"
RECENT_CYCLES = 200
_BLOCK = 64 * 1024


@dataclass(frozen=True)
class QueuePoint:
    """One cycle on the chart (bytes).

    Attributes:
        cycle_id: the cycle.
        in_memory: the peak bytes held in memory during the cycle.
        spooled: the bytes written to spill files during the cycle, all kinds.
        budget: the queue memory budget of the cycle; None when its line has no ``queue`` object.
    """

    cycle_id: int
    in_memory: int
    spooled: int
    budget: int | None

    @property
    def reported(self) -> bool:
        """The cycle's line carried a ``queue`` object."""
        return self.budget is not None


@dataclass(frozen=True)
class Chart:
    """A chart written: where, and how many cycles it draws (with queue figures or not)."""

    path: Path
    cycles: int
    reported: int


def tail_lines(path: Path, count: int) -> list[str]:
    """The last ``count`` complete, non-empty lines of ``path``, read backwards in blocks from its end.

    A last line without its ``\\n`` is being written (or was cut by a crash)
    and is left out.

    Args:
        path: a text file of ``\\n``-terminated lines.
        count: how many lines, at most.

    Returns:
        The lines in file order; none when the file is missing.
    """
    if count <= 0 or not path.exists():
        return []
    with open(path, "rb") as fh:
        position = fh.seek(0, os.SEEK_END)
        data = b""
        while position > 0 and data.count(b"\n") <= count:
            step = min(_BLOCK, position)
            position -= step
            fh.seek(position)
            data = fh.read(step) + data
    data = data[: data.rfind(b"\n") + 1]  # without an unterminated last line
    if position > 0:  # the first piece may be the end of a longer line
        data = data[data.index(b"\n") + 1 :]
    lines = [line.decode("utf-8", errors="replace") for line in data.split(b"\n") if line.strip()]
    return lines[-count:]


def recent_reports(path: Path, count: int = RECENT_CYCLES) -> list[dict[str, Any]]:
    """The last ``count`` cycle reports of ``cycles.jsonl``, skipping a line that is not a JSON object."""
    reports = []
    for line in tail_lines(path, count):
        try:
            report = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if isinstance(report, dict):
            reports.append(report)
    return reports


def queue_points(reports: Sequence[Mapping[str, Any]], default_budget: int) -> list[QueuePoint]:
    """One point per cycle report; a report without ``queue`` (or with an empty one) is zero, without a budget.

    Args:
        reports: cycle reports, oldest first.
        default_budget: the budget of a ``queue`` object that lacks ``budget_bytes``.

    Returns:
        The points, in the reports' order.
    """
    points = []
    for number, report in enumerate(reports):
        queue = report.get("queue")
        cycle_id = int(report.get("cycle_id", number + 1))
        if not isinstance(queue, Mapping) or not queue:  # no queue accounting in that cycle
            points.append(QueuePoint(cycle_id, 0, 0, None))
            continue
        spooled = queue.get("spooled_bytes") or {}
        points.append(
            QueuePoint(
                cycle_id,
                int(queue.get("peak_bytes", 0)),
                sum(int(v) for v in spooled.values()),
                int(queue.get("budget_bytes", default_budget)),
            )
        )
    return points


def draw_chart(points: Sequence[QueuePoint], out: Path, title: str, configured_budget: int) -> None:
    """Draw ``points`` as a PNG at ``out`` (MiB over cycle ids), replacing it atomically.

    Args:
        points: the cycles, oldest first (at least one).
        out: the PNG to write.
        title: the chart's title.
        configured_budget: the budget drawn across when no point carries one.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(9, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    cycles = [p.cycle_id for p in points]
    marker = "o" if len(points) <= 40 else None
    axes.plot(cycles, [p.in_memory / MIB for p in points], marker=marker, label="in memory (peak)")
    axes.plot(cycles, [p.spooled / MIB for p in points], marker=marker, label="spooled")
    if any(p.reported for p in points):
        budgets = [p.budget / MIB if p.budget is not None else float("nan") for p in points]
        axes.step(cycles, budgets, where="mid", linestyle="--", color="grey", label="budget")
    else:
        axes.axhline(configured_budget / MIB, linestyle="--", color="grey", label="budget (configured)")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("cycle")
    axes.set_ylabel("MiB")
    axes.set_ylim(bottom=0)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="best")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.tmp")
    figure.savefig(partial, format="png")
    os.replace(partial, out)


def write_queue_chart(config: Config, count: int = RECENT_CYCLES) -> Chart | None:
    """Draw the last ``count`` cycles of ``config`` to ``<work_dir>/queue-memory.png``.

    Args:
        config: the configuration (its work folder and queue budget).
        count: how many of the latest cycles to draw.

    Returns:
        The chart written, or None when there is no cycle report yet.
    """
    points = queue_points(recent_reports(config.work_dir / "cycles.jsonl", count), config.queue_memory_bytes)
    if not points:
        return None
    reported = sum(p.reported for p in points)
    title = f"queue memory of {config.configuration_name}: last {len(points)} cycles ({reported} with queue figures)"
    path = config.work_dir / CHART_NAME
    draw_chart(points, path, title, config.queue_memory_bytes)
    return Chart(path, len(points), reported)
