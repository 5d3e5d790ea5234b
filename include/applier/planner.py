"""The cycle planner: which pairs the next apply cycle takes.

Pure: it looks at the applied position and the listed pairs, never at files.
A cycle takes the pairs after the applied one, in sequence order and
contiguous, as many as fit within the size limit, never splitting a pair. A
pair larger than the limit forms a cycle alone. The listing already stops
before a gap, and the planner stops at any break in the numbers as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from applier.intermediate.pairs import PairRef


@dataclass(frozen=True)
class CyclePlan:
    """The pairs of one apply cycle (empty when there is nothing new)."""

    pairs: tuple[PairRef, ...]

    @property
    def seqs(self) -> list[int]:
        return [p.seq for p in self.pairs]

    @property
    def bytes(self) -> int:
        return sum(p.size for p in self.pairs)

    def __bool__(self) -> bool:
        return bool(self.pairs)


def plan_cycle(available: Sequence[PairRef], applied_seq: int, limit_bytes: int) -> CyclePlan:
    """Plan the next cycle.

    Args:
        available: complete pairs in sequence order (as listed).
        applied_seq: the last pair already applied (0 when none).
        limit_bytes: the most bytes one cycle takes; 0 means no limit.

    Returns:
        The pairs ``applied_seq + 1, applied_seq + 2, ...`` that fit the limit
        (at least one if the next pair is available), or an empty plan.
    """
    chosen: list[PairRef] = []
    total = 0
    expected = applied_seq + 1
    for ref in available:
        if ref.seq < expected:
            continue
        if ref.seq != expected:
            break
        if chosen and limit_bytes and total + ref.size > limit_bytes:
            break
        chosen.append(ref)
        total += ref.size
        expected += 1
    return CyclePlan(tuple(chosen))


def plan_backlog(available: Sequence[PairRef], applied_seq: int, limit_bytes: int) -> list[CyclePlan]:
    """Every cycle the available pairs make, one after the other (for status and dry runs)."""
    plans: list[CyclePlan] = []
    while plan := plan_cycle(available, applied_seq, limit_bytes):
        plans.append(plan)
        applied_seq = plan.pairs[-1].seq
    return plans
