"""Rows of transactions still open after a cycle: written out by the compile's read tasks, else read by the driver."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from applier.engine import open_rows
from applier.engine.buffers import TransactionBuffers
from applier.engine.cycle_input import CycleInput
from applier.engine.open_rows import buffer_open_rows, plan
from applier.engine.part_files import written_parts
from applier.engine.reading import read_cycle
from applier.engine.sources import ReadTask, commits_of, task_rows
from applier.generate import generate_workload
from applier.intermediate.pairs import list_pairs
from applier.intermediate.stream import StreamValidator
from engine_support import assert_target_equals_reference, make_config, run

PARTS = 3


def open_rows_by_hand(dats: list[Path], still_open: set[str]) -> dict[str, list[dict[str, object]]]:
    """Per open xid, its rows of ``dats`` in file order, in plain Python."""
    found: dict[str, list[dict[str, object]]] = {}
    for dat in dats:
        for row in pq.read_table(dat, columns=["lsn", "xid", "table", "op", "before", "after"]).to_pylist():
            if row["xid"] in still_open:
                found.setdefault(row["xid"], []).append(row)
    return found


def buffered(buffers: TransactionBuffers, xids: set[str]) -> dict[str, list[dict[str, object]]]:
    out = {}
    for xid in sorted(xids):
        taken = buffers.take(xid)
        assert taken is not None and taken.memory is not None, xid
        out[xid] = taken.memory.select(["lsn", "xid", "table", "op", "before", "after"]).to_pylist()
    return out


@pytest.fixture
def cycle(tmp_path: Path) -> tuple[CycleInput, set[str]]:
    """Three pairs of a workload whose transactions span pairs: some are still open after them."""
    generate_workload(tmp_path / "in", seed=5, transactions=200, file_size_mb=0.02, profile="demo")
    validator = StreamValidator()
    read = read_cycle(list(list_pairs(tmp_path / "in").pairs)[:3], validator, defer_images=True)
    still_open = set(validator.state.open_xids)
    assert still_open and len(read.pairs) == 3
    return read, still_open


def run_tasks(read: CycleInput, folder: Path, *, skip: tuple[int, int] | None = None) -> None:
    """Read every part of every pair as the first compile job does (nothing committed), skipping part ``skip``."""
    opened = read.open_after
    assert opened is not None
    tasks = [
        (ReadTask(str(ref.dat_path), ref.seq, part, PARTS, commits_of({}, []), "", opened.xids.get(ref.seq)),)
        for ref in read.pairs
        for part in range(PARTS)
        if (ref.seq, part) != skip
    ]
    kept = sum(b.num_rows for b in task_rows(tasks, range(len(tasks)), keep_all=True, open_into=str(folder)))
    if skip is None:
        assert kept == read.rows_read, "every row passes on to the compile, open or not"


def test_the_read_tasks_write_the_open_rows_the_driver_then_buffers(tmp_path: Path, cycle: tuple) -> None:
    read, still_open = cycle
    folder = tmp_path / "open"
    read.open_after = plan(read, still_open, folder)
    assert sorted(read.open_after.xids) == [
        ref.seq
        for ref in read.pairs
        if still_open & set(pq.read_table(ref.dat_path, columns=["xid"]).column("xid").to_pylist())
    ]

    run_tasks(read, folder)
    written = sorted(p.name for p in folder.iterdir())
    parts = [f"open-{seq}-{part}-{PARTS}.arrow" for seq in read.open_after.xids for part in range(PARTS)]
    assert written == sorted(parts)

    with TransactionBuffers(tmp_path / "spill", "c", 1 << 30) as buffers:
        reads = []
        original = open_rows.read_dat_rows
        try:
            open_rows.read_dat_rows = lambda *args: reads.append(args) or original(*args)  # type: ignore[assignment]
            buffer_open_rows(read, read.open_after, buffers)
        finally:
            open_rows.read_dat_rows = original  # type: ignore[assignment]
        assert reads == [], "every pair came from the tasks' files: the driver decoded none"
        assert not folder.exists(), "the files go once buffered"
        assert {t.xid: t.first_seen for t in buffers.open_transactions()} == {
            xid: min(seq for seq, xids in read.open_after.xids.items() if xid in xids.to_pylist()) for xid in still_open
        }
        assert buffered(buffers, still_open) == open_rows_by_hand([ref.dat_path for ref in read.pairs], still_open)


def test_a_pair_a_task_did_not_write_whole_is_read_by_the_driver(tmp_path: Path, cycle: tuple) -> None:
    read, still_open = cycle
    folder = tmp_path / "open"
    read.open_after = plan(read, still_open, folder)
    last = max(read.open_after.xids)
    run_tasks(read, folder, skip=(last, PARTS - 1))  # the part holding the rows begun at the cycle's very end
    assert not (folder / f"open-{last}-{PARTS - 1}-{PARTS}.arrow").exists()

    with TransactionBuffers(tmp_path / "spill", "c", 1 << 30) as buffers:
        buffer_open_rows(read, read.open_after, buffers)
        assert buffered(buffers, still_open) == open_rows_by_hand([ref.dat_path for ref in read.pairs], still_open)


def test_without_a_folder_the_driver_reads_every_pair(tmp_path: Path, cycle: tuple) -> None:
    read, still_open = cycle
    opened = plan(read, still_open)
    assert opened.folder == "" and opened.xids
    with TransactionBuffers(tmp_path / "spill", "c", 1 << 30) as buffers:
        buffer_open_rows(read, opened, buffers)
        assert buffered(buffers, still_open) == open_rows_by_hand([ref.dat_path for ref in read.pairs], still_open)


def test_a_new_plan_empties_the_folder_of_an_earlier_cycle(tmp_path: Path, cycle: tuple) -> None:
    read, still_open = cycle
    folder = tmp_path / "open"
    folder.mkdir()
    (folder / f"open-{read.pairs[0].seq}-0-1.arrow").write_bytes(b"")  # a stopped run's: no rows, in one part
    opened = plan(read, still_open, folder)
    assert list(folder.iterdir()) == []
    with TransactionBuffers(tmp_path / "spill", "c", 1 << 30) as buffers:
        buffer_open_rows(read, opened, buffers)
        assert buffered(buffers, still_open) == open_rows_by_hand([ref.dat_path for ref in read.pairs], still_open)


def test_a_task_writes_its_part_as_it_reads_even_without_rows_and_rewrites_it_whole(tmp_path: Path) -> None:
    rows = pa.RecordBatch.from_pydict({"lsn": pa.array([1, 2, 3], pa.int64()), "xid": ["a", "a", "b"]})
    empty = open_rows.Recorder(str(tmp_path), 7, 0, 2)
    empty.write(rows.slice(0, 0))
    empty.close()
    for attempt in range(2):  # a task retried
        recorder = open_rows.Recorder(str(tmp_path), 7, 1, 2)
        recorder.write(rows.slice(0, 2))
        recorder.write(rows.slice(2))
        assert recorder.path.exists() == bool(attempt), "the file is in place only once whole"
        recorder.close()
    assert (tmp_path / "open-7-0-2.arrow").stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["open-7-0-2.arrow", "open-7-1-2.arrow"]
    whole = {7: [tmp_path / "open-7-0-2.arrow", tmp_path / "open-7-1-2.arrow"]}
    assert written_parts(tmp_path, open_rows.PREFIX, open_rows.SUFFIX)[0] == whole
    again = pa.ipc.open_stream(pa.memory_map(str(tmp_path / "open-7-1-2.arrow"))).read_all()
    assert again.to_pydict() == {"lsn": [1, 2, 3], "xid": ["a", "a", "b"]}
    failed = open_rows.Recorder(str(tmp_path), 8, 0, 1)
    failed.write(rows)  # its task dies here
    assert written_parts(tmp_path, open_rows.PREFIX, open_rows.SUFFIX)[0].keys() == {7}


def test_a_run_in_small_cycles_buffers_what_its_compile_jobs_wrote_and_equals_the_reference(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Transactions span the cycles: most leave some open; a cycle that commits nothing runs no job."""
    generate_workload(tmp_path / "in", seed=11, transactions=300, file_size_mb=0.05, profile="demo")
    config = make_config(tmp_path, tmp_path / "in", process_intermediate_size_per_job=0.2)
    read_here: list[int] = []
    original = open_rows.read_dat_rows
    monkeypatch.setattr(
        open_rows, "read_dat_rows", lambda path, xids: read_here.append(int(path.stem)) or original(path, xids)
    )

    summary = run(config, spark)

    assert len(summary.reports) > 2
    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]
    compiled = {seq for r in reports if r["committed"] for seq in r["seqs"]}
    assert sum(1 for r in reports if r["committed"] and r["open"]) >= 2
    assert not compiled & set(read_here), "the driver decoded no pair of a compiled cycle for its open rows"
    assert not any(config.spill_dir.glob("*--open*")), "the folder goes once its rows are buffered"
    assert_target_equals_reference(config, tmp_path / "in")
