"""Compilable groups (HVAR) and the enhanced retry, on hand-made transaction shapes."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pytest

from applier.advise.arithmetic import LAYOUT_64, expanded_row_size
from applier.config import ErrorsConfig
from applier.engine.groups import LOG_ORDER, Group, GroupLimits, Shapes, TxnShape, estimate_cdb_bytes, form_groups
from applier.engine.split import RetryOutcome, attempt_bound, enhanced_retry, split_group
from applier.engine.units import Changed, CycleParts, ImageSizes
from applier.errors import TargetError

MIB = 1024 * 1024
FIFTY_COMMANDS = GroupLimits(max_cmds=50)


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


def _groups_one_by_one(txns: list[TxnShape], limits: GroupLimits) -> list[tuple[str, list[str]]]:
    """The grouping rule walked transaction by transaction, as the issue states it (the reference)."""
    groups: list[tuple[str, list[str]]] = []
    current: list[TxnShape] = []
    for t in txns:
        alone = not limits.compile or t.truncates or t.commands > limits.max_cmds or t.cdb_bytes > limits.cdb_max_bytes
        if alone or (
            current
            and (
                sum(c.commands for c in current) + t.commands > limits.max_cmds
                or sum(c.cdb_bytes for c in current) + t.cdb_bytes > limits.cdb_max_bytes
            )
        ):
            groups += [("compiled", [c.xid for c in current])] if current else []
            current = []
        if alone:
            groups.append((LOG_ORDER, [t.xid]))
        else:
            current.append(t)
    return groups + ([("compiled", [c.xid for c in current])] if current else [])


def test_groups_found_by_bisecting_running_sums_are_those_of_the_walk() -> None:
    """form_groups over columns (Shapes) against the rule walked one transaction at a time, on random cycles."""
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(0, 60)
        txns = [
            TxnShape(f"x{i}", 10 * i, rng.choice([0, 1, 5, 20, 49, 50, 51]), rng.choice([300, 900, 2_000, 2_600]),
                     rng.random() < 0.05)
            for i in range(n)
        ]  # fmt: skip
        limits = GroupLimits(rng.random() > 0.05, rng.choice([50, 100]), rng.choice([2_500, 5_000]))
        shapes = Shapes.of(txns)
        groups = form_groups(shapes, limits)
        assert shape(groups) == _groups_one_by_one(txns, limits)
        assert [t for g in groups for t in g.txns] == txns
        assert [g.commands for g in groups] == [sum(t.commands for t in g.txns) for g in groups]
        if n > 3:  # a slice is a view that answers as the transactions it holds
            part = shapes[1:-1]
            assert len(part) == n - 2 and part == txns[1:-1] and part[-1] == txns[-2] and part.xid_list()[0] == "x1"


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


class TableByTable:
    """A fake target whose tables commit one by one and which checks a part before committing any table.

    It refuses a part that holds a ``bad`` transaction with nothing applied,
    as Delta does for a constraint, and records every part it commits.
    """

    def __init__(self, bad: set[str]) -> None:
        self.bad = bad
        self.parts: list[list[str]] = []
        self.passed: list[str] = []

    def commit(self, xids: Sequence[str]) -> Changed:
        if refused := [x for x in xids if x in self.bad]:
            raise TargetError(f"{refused[0]} breaks a constraint", error_class="check", nothing_applied=True)
        self.parts.append(list(xids))
        return {}

    def cycle(
        self,
        n: int,
        truncating: set[int],
        *,
        together: bool,
        limits: GroupLimits = FIFTY_COMMANDS,
        compile_groups: Callable[[Sequence[Sequence[str]]], list[Any]] | None = None,
        sizes: ImageSizes | None = None,
    ) -> CycleParts:
        """A cycle of ``n`` transactions; with ``sizes``, their shapes hold only the order until measured."""
        shapes = [txn(i, commands=0, size=0) if sizes else txn(i, truncates=i in truncating) for i in range(n)]
        return CycleParts(
            cycle_id=1,
            order=[t.xid for t in shapes],
            shapes=shapes,
            apply_part=lambda part, xids: self.commit(xids),
            compile_groups=compile_groups or (lambda groups: [list(g) for g in groups]),
            apply_compiled=lambda part, holder: self.commit(holder),
            discard=lambda holder: None,
            pass_transaction=lambda part, xid, error, action: self.passed.append(xid),
            progress=lambda through, end, changed, passing: None,
            describe=str,
            errors=ErrorsConfig(actions=MappingProxyType({"check": "log"})),
            limits=limits,
            threshold=30,
            together=together,
            sizes=sizes,
        )


def test_a_table_by_table_target_takes_a_cycle_of_many_groups_and_truncates_in_one_part() -> None:
    target = TableByTable(bad=set())
    parts = target.cycle(30, {12, 20}, together=True)
    parts.apply_from(0, 0)
    assert target.parts == [[f"x{i}" for i in range(30)]]  # one commit per table, whatever the limits cut
    assert [(g["mode"], g["transactions"], g["applied"]) for g in parts.groups] == [
        ("compiled", 5, "together"),
        ("compiled", 5, "together"),
        ("compiled", 2, "together"),
        (LOG_ORDER, 1, "together"),
        ("compiled", 5, "together"),
        ("compiled", 2, "together"),
        (LOG_ORDER, 1, "together"),
        ("compiled", 5, "together"),
        ("compiled", 4, "together"),
    ]


def test_a_refused_part_of_many_groups_goes_group_by_group_and_the_failing_transaction_is_found() -> None:
    target = TableByTable(bad={"x17"})
    parts = target.cycle(30, {12}, together=True)
    parts.apply_from(0, 0)
    assert target.passed == ["x17"]
    assert [x for part in target.parts for x in part] == [f"x{i}" for i in range(30) if i != 17]
    assert target.parts[:4] == [[f"x{i}" for i in range(5)], [f"x{i}" for i in range(5, 10)], ["x10", "x11"], ["x12"]]
    assert parts.groups[0]["mode"] == "together" and "x17 breaks a constraint" in str(parts.groups[0]["refused"])
    assert [g["mode"] for g in parts.groups[1:]].count("retry") == 1


def test_a_target_that_commits_a_part_at_once_applies_group_by_group() -> None:
    target = TableByTable(bad=set())
    parts = target.cycle(30, {12}, together=False)
    parts.apply_from(0, 0)
    assert [len(p) for p in target.parts] == [5, 5, 2, 1, 5, 5, 5, 2]
    assert all("applied" not in g for g in parts.groups)


def test_a_cycles_shapes_follow_its_counts_and_buffered_rows() -> None:
    """txn_shapes against the queue arithmetic applied by hand: rows per table, the longest image, buffered shares."""
    from applier.engine.buffers import BufferedTxn
    from applier.engine.cycle_input import CycleInput
    from applier.engine.parts import txn_shapes
    from applier.intermediate.schema import Column, TableDef

    tables = {
        "s.a": TableDef("s.a", (Column("id", "bigint", False), Column("note", "string", True)), ("id",)),
        "s.b": TableDef("s.b", (Column("id", "int", False),), ()),
    }
    cycle = CycleInput()
    cycle.commits.update({"x1": 10, "x2": 20, "x3": 30, "x4": 40})
    # x1's rows of s.a come in two pairs
    cycle.counts.append(pa.table({"xid": ["x1", "x1", "x2"], "table": ["s.a", "s.b", "s.b"], "rows": [2, 2, 5]}))
    cycle.counts.append(pa.table({"xid": ["x1", "x3"], "table": ["s.a", "s.a"], "rows": [1, 1]}))
    cycle.longest_image.update({"s.a": 120, "s.b": 30})
    cycle.truncates.append(("x2", ("s.b", 15)))
    buffered = BufferedTxn("x3", 7, 0, 1, None, None, 0, frozenset({"s.a", "s.b"}))
    size_a = expanded_row_size([("id", "bigint"), ("note", "string")], {}) + 120
    size_b = expanded_row_size([("id", "int")], {}) + 30
    sizes = {"s.a": size_a, "s.b": size_b}

    shapes = txn_shapes(cycle, {"x3": buffered}, tables, ["x1", "x2", "x3", "x4"])

    assert shapes == [
        TxnShape("x1", 10, 5, estimate_cdb_bytes({"s.a": 3, "s.b": 2}, sizes)),
        TxnShape("x2", 20, 5, estimate_cdb_bytes({"s.b": 5}, sizes), truncates=True),
        # 1 row of s.a in the cycle, and 7 buffered shared between its two tables: 3.5 each, rounded
        TxnShape("x3", 30, 8, estimate_cdb_bytes({"s.a": round(4.5), "s.b": round(3.5)}, sizes)),
        TxnShape("x4", 40, 0, estimate_cdb_bytes({}, sizes)),  # committed with no rows
    ]


class MeasuredLater:
    """:class:`~applier.engine.units.ImageSizes` whose compile measures ``size`` bytes per transaction."""

    def __init__(self, n: int, size: int, truncating: set[int]) -> None:
        self.n, self.size, self.truncating = n, size, truncating
        self.measured = False
        self.by_driver = False  # asked before a compile measured: the driver measured the images itself

    def pending(self) -> bool:
        return not self.measured

    def shapes(self) -> list[TxnShape]:
        self.by_driver = not self.measured
        return [txn(i, size=self.size, truncates=i in self.truncating) for i in range(self.n)]


def measured_cycle(target: TableByTable, sizes: MeasuredLater, limits: GroupLimits) -> tuple[CycleParts, list[list]]:
    """A together cycle whose shapes wait for the compile (none but the order until then); the compiles it runs."""
    compiles: list[list[list[str]]] = []

    def compile_groups(groups: Sequence[Sequence[str]]) -> list[list[str]]:
        compiles.append([list(g) for g in groups])
        sizes.measured = True
        return [list(g) for g in groups]

    return target.cycle(
        sizes.n, sizes.truncating, together=True, limits=limits, compile_groups=compile_groups, sizes=sizes
    ), compiles


def test_groups_whose_sizes_the_compile_measures_are_formed_after_it_from_its_one_compile() -> None:
    """Delta: the rest of the cycle is compiled once, grouped by the measured sizes, applied from that compile."""
    target = TableByTable(bad=set())
    sizes = MeasuredLater(12, 1_000, {7})
    parts, compiles = measured_cycle(target, sizes, GroupLimits(cdb_max_bytes=3_500))
    parts.apply_from(0, 0)
    assert compiles == [[[f"x{i}" for i in range(12)]]]  # one compile job, of the whole cycle
    assert not sizes.by_driver
    assert target.parts == [[f"x{i}" for i in range(12)]]
    # cut by the measured sizes (3 of 1,000 bytes fit in 3,500): with the sizes before it, there would be no cut
    assert [(g["mode"], g["transactions"], g["cdb_bytes"]) for g in parts.groups] == [
        ("compiled", 3, 3_000),
        ("compiled", 3, 3_000),
        ("compiled", 1, 1_000),
        (LOG_ORDER, 1, 1_000),
        ("compiled", 3, 3_000),
        ("compiled", 1, 1_000),
    ]
    assert {g["applied"] for g in parts.groups} == {"together"}


def test_a_resumed_part_is_sized_by_the_driver_before_it_is_applied_and_the_rest_grouped_by_those_sizes() -> None:
    """A re-run resuming inside the cycle has no compile of the rest to wait for: the driver measures first."""
    target = TableByTable(bad=set())
    sizes = MeasuredLater(12, 1_000, set())
    parts, compiles = measured_cycle(target, sizes, GroupLimits(cdb_max_bytes=3_500))
    parts.apply_from(4, 6)
    assert sizes.by_driver
    assert target.parts == [["x4", "x5"], [f"x{i}" for i in range(6, 12)]]
    assert [(g["transactions"], g["cdb_bytes"]) for g in parts.groups] == [(2, 2_000), (3, 3_000), (3, 3_000)]
    assert compiles == []  # the part and then the rest, each compiled as it is applied


def test_a_cycle_whose_measured_sizes_make_one_group_is_applied_from_its_one_compile() -> None:
    target = TableByTable(bad=set())
    parts, compiles = measured_cycle(target, MeasuredLater(12, 10, set()), GroupLimits(cdb_max_bytes=3_500))
    parts.apply_from(0, 0)
    assert compiles == [[[f"x{i}" for i in range(12)]]] and target.parts == [[f"x{i}" for i in range(12)]]
    assert [(g["mode"], g["transactions"], g["cdb_bytes"]) for g in parts.groups] == [("compiled", 12, 120)]


def test_a_refused_cycle_whose_sizes_the_compile_measured_goes_group_by_group_by_those_sizes() -> None:
    target = TableByTable(bad={"x4"})
    parts, compiles = measured_cycle(target, MeasuredLater(12, 1_000, set()), GroupLimits(cdb_max_bytes=3_500))
    parts.apply_from(0, 0)
    assert target.passed == ["x4"]
    assert compiles[0] == [[f"x{i}" for i in range(12)]]
    # then the groups the measured sizes cut, compiled in one job, applied one by one; x4's group is split
    assert compiles[1] == [[f"x{i}" for i in range(j, min(j + 3, 12))] for j in range(0, 12, 3)]
    assert target.parts[0] == ["x0", "x1", "x2"] and target.parts[-2:] == [["x6", "x7", "x8"], ["x9", "x10", "x11"]]
    assert [x for part in target.parts for x in part] == [f"x{i}" for i in range(12) if i != 4]


def test_sizes_measured_in_the_compile_need_a_target_that_compiles_the_rest_as_one_part() -> None:
    with pytest.raises(ValueError, match="as one part"):
        CycleParts(
            cycle_id=1,
            order=["x0"],
            shapes=[txn(0)],
            apply_part=lambda part, xids: {},
            compile_groups=lambda groups: [],
            apply_compiled=lambda part, holder: {},
            discard=lambda holder: None,
            pass_transaction=lambda part, xid, error, action: None,
            progress=lambda through, end, changed, passing: None,
            describe=str,
            errors=ErrorsConfig(),
            together=False,
            sizes=MeasuredLater(1, 10, set()),
        )
