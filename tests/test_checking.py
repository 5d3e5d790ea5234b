"""Image checks in worker processes give the same verdicts as checks in the driver."""

from __future__ import annotations

import pickle
from pathlib import Path

from applier.engine.checking import PairChecker
from applier.engine.reading import read_cycle
from applier.errors import InvalidChangeError
from applier.intermediate.pairs import list_pairs
from applier.intermediate.stream import StreamValidator
from handmade import ACCOUNTS, event, good_first_pair, row, write_pair


def _stream(directory: Path, bad_pair_2: bool) -> None:
    good_first_pair(directory)
    balance = "2.345" if bad_pair_2 else "2.34"
    write_pair(
        directory,
        2,
        [row(21, "t3", "I", after={"id": 3, "owner": "c", "balance": balance})],
        [event("begin", "t3", 20), event("commit", "t3", 22)],
    )
    write_pair(directory, 3, [], [event("commit", "t2", 30)], tables={"bank.accounts": ACCOUNTS})


def test_a_refusal_found_by_a_worker_names_the_pair_and_stops_the_cycle_there(tmp_path: Path) -> None:
    _stream(tmp_path, bad_pair_2=True)
    checker = PairChecker(workers=2, parallel_from_bytes=0)
    try:
        cycle = read_cycle(list(list_pairs(tmp_path).pairs), StreamValidator(), checker=checker)
    finally:
        checker.close()
    assert [p.seq for p in cycle.pairs] == [1]
    assert cycle.refused is not None and cycle.refused.code == "value-wrong-type" and cycle.refused.seq == 2
    assert "000000000002.dat" in str(cycle.refused) and "balance" in str(cycle.refused)


def test_workers_and_the_driver_read_a_good_cycle_alike(tmp_path: Path) -> None:
    _stream(tmp_path, bad_pair_2=False)
    refs = list(list_pairs(tmp_path).pairs)
    checker = PairChecker(workers=2, parallel_from_bytes=0)
    try:
        parallel = read_cycle(refs, StreamValidator(), checker=checker)
    finally:
        checker.close()
    alone = read_cycle(refs, StreamValidator())
    assert parallel.refused is None and alone.refused is None
    assert (parallel.commits, parallel.rollbacks, parallel.rows_read) == (
        alone.commits,
        alone.rollbacks,
        alone.rows_read,
    )
    assert parallel.commits == {"t1": 13, "t3": 22, "t2": 30}


def test_a_small_cycle_is_checked_in_the_driver() -> None:
    assert PairChecker(parallel_from_bytes=10**9).submit([]) == {}


def test_a_refusal_survives_crossing_a_process_boundary() -> None:
    error = InvalidChangeError(Path("/x/000000000002.dat"), 2, "op-invalid", "op X")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is InvalidChangeError and (copy.seq, copy.code, str(copy)) == (2, "op-invalid", str(error))
