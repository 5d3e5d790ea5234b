"""Compilable groups (HVAR) and the enhanced retry, on hand-made transaction shapes."""

from __future__ import annotations

import pytest

from applier.advise.arithmetic import LAYOUT_64, expanded_row_size
from applier.engine.groups import LOG_ORDER, Group, GroupLimits, TxnShape, estimate_cdb_bytes, form_groups
from applier.engine.split import RetryOutcome, attempt_bound, enhanced_retry, split_group

MIB = 1024 * 1024


def txn(n: int, commands: int = 10, size: int = 1_000, truncates: bool = False) -> TxnShape:
    return TxnShape(f"x{n}", 1_000 + n, commands, size, truncates)


def shape(groups: list[Group]) -> list[tuple[str, list[str]]]:
    return [(g.mode, [t.xid for t in g.txns]) for g in groups]


def test_a_transaction_of_exactly_compile_max_cmds_compiles_and_one_more_goes_to_log_order() -> None:
    limits = GroupLimits(max_cmds=100)
    groups = form_groups([txn(1, 100), txn(2, 101), txn(3, 40), txn(4, 60), txn(5, 1)], limits)
    assert shape(groups) == [
        ("compiled", ["x1"]),  # exactly the limit: compilable, and the group is full
        (LOG_ORDER, ["x2"]),  # one over: alone, in log order
        ("compiled", ["x3", "x4"]),  # 40 + 60 = 100 fits
        ("compiled", ["x5"]),  # one more would pass 100: a new group
    ]
    assert "101 commands, over apply.compile_max_cmds 100" in groups[1].reason


def test_a_truncate_in_the_middle_is_applied_alone_between_two_groups() -> None:
    groups = form_groups([txn(1), txn(2), txn(3, truncates=True), txn(4), txn(5)], GroupLimits())
    assert shape(groups) == [("compiled", ["x1", "x2"]), (LOG_ORDER, ["x3"]), ("compiled", ["x4", "x5"])]
    assert groups[1].reason == "it truncates a table"


def test_a_group_closes_on_the_size_estimate_and_never_waits_at_the_end() -> None:
    limits = GroupLimits(cdb_max_bytes=10_000)
    groups = form_groups([txn(i, size=3_000) for i in range(1, 8)], limits)
    assert shape(groups) == [
        ("compiled", ["x1", "x2", "x3"]),  # 9,000; a fourth would make 12,000
        ("compiled", ["x4", "x5", "x6"]),
        ("compiled", ["x7"]),  # the end of the cycle closes it at once
    ]
    assert [g.cdb_bytes for g in groups] == [9_000, 9_000, 3_000]


