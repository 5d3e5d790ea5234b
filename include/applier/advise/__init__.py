"""``applier advise``: queue-memory sizing by Informix Enterprise Replication's arithmetic, with its reasoning.

The parts, pure apart from I/O:

- :mod:`~applier.advise.arithmetic`: the ER queue arithmetic and its layouts (pure);
- :mod:`~applier.advise.shapes`, :mod:`~applier.advise.transactions`,
  :mod:`~applier.advise.observe`: the workload measured from its pairs (reads);
- :mod:`~applier.advise.recommend`: the settings for no spooling (pure);
- :mod:`~applier.advise.wording`: the report's lines (pure);
- :mod:`~applier.advise.chart`: the queue-memory chart of the recent cycles (reads and writes).

:func:`advise` wires them for the command.
"""

from __future__ import annotations

from dataclasses import dataclass

from applier.advise.arithmetic import DEFAULT_LAYOUT, Layout
from applier.advise.chart import RECENT_CYCLES, Chart, write_queue_chart
from applier.advise.observe import Observation, observe_backlog
from applier.advise.recommend import Recommendation, recommend
from applier.advise.wording import header_lines, recommendation_lines, tables_lines, transaction_lines
from applier.config import DEFAULT_DRIVER_MEMORY, Config, memory_bytes


@dataclass(frozen=True)
class Advice:
    """What ``applier advise`` found and says.

    Attributes:
        observation: the workload measured (no pairs read when the backlog is empty).
        recommendation: the settings, None without a backlog.
        chart: the chart written, None without cycle reports.
        lines: the report, a line each.
    """

    observation: Observation
    recommendation: Recommendation | None
    chart: Chart | None
    lines: list[str]


def driver_memory(config: Config) -> int:
    """``spark.driver.memory`` of ``config`` in bytes (Spark's default when unset)."""
    return memory_bytes(config.spark.conf.get("spark.driver.memory", DEFAULT_DRIVER_MEMORY))


def chart_line(config: Config, chart: Chart | None) -> str:
    """Where the chart is, or why there is none."""
    if chart is None:
        return f"queue memory chart: none yet (no cycle reports in {config.work_dir / 'cycles.jsonl'})"
    return f"queue memory chart: {chart.path} ({chart.cycles} recent cycles, {chart.reported} with queue figures)"


def advise(
    config: Config,
    layout: Layout = DEFAULT_LAYOUT,
    sample_pairs: int | None = None,
    chart_cycles: int = RECENT_CYCLES,
) -> Advice:
    """Measure the backlog of ``config``, recommend settings and draw the chart.

    Args:
        config: the configuration.
        layout: the ER layout of the arithmetic (64-bit by default).
        sample_pairs: read only the backlog's first pairs; None reads it all.
        chart_cycles: how many of the latest cycles the chart draws.

    Returns:
        The advice and its report.

    Raises:
        IntermediateFileError: a pair read breaks the spec.
    """
    observation = observe_backlog(config, layout, sample_pairs)
    budget = config.queue_memory_bytes
    lines = header_lines(config, observation)
    recommendation = None
    if observation.read:
        recommendation = recommend(observation, budget, driver_memory(config))
        lines += tables_lines(observation, budget)
        lines += transaction_lines(observation, budget)
        lines += recommendation_lines(recommendation, observation, config)
    else:
        where = config.intermediate_dir
        missing = "" if where.is_dir() else " (the folder does not exist)"
        after = observation.applied_seq
        lines.append(f"no backlog: no complete pair after pair {after} in {where}{missing}; nothing to size")
    chart = write_queue_chart(config, chart_cycles)
    lines.append(chart_line(config, chart))
    return Advice(observation, recommendation, chart, lines)
