"""The one call that runs the Applier, shared by ``applier run`` and ``jobs/apply.py``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from applier.config import Config
from applier.engine.report import CycleReport
from applier.engine.run import Applier, RunSummary
from applier.engine.session import start_spark
from applier.targets import open_target


def configure_logging() -> None:
    """Operator logs on stderr: the Applier's cycle lines at INFO, Spark's Python bridge quiet."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)


def run_applier(
    config: Config,
    *,
    max_cycles: int | None = None,
    spark: Any = None,
    set_master: bool = True,
    on_cycle: Callable[[CycleReport], None] | None = None,
) -> RunSummary:
    """Run apply cycles until caught up or the cycle limit.

    Args:
        config: the validated configuration.
        max_cycles: cycles for this run; None takes ``apply.max_cycles_per_run``.
        spark: a running session to use; None starts one from the configuration.
        set_master: whether the configuration's ``spark.master`` applies (not under spark-submit).
        on_cycle: called with each cycle's report.

    Raises:
        IntermediateFileError: a refused pair, after everything before it was applied.
        TargetError: the target failed; the cycle was not checkpointed.
    """
    logging.getLogger("applier").setLevel(logging.INFO)
    session = spark if spark is not None else start_spark(config, set_master=set_master)
    limit = config.apply.max_cycles_per_run if max_cycles is None else max_cycles
    return Applier(config, session, open_target(config)).run(limit, on_cycle)
