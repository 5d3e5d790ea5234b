"""A small cycle after a bulk run, in one Spark application (runs in a child process, ``--part small``)."""

from __future__ import annotations

import time
from typing import Any

from bench.measure import BenchError
from bench.workload import write_tail_pair


def _timed_run(config: Any, spark: Any) -> dict[str, Any]:
    """One ``Applier.run`` in ``spark``: its wall time, the time before its first cycle and each cycle's."""
    from applier.engine.run import Applier
    from applier.targets import open_target

    class TimedApplier(Applier):
        """Notes when each cycle starts (list, plan, read ...), to time a cycle apart from the rebuild."""

        cycle_starts: list[float]

        def _next_cycle(self, checkpoint: Any, validator: Any) -> Any:
            self.cycle_starts.append(time.perf_counter())
            return super()._next_cycle(checkpoint, validator)

    applier = TimedApplier(config, spark, open_target(config))
    applier.cycle_starts, ends, reports = [], [], []

    def done(report: Any) -> None:
        ends.append(time.perf_counter())
        reports.append(report)

    started = time.perf_counter()
    applier.run(0, done)
    wall = time.perf_counter() - started
    walls = [end - start for start, end in zip(applier.cycle_starts, ends, strict=False)]
    return {
        "call_s": wall,
        "before_first_cycle_s": (applier.cycle_starts[0] - started) if applier.cycle_starts else wall,
        "cycle_walls_s": walls,
        "cycle_phases": [dict(r.seconds) for r in reports],
        "rows_read": sum(r.rows_read for r in reports),
    }


def part_small(params: dict[str, Any]) -> dict[str, Any]:
    """Bulk run, then ``tails`` small pairs, each applied by a new run in the same Spark session.

    Args:
        params: ``config`` (the YAML file), ``tails`` (small cycles) and ``tail_transactions`` (per small pair).

    Returns:
        The Spark start-up time, the bulk run's timings and each small run's timings with its pair's size.

    Raises:
        BenchError: a small pair was not applied in exactly one cycle.
    """
    from applier.config import load_config
    from applier.engine.session import start_spark
    from applier.targets import open_target

    config = load_config(params["config"])
    started = time.perf_counter()
    spark = start_spark(config)
    startup = time.perf_counter() - started
    bulk = _timed_run(config, spark)
    print(f"bulk: {bulk['call_s']:.1f} s, {len(bulk['cycle_walls_s'])} cycles", flush=True)
    tails = []
    for number in range(1, params["tails"] + 1):
        written = write_tail_pair(config, open_target(config), number, params["tail_transactions"])
        run = _timed_run(config, spark)
        if len(run["cycle_walls_s"]) != 1:
            raise BenchError(f"small pair {number} took {len(run['cycle_walls_s'])} cycles, expected 1")
        tails.append({**written, **run})
        print(f"small cycle {number}: {run['cycle_walls_s'][0]:.2f} s; call {run['call_s']:.2f} s", flush=True)
    spark.stop()
    return {"spark_startup_s": startup, "bulk": bulk, "tails": tails}
