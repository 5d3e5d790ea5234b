"""Row images are checked by Spark's executors in the compile job; a refusal there still cuts the cycle at its pair.

The driver reads a cycle's pairs without checking their images' values; the
compile job checks every row of those pairs (committed, rolled back or still
open) against its own pair's definitions. A bad image found there makes the run
re-read from its checkpoint with the driver checking, so the refused pair is
named and everything before it is applied and checkpointed, as when the driver
refused it at reading.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from applier.engine.checkpoint import CheckpointStore
from applier.engine.events import event_batch, event_batches
from applier.engine.image_checks import Refused, first_refusal, record_refusal
from applier.errors import IntermediateFileError
from applier.intermediate.schema import parse_table_def
from engine_support import make_config, run, target_tables
from handmade import ACCOUNTS, event, row, write_pair

ACCOUNTS_DEF = parse_table_def("bank.accounts", ACCOUNTS)
BAD = {"id": 7, "owner": "eve", "balance": "not a number"}


def _batch(rows: list[dict[str, Any]], seqs: list[int], commits: list[int | None]) -> pa.RecordBatch:
    columns = {name: [r[name] for r in rows] for name in ("lsn", "xid", "table", "op", "before", "after")}
    return pa.RecordBatch.from_pydict({**columns, "seq": seqs, "commit_lsn": commits})


def test_the_executors_refuse_what_the_reader_refuses_naming_the_pair_and_row() -> None:
    good = row(11, "t1", "I", after={"id": 1, "owner": "ann", "balance": "1.50"})
    bad = row(12, "t2", "I", after=BAD)
    checks = {2: {"bank.accounts": ACCOUNTS_DEF}}

    def check_batch(batch: pa.RecordBatch, checks: dict[int, Any]) -> None:  # the compile's first step
        event_batch(batch, {"bank.accounts": ACCOUNTS_DEF}, {}, checks=checks)

    check_batch(_batch([good], [2], [13]), checks)  # a good row passes
    check_batch(_batch([bad], [5], [None]), checks)  # a pair not to be checked is not
    with pytest.raises(Refused) as refused:
        check_batch(_batch([good, bad], [2, 2], [13, None]), checks)  # not committed here: checked all the same
    assert (refused.value.seq, refused.value.code) == (2, "value-wrong-type")
    assert refused.value.detail.startswith("row lsn 12 (xid t2, table bank.accounts)")
    missing = row(14, "t3", "U", before={"owner": "x"}, after={"id": 1, "owner": "ann", "balance": "1.50"})
    with pytest.raises(Refused, match=r"\[key-column-missing\]"):
        check_batch(_batch([missing], [2], [15]), checks)


def test_a_partition_records_its_refusal_and_ends_and_the_driver_reads_the_lowest_pairs(tmp_path: Path) -> None:
    good = [row(11, "t1", "I", after={"id": 1, "owner": "ann", "balance": "1.50"})]
    tables = {"bank.accounts": ACCOUNTS_DEF}
    checks = {2: tables, 3: tables}

    def partition(*batches: pa.RecordBatch) -> list[pa.RecordBatch]:  # what Spark runs over a partition
        return list(event_batches(tables, {}, {}, [], checks, str(tmp_path), iter(batches)))

    assert partition(_batch(good, [2], [13]))[0].num_rows == 1  # nothing refused: its events
    assert partition(_batch([row(31, "t3", "I", after=BAD)], [3], [33]), _batch(good, [2], [13])) == []
    (recorded,) = tmp_path.glob("refused-*.json")
    assert "row lsn 31" in recorded.read_text() and not list(tmp_path.glob(".*"))  # whole: no temporary left
    record_refusal(str(tmp_path), Refused(2, "row lsn 22 (xid t2, table bank.accounts) bad", "value-wrong-type"))
    first = first_refusal(tmp_path)  # two partitions refused at once: the lower pair's
    assert first is not None and (first.seq, first.code) == (2, "value-wrong-type") and "row lsn 22" in first.detail
    assert first_refusal(tmp_path) is None, "read once"
    assert partition(_batch(good, [2], [13]))[0].num_rows == 1, "a later job is not stopped by an old refusal"
    with pytest.raises(Refused):  # a job without a folder for them raises it
        list(
            event_batches(tables, {}, {}, [], checks, None, iter([_batch([row(22, "t2", "I", after=BAD)], [2], [23])]))
        )


def test_once_a_pair_is_refused_the_other_partitions_stop_at_their_next_batch(tmp_path: Path) -> None:
    good = _batch([row(11, "t1", "I", after={"id": 1, "owner": "ann", "balance": "1.50"})], [2], [13])
    tables = {"bank.accounts": ACCOUNTS_DEF}
    read: list[int] = []

    def batches() -> Iterator[pa.RecordBatch]:
        for n in range(3):
            read.append(n)
            if n == 1:  # another partition refuses a pair meanwhile
                refused = Refused(7, "row lsn 70 (xid t7, table bank.accounts) bad", "value-wrong-type")
                record_refusal(str(tmp_path), refused)
            yield good

    events = list(event_batches(tables, {}, {}, [], {2: tables}, str(tmp_path), batches()))
    assert read == [0, 1] and events == []  # the second batch was not compiled, the third not read
    assert list(event_batches(tables, {}, {}, [], None, str(tmp_path), iter([good])))  # a job that checks nothing


def test_only_committed_rows_give_events_once_checked() -> None:
    rows = [
        row(11, "t1", "I", after={"id": 1, "owner": "ann", "balance": "1.50"}),
        row(12, "t2", "I", after={"id": 2, "owner": "bob", "balance": "2.00"}),
    ]
    tables = {"bank.accounts": ACCOUNTS_DEF}
    events = event_batch(_batch(rows, [1, 1], [13, None]), tables, {}, checks={1: tables})
    assert events.column("lsn").to_pylist() == [11]


def _three_pairs(folder: Path, where: str) -> None:
    """Pair 1 commits t1; pair 2 holds a bad image in a transaction that ``where`` says; pair 3 commits t9."""
    write_pair(
        folder,
        1,
        [row(11, "t1", "I", after={"id": 1, "owner": "ann", "balance": "1.50"})],
        [event("begin", "t1", 10), event("commit", "t1", 12), event("begin", "t5", 13)],
    )
    ending = {"committed": "commit", "rolled-back": "rollback"}
    events = [event("begin", "t2", 20)] + ([event(ending[where], "t2", 23)] if where in ending else [])
    bad_xid = "t5" if where == "open-since-pair-1" else "t2"
    rows = [
        row(21, "t2", "I", after={"id": 2, "owner": "bob", "balance": "2.00"}),
        row(22, bad_xid, "I", after=BAD),
    ]
    write_pair(folder, 2, rows, events)
    write_pair(
        folder,
        3,
        [row(31, "t9", "I", after={"id": 9, "owner": "zed", "balance": "9.00"})],
        [event("begin", "t9", 30), event("commit", "t9", 32)],
    )


@pytest.mark.spark
@pytest.mark.parametrize("where", ["committed", "rolled-back", "open", "open-since-pair-1"])
def test_a_bad_image_found_by_spark_refuses_its_pair_after_applying_the_pairs_before(
    tmp_path: Path, spark: Any, target_settings: list[str], where: str, caplog: pytest.LogCaptureFixture
) -> None:
    _three_pairs(tmp_path / "in", where)
    config = make_config(tmp_path, tmp_path / "in", target_settings)
    with caplog.at_level(logging.INFO, logger="applier"), pytest.raises(IntermediateFileError) as refused:
        run(config, spark)
    assert refused.value.seq == 2 and refused.value.code == "value-wrong-type"
    assert "000000000002.dat" in str(refused.value) and "row lsn 22" in str(refused.value)
    # The driver read all three pairs in one cycle; the executors found the bad image.
    assert "pair 2 refused by Spark's image check" in caplog.text
    checkpoint = CheckpointStore(config.work_dir).load()
    assert checkpoint.applied_seq == 1
    assert target_tables(config, ["bank.accounts"])["bank.accounts"] == [[1, "ann", Decimal("1.50")]]
    assert not (config.work_dir / "intent.json").exists()


@pytest.mark.spark
def test_a_cycle_that_compiles_nothing_has_its_images_checked_in_the_driver(tmp_path: Path, spark: Any) -> None:
    folder = tmp_path / "in"
    write_pair(
        folder, 1, [row(11, "t1", "I", after={"id": 1, "owner": "a", "balance": "1"})], [event("begin", "t1", 10)]
    )
    write_pair(folder, 2, [row(21, "t1", "I", after=BAD)], [])
    config = make_config(tmp_path, folder)
    with pytest.raises(IntermediateFileError) as refused:
        run(config, spark)
    assert refused.value.seq == 2 and refused.value.code == "value-wrong-type"
    assert CheckpointStore(config.work_dir).load().applied_seq == 1
