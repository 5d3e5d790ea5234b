"""The compile job's read tasks (applier.engine.sources): what executors read from pairs and spill files."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from applier.engine.buffers import BufferedTxn
from applier.engine.cycle_input import CycleInput
from applier.engine.image_checks import Refused
from applier.engine.sources import (
    BATCH_ROWS,
    PART_BYTES,
    SPILL_GROUPS_PER_CORE,
    TASKS_PER_CORE,
    ReadTask,
    _coalesced,
    commits_of,
    read_tasks,
    task_rows,
)
from applier.engine.spill import append_spill
from applier.intermediate.pairs import DAT_COLUMNS, PairRef

# Enough rows that a file is read in several batches.
ROWS = 2 * BATCH_ROWS + 500


def _dat_rows(xids: list[str], start: int = 1) -> pa.Table:
    """Rows cycling over ``xids``, lsn ``start``, ``start + 1``, ..., one insert each into ``s.t``."""
    n = len(xids)
    return pa.table(
        {
            "lsn": pa.array(range(start, start + ROWS), pa.int64()),
            "xid": [xids[i % n] for i in range(ROWS)],
            "table": ["s.t"] * ROWS,
            "op": ["I"] * ROWS,
            "before": pa.nulls(ROWS, pa.string()),
            "after": [f'{{"id":{i}}}' for i in range(ROWS)],
        }
    )


def _task(path: Path, seq: int | None, commits: dict[str, int], part: int = 0, parts: int = 1) -> ReadTask:
    return ReadTask(str(path), seq, part, parts, commits_of(commits, commits))


def _read(tasks: list[ReadTask], **options: Any) -> list[dict[str, Any]]:
    """The rows of ``tasks``, each its own group, all run in one partition."""
    return pa.Table.from_batches(list(task_rows([(t,) for t in tasks], range(len(tasks)), **options))).to_pylist()


def test_a_pair_yields_its_committed_rows_with_their_commit_lsn(tmp_path: Path) -> None:
    path = tmp_path / "000000007.dat"
    pq.write_table(_dat_rows(["a", "b", "open"]), path)

    rows = _read([_task(path, 7, {"a": 900, "b": 800})])

    assert len(rows) == ROWS - ROWS // 3  # every third row belongs to "open"
    assert {r["xid"] for r in rows} == {"a", "b"}
    assert all(r["commit_lsn"] == {"a": 900, "b": 800}[r["xid"]] for r in rows)
    assert {r["seq"] for r in rows} == {7}
    assert [r["lsn"] for r in rows] == [i + 1 for i in range(ROWS) if i % 3 != 2]
    assert list(rows[0]) == [*DAT_COLUMNS, "commit_lsn", "seq"]


@pytest.mark.parametrize("row_group_rows", [None, 7_000])
@pytest.mark.parametrize("parts", [2, 3])
def test_the_parts_of_a_pair_hold_each_of_its_rows_once(tmp_path: Path, parts: int, row_group_rows: int | None) -> None:
    path = tmp_path / "000000003.dat"
    pq.write_table(_dat_rows(["a"]), path, row_group_size=row_group_rows)

    each = [[r["lsn"] for r in _read([_task(path, 3, {"a": 9}, part, parts)])] for part in range(parts)]

    assert [lsn for lsns in each for lsn in lsns] == list(range(1, ROWS + 1))
    assert all(abs(len(lsns) - ROWS / parts) < 1 for lsns in each)


def test_keep_all_keeps_a_pairs_other_rows_with_a_null_commit_lsn(tmp_path: Path) -> None:
    path = tmp_path / "000000002.dat"
    pq.write_table(_dat_rows(["a", "open"]), path)

    rows = _read([_task(path, 2, {"a": 5})], keep_all=True)

    assert len(rows) == ROWS
    assert {(r["xid"], r["commit_lsn"]) for r in rows} == {("a", 5), ("open", None)}


def test_a_spill_file_yields_its_rows_without_a_seq(tmp_path: Path) -> None:
    path = tmp_path / "cfg_a.spill"
    first, second = _dat_rows(["a"]), _dat_rows(["a", "b"], start=ROWS + 1)
    append_spill(path, [first])
    append_spill(path, [second])  # a second spool: a second IPC stream in the file

    rows = _read([_task(path, None, {"a": 40, "b": 41})], keep_all=True)

    assert [r["lsn"] for r in rows] == list(range(1, 2 * ROWS + 1))
    assert {(r["xid"], r["commit_lsn"], r["seq"]) for r in rows} == {("a", 40, None), ("b", 41, None)}


@pytest.mark.parametrize("large", [False, True])
def test_each_pair_task_carries_only_its_own_transactions_commits(spark: Any, tmp_path: Path, large: bool) -> None:
    refs = []
    for seq, xids in ((1, ["a", "b"]), (2, ["b", "c"]), (3, ["d"])):
        path = tmp_path / f"00000000{seq}.dat"
        pq.write_table(_dat_rows(xids, start=seq * 100_000), path)
        size = 64 * PART_BYTES if large else path.stat().st_size  # the size a plan knows the pair by
        refs.append(PairRef(seq, path, path.with_suffix(".trn"), size))
    cycle = CycleInput(
        pairs=refs,
        commits={"a": 10, "b": 20, "c": 30, "z": 99},  # "d" stays open: pair 3 holds nothing committed
        xids_by_seq={1: {"a", "b"}, 2: {"b", "c"}, 3: {"d"}},
    )

    tasks = read_tasks(spark, cycle, {}, None)
    assert tasks is not None
    carried = {task.seq: task.commits.to_pydict() for (task,) in tasks.tasks}
    rows = tasks.rows().toArrow()

    assert carried == {1: {"xid": ["a", "b"], "commit_lsn": [10, 20]}, 2: {"xid": ["b", "c"], "commit_lsn": [20, 30]}}
    # Two pairs to read; a small one is not cut.
    parts = -(-TASKS_PER_CORE * spark.sparkContext.defaultParallelism // 2) if large else 1
    assert [(t.seq, t.part, t.parts) for (t,) in tasks.tasks] == [(s, p, parts) for s in (1, 2) for p in range(parts)]
    assert tasks.numbers().rdd.glom().map(len).collect() == [1] * len(tasks.tasks)  # one Spark task per read task

    def task_and_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, int]]:  # pickled by value
        from pyspark import TaskContext

        yield TaskContext.get().partitionId(), sum(batch.num_rows for batch in batches)

    per_task = sorted(tasks.collect(task_and_rows))  # the compile's way: an RDD job, a Spark task per read task
    assert [task for task, _ in per_task] == list(range(len(tasks.tasks)))
    assert sum(rows for _, rows in per_task) == 2 * ROWS
    assert rows.num_rows == 2 * ROWS
    assert sorted(set(zip(*rows.select(["xid", "commit_lsn", "seq"]).to_pydict().values(), strict=True))) == [
        ("a", 10, 1),
        ("b", 20, 1),
        ("b", 20, 2),
        ("c", 30, 2),
    ]


def test_the_first_part_of_a_checked_pair_checks_its_digest_before_reading_a_row(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "000000000001.dat"
    pq.write_table(_dat_rows(["a"]), path)
    right = hashlib.sha256(path.read_bytes()).hexdigest()
    ref = PairRef(1, path, path.with_suffix(".trn"), 64 * PART_BYTES)  # a large pair: cut into parts
    cycle = CycleInput(pairs=[ref], commits={"a": 10}, xids_by_seq={1: ("a",)}, unchecked={1: {}}, digests={1: right})
    checked = read_tasks(spark, cycle, {}, None, checks=True)
    assert checked is not None and len(checked.tasks) > 1
    assert [t.digest for (t,) in checked.tasks] == [right] + [""] * (len(checked.tasks) - 1)
    unchecked = read_tasks(spark, cycle, {}, None)  # a job that checks nothing (a later one of the cycle)
    assert unchecked is not None and {t.digest for (t,) in unchecked.tasks} == {""}
    first = checked.tasks[0][0]
    assert _read([first]) == _read([first._replace(digest="")]) != []  # the right digest: its part's rows

    wrong = first._replace(digest="0" * 64)
    with pytest.raises(Refused) as refused:  # the events step records it for the driver
        _read([wrong])
    assert (refused.value.seq, refused.value.code) == (1, "sha-mismatch")
    assert refused.value.detail == f"sha256 is {right}, header says {'0' * 64}"


def test_many_spill_files_are_read_in_a_few_spark_tasks(spark: Any, tmp_path: Path) -> None:
    taken = {}
    for n in range(40):  # one spill file per spooled transaction
        xid = f"x{n}"
        path = tmp_path / f"cfg_{xid}.spill"
        append_spill(path, [_dat_rows([xid], start=n * ROWS + 1).slice(0, 3)])
        taken[xid] = BufferedTxn(xid, 3, 0, None, None, path, 0)
    cycle = CycleInput(commits={xid: 1000 + i for i, xid in enumerate(taken)})

    tasks = read_tasks(spark, cycle, taken, None)
    assert tasks is not None
    rows = tasks.rows().toArrow()

    cores = spark.sparkContext.defaultParallelism
    assert len(tasks.tasks) == min(40, SPILL_GROUPS_PER_CORE * cores)
    assert sorted(t.path for group in tasks.tasks for t in group) == sorted(str(b.spill_path) for b in taken.values())
    assert rows.num_rows == 40 * 3
    assert set(zip(rows.column("xid").to_pylist(), rows.column("commit_lsn").to_pylist(), strict=True)) == {
        (xid, cycle.commits[xid]) for xid in taken
    }


def test_small_batches_are_joined_up_to_a_batch_in_order_and_a_large_one_stays_whole() -> None:
    small = [pa.RecordBatch.from_pydict({"v": [3 * i, 3 * i + 1, 3 * i + 2]}) for i in range(10)]
    large = pa.RecordBatch.from_pydict({"v": list(range(30, 55))})

    joined = list(_coalesced([*small, large], rows=10))

    assert [b.num_rows for b in joined] == [9, 9, 9, 3, 25]
    assert [v for b in joined for v in b.column(0).to_pylist()] == list(range(55))


def test_a_spill_file_of_many_small_spools_is_read_as_one_batch(tmp_path: Path) -> None:
    path = tmp_path / "cfg_a.spill"
    rows = _dat_rows(["a"])
    for start in range(0, 400, 2):  # 200 spools of two rows each
        append_spill(path, [rows.slice(start, 2)])

    batches = list(task_rows([(_task(path, None, {"a": 7}),)], [0]))

    assert [b.num_rows for b in batches] == [400]
    assert batches[0].column("lsn").to_pylist() == list(range(1, 401))
