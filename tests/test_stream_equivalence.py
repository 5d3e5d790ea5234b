"""The stream validator judges a pair's transactions by their rows' spans; it finds what a walk over every record finds.

The reference here follows the spec's rules record by record (rows and events
merged in lsn order, a begin first and an end last at an equal lsn), written
apart from the validator. Random pairs over a few transactions, many of them
breaking the rules, must give the same verdict: the same defect code at the
same lsn, or the same open and ended transactions.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from applier.errors import TransactionSequenceError
from applier.intermediate.pairs import list_pairs
from applier.intermediate.reader import read_pair
from applier.intermediate.stream import StreamValidator
from handmade import event, row, write_pair


def reference(
    records: list[tuple[int, str, str]], open_before: set[str], ended_before: set[str], trusted: bool
) -> tuple[str, int] | tuple[set[str], set[str]]:
    """``(code, lsn)`` of the first defect, or ``(open, ended)`` after the pair."""
    rank = {"begin": 0, "row": 1, "commit": 2, "rollback": 2}
    now_open, now_ended = set(open_before), set()
    for lsn, kind, xid in sorted(records, key=lambda r: (r[0], rank[r[1]])):
        finished = xid in now_ended or xid in ended_before
        if kind == "begin":
            if xid in now_open or finished:
                return "second-begin", lsn
            now_open.add(xid)
        elif finished:
            return ("row-after-end" if kind == "row" else "second-end"), lsn
        elif xid not in now_open and not trusted:
            return ("row-without-begin" if kind == "row" else "end-without-begin"), lsn
        elif kind != "row":
            now_open.discard(xid)
            now_ended.add(xid)
    return now_open, now_ended


def _random_pair(rng: random.Random) -> tuple[list[tuple[int, str, str]], list[dict], list[dict]]:
    xids = [f"x{i}" for i in range(rng.randint(1, 4))]
    records: list[tuple[int, str, str]] = []
    rows: list[dict] = []
    events: list[dict] = []
    lsn = 100
    for _ in range(rng.randint(1, 12)):
        lsn += rng.choice([0, 1, 1, 2])  # a row and an event may share an lsn
        xid = rng.choice(xids)
        kind = rng.choices(["row", "begin", "commit", "rollback"], [5, 2, 2, 1])[0]
        if kind == "row":
            if rows and rows[-1]["lsn"] == lsn:
                continue
            rows.append(row(lsn, xid, "I", after={"id": lsn, "owner": "o", "balance": "1.00"}))
        else:
            if events and events[-1]["lsn"] == lsn:
                continue
            events.append(event(kind, xid, lsn))
        records.append((lsn, kind, xid))
    return records, rows, events


@pytest.mark.parametrize("seed", range(300))
def test_row_spans_find_what_a_walk_over_every_record_finds(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    records, rows, events = _random_pair(rng)
    xids = sorted({xid for _, _, xid in records})
    open_before = {x for x in xids if rng.random() < 0.3}
    ended_before = {x for x in xids if x not in open_before and rng.random() < 0.2}
    trusted = rng.random() < 0.2
    write_pair(tmp_path, 1, rows, events)
    pair = read_pair(list_pairs(tmp_path).pairs[0])
    validator = StreamValidator(trusted_through_seq=1 if trusted else 0)
    validator.state.open_xids = {x: 3 for x in open_before}
    validator.state.ended_xids.add_all(sorted(ended_before))
    want = reference(records, open_before, ended_before, trusted)
    if isinstance(want[0], str):
        with pytest.raises(TransactionSequenceError) as refused:
            validator.check(pair)
        assert (refused.value.code, f"at lsn {want[1]}") == (want[0], refused.value.detail[-len(f"at lsn {want[1]}") :])
        return
    validator.check(pair)
    assert set(validator.state.open_xids) == want[0]
    assert all(x in validator.state.ended_xids for x in want[1])


def test_sound_pairs_found_set_wise_end_as_the_walk_leaves_them(tmp_path: Path) -> None:
    """A pair the set-wise test passes leaves the same open (with their pairs, in order) and ended xids as the walk."""
    compared = 0
    for seed in range(600):
        rng = random.Random(seed)
        records, rows, events = _random_pair(rng)
        xids = sorted({xid for _, _, xid in records})
        folder = tmp_path / str(seed)
        write_pair(folder, 1, rows, events)
        pair = read_pair(list_pairs(folder).pairs[0])
        validator = StreamValidator(trusted_through_seq=1 if rng.random() < 0.2 else 0)
        validator.state.open_xids = {x: 3 for x in xids if rng.random() < 0.3}
        validator.state.ended_xids.add_all(sorted(x for x in xids if rng.random() < 0.1))
        sound = validator._sound_transactions(pair)
        if sound is None:
            continue
        compared += 1
        walked = validator._walk_transactions(pair)
        assert (list(sound[0].items()), list(sound[1])) == (list(walked[0].items()), list(walked[1])), seed
    assert compared >= 40  # the random pairs do pass the set-wise test often enough to compare