def test_the_documents_two_table_example_scaled_down() -> None:
    # 1,000 updates to a table of 100 columns, and 1,000 to one of 10 (SAP's 100,000, scaled by 1/100),
    # against a limit scaled alike: the wide table's transaction is over it, the narrow one's is not.
    wide = expanded_row_size([(f"c{i}", "bigint") for i in range(100)], {})
    narrow = expanded_row_size([(f"c{i}", "bigint") for i in range(10)], {})
    sizes = {"s.wide": wide, "s.narrow": narrow}
    wide_txn = TxnShape("w", 1, 1_000, estimate_cdb_bytes({"s.wide": 1_000}, sizes))
    narrow_txn = TxnShape("n", 2, 1_000, estimate_cdb_bytes({"s.narrow": 1_000}, sizes))
    assert wide_txn.cdb_bytes == LAYOUT_64.transaction_header + 1_000 * (64 + 800)
    assert narrow_txn.cdb_bytes == LAYOUT_64.transaction_header + 1_000 * (64 + 80)
    groups = form_groups([wide_txn, narrow_txn], GroupLimits(cdb_max_bytes=MIB // 2))
    assert shape(groups) == [(LOG_ORDER, ["w"]), ("compiled", ["n"])]
    # A limit four times larger takes both (the documents still show the wide one in log order at
    # 4096 MB, with their own, larger, estimate per row; this one is the advisor's arithmetic).
    assert shape(form_groups([wide_txn, narrow_txn], GroupLimits(cdb_max_bytes=2 * MIB))) == [("compiled", ["w", "n"])]


def test_with_compile_off_every_transaction_goes_alone_in_log_order() -> None:
    groups = form_groups([txn(1), txn(2)], GroupLimits(compile=False))
    assert shape(groups) == [(LOG_ORDER, ["x1"]), (LOG_ORDER, ["x2"])]


def test_a_group_splits_into_near_equal_parts_in_order() -> None:
    group = Group(tuple(txn(i) for i in range(10)))
    assert [len(g.txns) for g in split_group(group, 3)] == [3, 4, 3]
    assert [t.xid for g in split_group(group, 3) for t in g.txns] == [t.xid for t in group.txns]
    assert [len(g.txns) for g in split_group(Group(group.txns[:2]), 3)] == [1, 1]
    with pytest.raises(ValueError):
        split_group(group, 1)


class Refused(Exception):
    """A permanent error of the fake target."""


def retry(n: int, bad: set[int], *, split: int, stop: bool, threshold: int = 100) -> tuple[RetryOutcome, list[str]]:
    """Run the enhanced retry over ``n`` transactions of 10 commands whose ``bad`` ones a target refuses."""
    committed: list[str] = []

    def apply(group: Group) -> None:
        if any(int(t.xid[1:]) in bad for t in group.txns):
            raise Refused(", ".join(t.xid for t in group.txns if int(t.xid[1:]) in bad))
        committed.extend(t.xid for t in group.txns)

    outcome = enhanced_retry(
        Group(tuple(txn(i) for i in range(n))), apply, lambda g, e: stop, split=split, threshold=threshold
    )
    return outcome, committed


@pytest.mark.parametrize("split", [3, 2])
def test_one_bad_transaction_among_1000_is_found_within_the_bound(split: int) -> None:
    outcome, committed = retry(1_000, {617}, split=split, stop=False)
    assert committed == [f"x{i}" for i in range(1_000) if i != 617]  # everything else, in commit order
    assert [(g.txns[0].xid, str(e)) for g, e in outcome.failed] == [("x617", "x617")]
    assert outcome.failed[0][0].mode == LOG_ORDER and not outcome.stopped
    leaf = 9  # the most transactions of 10 commands a group under 100 commands holds
    assert outcome.attempts <= attempt_bound(1_000, split, leaf), outcome.attempts


def test_split_in_three_takes_fewer_attempts_than_in_two_or_log_order() -> None:
    three, _ = retry(1_000, {617}, split=3, stop=False)
    two, _ = retry(1_000, {617}, split=2, stop=False)
    whole, _ = retry(1_000, {617}, split=3, stop=False, threshold=10**9)  # the whole group in log order
    assert whole.attempts == 1 + 1_000
    assert three.attempts < whole.attempts and two.attempts < whole.attempts
    assert attempt_bound(1_000, 3, 9) == 1 + 3 * 5 + 9


def test_with_stop_exactly_the_transactions_before_the_first_bad_one_are_applied() -> None:
    outcome, committed = retry(1_000, {250, 600, 900}, split=3, stop=True)
    assert committed == [f"x{i}" for i in range(250)]
    assert [g.txns[0].xid for g, _ in outcome.failed] == ["x250"] and outcome.stopped


def test_with_log_three_bad_transactions_are_all_named_and_the_rest_applied() -> None:
    outcome, committed = retry(1_000, {3, 500, 999}, split=3, stop=False)
    assert committed == [f"x{i}" for i in range(1_000) if i not in {3, 500, 999}]
    assert [g.txns[0].xid for g, _ in outcome.failed] == ["x3", "x500", "x999"]
    assert outcome.attempts <= 3 * attempt_bound(1_000, 3, 9)
