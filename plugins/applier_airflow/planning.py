"""The library calls behind the operators: the plan, the run's ledger record, the validation.

No Airflow here: plain configuration and values in, the library's objects
out, so the operators stay a few lines each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from applier.config import Config
from applier.engine.checkpoint import CheckpointStore
from applier.errors import ConfigError, GapError, UsageError
from applier.intermediate.pairs import list_pairs
from applier.planner import plan_backlog
from applier_airflow.builders import plan_summary

if TYPE_CHECKING:
    from applier.engine.ledger import RunRecord
    from applier.validate import ValidationReport


def plan_run(config: Config, key: str, max_cycles: int | None) -> tuple[dict[str, Any], GapError | None]:
    """What the run with ``key`` will apply.

    Args:
        config: the run's configuration.
        key: the run key; a finished ledger record under it makes the run a replay.
        max_cycles: the run's cycle limit; None takes ``apply.max_cycles_per_run`` (0: no limit).

    Returns:
        The plan summary (``builders.plan_summary``): the cycles the backlog
        makes, or, when the key has a finished record, none and the recorded
        cycles the run replays; and the gap the listing stops at, if any.

    Raises:
        ConfigError: the intermediate folder does not exist.
    """
    from applier.engine.ledger import RunLedger

    applied = CheckpointStore(config.work_dir).load().applied_seq
    if not config.intermediate_dir.is_dir():
        raise ConfigError("intermediate_dir", str(config.intermediate_dir), "the folder does not exist")
    listing = list_pairs(config.intermediate_dir, applied + 1)
    cycles = plan_backlog(listing.pairs, applied, config.apply.cycle_limit_bytes)
    limit = config.apply.max_cycles_per_run if max_cycles is None else max_cycles
    if limit:
        cycles = cycles[:limit]
    record = RunLedger(config.work_dir).get(key)
    replay = [c.cycle_id for c in record.cycles] if record is not None and record.replays else []
    if replay:
        cycles = []  # a replay re-runs the recorded cycles and applies nothing new
    gap = listing.gap_error()
    summary = plan_summary(
        key,
        applied,
        [c.seqs for c in cycles],
        [c.bytes for c in cycles],
        gap=gap.detail if gap else None,
        replay_cycles=replay,
    )
    return summary, gap


def recorded_run(config: Config, key: str) -> RunRecord:
    """The ledger record of the run with ``key``.

    Raises:
        UsageError: the run has no record (its apply task did not run).
    """
    from applier.engine.ledger import RunLedger

    record = RunLedger(config.work_dir).get(key)
    if record is None:
        raise UsageError(f"run {key} has no record in the run ledger under {config.work_dir}; did its apply task run?")
    return record


def validate_tables(config: Config, tables: list[str], key: str) -> ValidationReport | None:
    """Validate ``tables`` of the target; results are kept under the run key's name.

    Returns:
        The report, or None when there is no table to validate.
    """
    if not tables:
        return None
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from applier.validate import validate_target

    # A session the task already has is used (``dag.test()`` in a process running Spark), as it is;
    # otherwise one starts only for a table too large to validate in memory, and stops after.
    active = SparkContext._active_spark_context is not None
    spark = SparkSession.builder.getOrCreate() if active else None
    return validate_target(config, spark, tables, results_name=key)
