"""Each table's longest image in a cycle, measured by the compile's read tasks or by the driver (engine.measuring)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from applier.engine.cycle_input import CycleInput
from applier.engine.measuring import measure_rest, note_measured, record_lengths
from applier.engine.reading import read_cycle
from applier.engine.sources import ReadTask, commits_of, task_rows
from applier.generate import generate_workload
from applier.intermediate.pairs import list_pairs
from applier.intermediate.stream import StreamValidator


def longest_by_hand(folder: Path) -> dict[str, int]:
    """Per table, the longest ``before`` or ``after`` image (bytes) of every ``.dat`` of ``folder``, in plain Python."""
    longest: dict[str, int] = {}
    for dat in sorted(folder.glob("*.dat")):
        for row in pq.read_table(dat, columns=["table", "before", "after"]).to_pylist():
            for image in (row["before"], row["after"]):
                if image is not None:
                    n = len(image.encode("utf-8") if isinstance(image, str) else image)
                    longest[row["table"]] = max(longest.get(row["table"], 0), n)
    return longest


def test_a_pair_counts_as_measured_once_every_one_of_its_parts_came_back(tmp_path: Path) -> None:
    cycle = CycleInput()
    cycle.unmeasured.update({5, 6})
    record_lengths(str(tmp_path), 5, 0, 2, {"s.a": 40, "s.b": 7})
    record_lengths(str(tmp_path), 5, 1, 2, {"s.a": 90})
    record_lengths(str(tmp_path), 6, 1, 2, {"s.a": 500})  # part 0 of pair 6 never came back

    note_measured(cycle, tmp_path)

    assert cycle.longest_image == {"s.a": 90, "s.b": 7}
    assert cycle.unmeasured == {6}
    assert list(tmp_path.iterdir()) == [], "a job's files go once read"


def test_the_driver_measures_what_no_job_did_as_it_would_have_while_reading(tmp_path: Path) -> None:
    generate_workload(tmp_path / "in", seed=3, transactions=60, file_size_mb=0.02, profile="demo")
    refs = list(list_pairs(tmp_path / "in").pairs)
    while_reading = read_cycle(refs, StreamValidator(), defer_images=True)
    later = read_cycle(refs, StreamValidator(), defer_images=True, measure=False)
    assert later.longest_image == {} and later.unmeasured == {ref.seq for ref in refs}

    measure_rest(later)

    assert later.unmeasured == set()
    assert later.longest_image == while_reading.longest_image == longest_by_hand(tmp_path / "in")


def test_read_tasks_measure_every_row_of_their_part_committed_or_not(tmp_path: Path) -> None:
    """The parts of each pair, read as the compile job reads them with only one transaction committed."""
    generate_workload(tmp_path / "in", seed=4, transactions=60, file_size_mb=0.02, profile="demo")
    refs = list(list_pairs(tmp_path / "in").pairs)
    assert len(refs) > 1
    folder = tmp_path / "job"
    folder.mkdir()
    tasks = []
    for ref in refs:
        first = pq.read_table(ref.dat_path, columns=["xid"]).column("xid")[0].as_py()
        commits = commits_of({first: 1}, [first])
        tasks.extend((ReadTask(str(ref.dat_path), ref.seq, part, 3, commits),) for part in range(3))

    kept = sum(b.num_rows for b in task_rows(tasks, range(len(tasks)), measure_into=str(folder)))

    assert kept < sum(pq.ParquetFile(ref.dat_path).metadata.num_rows for ref in refs)
    assert len(list(folder.glob("images-*.json"))) == 3 * len(refs)
    cycle = CycleInput()
    cycle.unmeasured.update(ref.seq for ref in refs)
    note_measured(cycle, folder)
    assert cycle.unmeasured == set()
    assert cycle.longest_image == longest_by_hand(tmp_path / "in")


def test_read_tasks_measure_nothing_unless_asked(tmp_path: Path) -> None:
    generate_workload(tmp_path / "in", seed=4, transactions=20, file_size_mb=0.02, profile="demo")
    ref = list_pairs(tmp_path / "in").pairs[0]
    task = ReadTask(str(ref.dat_path), ref.seq, 0, 1, commits_of({}, []))
    list(task_rows([(task,)], [0]))
    assert not list(tmp_path.glob("**/images-*.json"))
    record_lengths(str(tmp_path), ref.seq, 0, 1, {"s.t": 3})
    assert json.loads((tmp_path / f"images-{ref.seq}-0-1.json").read_text()) == {"s.t": 3}
