"""The cycle planner: contiguous pairs within the size limit, never past a gap."""

from __future__ import annotations

from pathlib import Path

from applier.intermediate.pairs import PairRef
from applier.planner import plan_backlog, plan_cycle


def refs(sizes: dict[int, int]) -> list[PairRef]:
    return [PairRef(seq, Path(f"{seq}.dat"), Path(f"{seq}.trn"), size) for seq, size in sorted(sizes.items())]


FIVE = refs({1: 100, 2: 100, 3: 100, 4: 100, 5: 100})


def test_limit_zero_takes_every_available_pair() -> None:
    assert plan_cycle(FIVE, 0, 0).seqs == [1, 2, 3, 4, 5]


def test_the_cycle_starts_after_the_applied_pair() -> None:
    assert plan_cycle(FIVE, 3, 0).seqs == [4, 5]


def test_as_many_pairs_as_fit_the_limit_without_splitting_one() -> None:
    assert plan_cycle(FIVE, 0, 250).seqs == [1, 2]
    assert plan_cycle(FIVE, 0, 300).seqs == [1, 2, 3]
    assert plan_cycle(FIVE, 0, 250).bytes == 200


def test_a_tiny_limit_still_takes_one_pair_per_cycle() -> None:
    assert [p.seqs for p in plan_backlog(FIVE, 0, 1)] == [[1], [2], [3], [4], [5]]


def test_an_oversized_pair_forms_a_cycle_alone() -> None:
    pairs = refs({1: 50, 2: 1000, 3: 50, 4: 50})
    assert [p.seqs for p in plan_backlog(pairs, 0, 200)] == [[1], [2], [3, 4]]


def test_nothing_past_a_gap() -> None:
    pairs = refs({1: 10, 2: 10, 4: 10, 5: 10})
    assert plan_cycle(pairs, 0, 0).seqs == [1, 2]
    assert not plan_cycle(pairs, 2, 0)


def test_nothing_new_gives_an_empty_plan() -> None:
    assert not plan_cycle(FIVE, 5, 0)
    assert not plan_cycle([], 0, 0)
    assert plan_backlog(FIVE, 5, 100) == []


def test_the_next_pair_missing_at_the_start_is_a_gap_too() -> None:
    assert not plan_cycle(refs({3: 10, 4: 10}), 1, 0)
