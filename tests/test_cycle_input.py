"""What the driver keeps of a cycle's pairs per transaction (CycleInput), asked as the apply steps ask it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from applier.engine.cycle_input import (
    CycleInput,
    commit_lsns_in,
    commit_lsns_of,
    commit_positions,
    group_numbers,
    pairs_holding,
)
from applier.engine.reading import read_cycle
from applier.engine.sparkapply import narrowed
from applier.intermediate.pairs import list_pairs
from applier.intermediate.stream import StreamValidator
from handmade import ACCOUNTS, event, row, write_pair

TABLES = {"bank.accounts": ACCOUNTS, "bank.audit": ACCOUNTS}


def _image(n: int) -> dict:
    return {"id": n, "owner": "o", "balance": "1.00"}


def _cycle(tmp_path: Path) -> CycleInput:
    """Three pairs: a commits in 1; b spans 1-2 and commits in 2; c commits in 3; d stays open; e rolls back."""
    write_pair(
        tmp_path, 1,
        [row(11, "a", "I", after=_image(1)), row(12, "b", "I", after=_image(2), table="bank.audit"),
         row(13, "a", "I", after=_image(3), table="bank.audit")],
        [event("begin", "a", 9), event("begin", "b", 10), event("commit", "a", 14)],
        tables=TABLES,
    )  # fmt: skip
    write_pair(
        tmp_path, 2,
        [row(21, "b", "I", after=_image(4)), row(23, "d", "I", after=_image(5)), row(25, "e", "I", after=_image(6))],
        [event("begin", "d", 20), event("commit", "b", 22), event("begin", "e", 24), event("rollback", "e", 26)],
        tables=TABLES,
    )  # fmt: skip
    write_pair(
        tmp_path, 3,
        [row(32, "c", "I", after=_image(7), table="bank.audit")],
        [event("begin", "c", 31), event("commit", "c", 33)],
        tables=TABLES,
    )  # fmt: skip
    return read_cycle(list_pairs(tmp_path).pairs, StreamValidator(), defer_images=True)


def test_the_pair_of_each_commit_is_found_from_the_commit_lsns(tmp_path: Path) -> None:
    cycle = _cycle(tmp_path)
    assert {x: cycle.commit_seq(x) for x in ("a", "b", "c", "d", "e", "z")} == {
        "a": 1, "b": 2, "c": 3, "d": None, "e": None, "z": None,  # open, rolled back, unknown: no commit
    }  # fmt: skip
    part, _ = narrowed(cycle, {}, ["b"])
    assert part.commit_seq("b") == 2 and part.commit_seq("a") is None


def test_begin_times_are_kept_for_open_transactions_only(tmp_path: Path) -> None:
    assert set(_cycle(tmp_path).begun_at) == {"d"}


def test_rows_tables_and_pairs_of_transactions(tmp_path: Path) -> None:
    cycle = _cycle(tmp_path)
    assert cycle.rows_of(["a", "b"]) == 4 and cycle.rows_of(["c", "z"]) == 1 and cycle.rows_of([]) == 0
    assert cycle.tables_by_group([["a"], ["b", "c"], ["d"], ["z"]]) == [
        {"bank.accounts", "bank.audit"}, {"bank.accounts", "bank.audit"}, {"bank.accounts"}, set(),
    ]  # fmt: skip
    assert {x: cycle.rows_of([x]) for x in "abcdez"} == {"a": 2, "b": 2, "c": 1, "d": 1, "e": 1, "z": 0}
    assert [p.seq for p in pairs_holding(cycle, {"b"})] == [1, 2]
    assert [p.seq for p in pairs_holding(cycle, cycle.commits)] == [1, 2, 3]
    assert [p.seq for p in pairs_holding(cycle, ["c", "z"])] == [3]


def test_a_part_naming_every_commit_is_the_cycle_itself(tmp_path: Path) -> None:
    cycle = _cycle(tmp_path)
    whole, _ = narrowed(cycle, {}, ["c", "a", "b"])
    assert whole is cycle
    part, _ = narrowed(cycle, {}, ["c", "a"])
    assert part is not cycle and set(part.commits) == {"a", "c"}


def test_each_pair_knows_the_commits_of_its_rows(tmp_path: Path) -> None:
    """pair_commits: per pair, the committed xids with rows in it and their commit lsns, by xid."""
    found = {seq: table.to_pylist() for seq, table in _cycle(tmp_path).pair_commits.items()}
    assert found == {
        1: [{"xid": "a", "commit_lsn": 14}, {"xid": "b", "commit_lsn": 22}],  # b commits in the next pair
        2: [{"xid": "b", "commit_lsn": 22}],  # d is open, e rolled back
        3: [{"xid": "c", "commit_lsn": 33}],
    }


def test_xids_are_looked_up_in_the_commits_and_the_commit_order() -> None:
    commits = {"q": 40, "p": 10, "r": 25}
    xids = pa.array(["r", "zz", "p", "q", "p", ""])
    assert commit_lsns_in(commits, xids).to_pylist() == [25, None, 10, 40, 10, None]
    order_lsns = np.array([10, 25, 40])  # p, r, q
    wanted = commit_lsns_of(commits, xids)
    assert commit_positions(order_lsns, wanted).to_pylist() == [1, None, 0, 2, 0, None]
    # A commit that the order does not hold (a part's order, say) has no position, before, between or after.
    assert commit_positions(np.array([25]), wanted).to_pylist() == [0, None, None, None, None, None]
    assert commit_positions(np.array([10, 50]), commit_lsns_of({"a": 99}, pa.array(["a"]))).to_pylist() == [None]
    assert commit_positions(np.array([], np.int64), wanted).null_count == len(xids)
    assert len(commit_lsns_in(commits, pa.array([], pa.string()))) == 0


def test_groups_of_xids_are_found_by_commit_lsn_and_members_without_a_commit_by_name() -> None:
    commits = {"p": 10, "r": 25, "q": 40}
    xids = pa.array(["q", "open", "p", "r", "zz"])
    lsns = commit_lsns_of(commits, xids)
    every = group_numbers(commits, [["p", "r", "q"]])  # one group of every commit
    assert every(xids, lsns).to_pylist() == [0, None, 0, 0, None]
    assert group_numbers(commits, [["p", "r"], ["q"]])(xids, lsns).to_pylist() == [1, None, 0, 0, None]  # runs in order
    out_of_order = group_numbers(commits, [["q"], ["open", "p"]])
    assert out_of_order(xids, lsns).to_pylist() == [0, 1, 1, None, None]
    assert group_numbers(commits, [["open"]])(xids, lsns).to_pylist() == [None, 0, None, None, None]  # no commit at all
    # The lsns as the cycle's counts keep them (a minimum int: not committed): the same answers.
    wanted = np.array([40, np.iinfo(np.int64).min, 10, 25, np.iinfo(np.int64).min])
    assert group_numbers(commits, [["q"], ["open", "p"]])(xids, wanted).to_pylist() == [0, 1, 1, None, None]
    assert group_numbers(commits, [["p", "r"], ["q"]])(xids, wanted).to_pylist() == [1, None, 0, 0, None]
    assert commit_positions(np.array([10, 25, 40]), wanted).to_pylist() == [2, None, 0, 1, None]


def test_the_counts_commit_lsns_are_looked_up_once_and_a_part_looks_them_up_again(tmp_path: Path) -> None:
    cycle = _cycle(tmp_path)
    by_pair = [dict(zip(c["xid"].to_pylist(), lsns.tolist(), strict=True)) for c, lsns in
               zip(cycle.counts, cycle.counts_commit_lsns, strict=True)]  # fmt: skip
    gone = np.iinfo(np.int64).min
    assert by_pair == [{"a": 14, "b": 22}, {"b": 22, "d": gone, "e": gone}, {"c": 33}]
    assert cycle.counts_commit_lsns is cycle.counts_commit_lsns  # kept for the cycle
    part, _ = narrowed(cycle, {}, ["c", "a"])
    in_part = [dict(zip(c["xid"].to_pylist(), lsns.tolist(), strict=True)) for c, lsns in
               zip(part.counts, part.counts_commit_lsns, strict=True)]  # fmt: skip
    assert in_part == [{"a": 14, "b": gone}, {"b": gone, "d": gone, "e": gone}, {"c": 33}]  # b is not in the part
