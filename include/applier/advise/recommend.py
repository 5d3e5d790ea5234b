"""Settings for no spooling at the 99th-percentile transaction, from an observation (pure).

The rules, each printed with its figures by :mod:`applier.advise.wording`:

1. A transaction's need is the larger of its two measures (by the arithmetic,
   and as the Applier buffers it). A transaction spools once it exceeds half
   the queue memory, so the queue must hold **twice the p99 transaction**,
   and at least the **peak of the transactions open at once**: the larger
   is the transactions' share.
2. A cycle's rows are held in memory too (compiled, or waiting for a load
   connection). They take about ``expansion`` bytes per byte of pair (the
   larger measure of every row read, over the pairs' size). The smallest
   cycle is the largest pair (a cycle never splits a pair).
3. ``apply.queue_memory_mb``: at least the transactions' share plus the
   smallest cycle's rows, in whole MiB; a configured budget that is already
   larger is kept.
4. ``apply.process_intermediate_size_per_job``: the room the recommended
   queue leaves beside the transactions' share, over ``expansion``, in steps
   of :data:`CYCLE_STEP_MIB` MiB, never below the largest pair.
5. ``apply.buffer_size_for_split_records``: the p99 transaction as buffered,
   rounded up to :data:`BUFFER_STEP` bytes.
6. The article's strategy for the driver memory: 1/8 to 1/6 of it per queue
   for update-anywhere, 200 to 250 MB of each GB for source to target (the
   Applier's case); a minimum queue above the source-to-target share asks
   for more driver memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from applier.advise.arithmetic import StrategyBudget, strategy_budget
from applier.advise.observe import Observation
from applier.intermediate.pairs import MIB

CYCLE_STEP_MIB = 0.25
BUFFER_STEP = 64 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class Recommendation:
    """The recommended settings and the figures they come from (bytes unless named otherwise).

    Attributes:
        p99_need: the p99 transaction's larger measure.
        queue_for_p99: twice ``p99_need``.
        open_need: the open transactions' peak, larger measure.
        transactions_share: the larger of ``queue_for_p99`` and ``open_need``.
        expansion: bytes in memory per byte of pair; 0 without rows.
        smallest_cycle_mib: the largest pair in MiB, rounded up to a step.
        smallest_cycle_memory: the rows of a cycle that size.
        minimum_queue: ``transactions_share + smallest_cycle_memory``.
        queue_memory_mb: the recommended ``apply.queue_memory_mb``.
        keeps_configured: the configured budget is already enough and is kept.
        cycle_mib: the recommended ``apply.process_intermediate_size_per_job``;
            None without rows to measure.
        buffer_size: the recommended ``apply.buffer_size_for_split_records``.
        driver_memory: the driver memory the strategy is scaled to.
        strategy: the article's budgets for that driver memory.
        driver_memory_needed: the driver memory (whole GiB) whose source-to-target
            share holds ``minimum_queue``, when the configured one does not.
    """

    p99_need: int
    queue_for_p99: int
    open_need: int
    transactions_share: int
    expansion: float
    smallest_cycle_mib: float
    smallest_cycle_memory: int
    minimum_queue: int
    queue_memory_mb: float
    keeps_configured: bool
    cycle_mib: float | None
    buffer_size: int
    driver_memory: int
    strategy: StrategyBudget
    driver_memory_needed: int | None


def round_up(value: float, step: float) -> float:
    """``value`` rounded up to a multiple of ``step``."""
    return math.ceil(value / step - 1e-9) * step


def round_down(value: float, step: float) -> float:
    """``value`` rounded down to a multiple of ``step``."""
    return math.floor(value / step + 1e-9) * step


def expansion(observation: Observation) -> float:
    """Bytes the rows take in memory per byte of pair: the larger measure of every row over the pairs' size."""
    if not observation.pair_bytes or not observation.rows:
        return 0.0
    return max(observation.row_memory, observation.row_buffered) / observation.pair_bytes


def recommend(observation: Observation, budget: int, driver_memory: int) -> Recommendation:
    """The settings for no spooling at the p99 transaction of ``observation``.

    Args:
        observation: the measured workload.
        budget: the configured queue memory in bytes (``config.queue_memory_bytes``).
        driver_memory: ``spark.driver.memory`` in bytes.

    Returns:
        The recommendation with the figures behind it.
    """
    t = observation.transactions
    p99_need = max(t.memory_p99, t.buffered_p99)
    open_need = max(t.peak_open_memory, t.peak_open_buffered)
    share = max(2 * p99_need, open_need)
    grow = expansion(observation)
    smallest_mib = round_up(observation.largest_pair_bytes / MIB, CYCLE_STEP_MIB)
    smallest_memory = math.ceil(smallest_mib * MIB * grow)
    minimum = share + smallest_memory
    keeps = budget >= minimum
    queue_bytes = budget if keeps else math.ceil(minimum / MIB) * MIB
    cycle: float | None = None
    if grow:
        cycle = max(smallest_mib, round_down((queue_bytes - share) / grow / MIB, CYCLE_STEP_MIB))
    strategy = strategy_budget(driver_memory)
    least = math.ceil(minimum / MIB) * MIB
    needed = None
    if least > strategy.source_to_target[1]:
        needed = math.ceil(least * 1024 / 250 / GIB) * GIB
    return Recommendation(
        p99_need=p99_need,
        queue_for_p99=2 * p99_need,
        open_need=open_need,
        transactions_share=share,
        expansion=grow,
        smallest_cycle_mib=smallest_mib,
        smallest_cycle_memory=smallest_memory,
        minimum_queue=minimum,
        queue_memory_mb=queue_bytes / MIB,
        keeps_configured=keeps,
        cycle_mib=cycle,
        buffer_size=max(BUFFER_STEP, int(round_up(t.buffered_p99, BUFFER_STEP))),
        driver_memory=driver_memory,
        strategy=strategy,
        driver_memory_needed=needed,
    )
