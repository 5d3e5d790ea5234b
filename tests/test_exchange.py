"""The compile's exchange (applier.engine.exchange): events go from one Python step to the next as Arrow files."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from applier.engine import exchange
from applier.engine.events import EVENT_SCHEMA

COMMITTED_DDL = "lsn long, xid string, `table` string, op string, before string, after string, commit_lsn long"
TABLES = ["s.accounts", "s.orders", "erp.t0001", "crm.t0722", "ops.t0080"]


def _events(rng: random.Random, count: int, salts: int = 1) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "table": rng.choice(TABLES),
                "key": f"[{rng.randrange(500)}]".encode(),
                "commit_lsn": i,
                "lsn": i,
                "present": True,
                "existed": False,
                "n": 1,
                "image": f"image {i}",
                "salt": rng.randrange(salts),
                "group": 0,
                "first_commit_lsn": i,
                "first_lsn": i,
            }
            for i in range(count)
        ],
        schema=EVENT_SCHEMA,
    )


def _rows(table: pa.Table) -> Counter[str]:
    return Counter(json.dumps(row, default=repr, sort_keys=True) for row in table.to_pylist())


class _Task:
    """Stands for Spark's TaskContext of the task with partition id ``number``."""

    def __init__(self, number: int) -> None:
        self.number = number

    def partitionId(self) -> int:
        return self.number


@pytest.fixture
def task(monkeypatch: pytest.MonkeyPatch) -> _Task:
    import pyspark

    running = _Task(3)
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: running))
    return running


def test_a_table_and_salt_always_meet_in_one_partition_and_a_busy_tables_salts_spread() -> None:
    events = _events(random.Random(1), 2_000, salts=4)
    where = exchange.partition_of(events.to_batches()[0], 8)
    met: dict[tuple[str, int], set[int]] = {}
    for table, salt, partition in zip(
        events.column("table").to_pylist(), events.column("salt").to_pylist(), where.tolist(), strict=True
    ):
        met.setdefault((table, salt), set()).add(partition)
        assert 0 <= partition < 8
    assert all(len(partitions) == 1 for partitions in met.values())
    for table in TABLES:  # four salts of one table: four partitions
        assert len({next(iter(met[(table, salt)])) for salt in range(4)}) == 4, table


def test_the_partitions_are_the_same_in_every_process(tmp_path: Path) -> None:
    """Each executor partitions its own events: Python's randomised string hash would scatter a table."""
    events = _events(random.Random(2), 300, salts=3)
    with pa.ipc.new_file(str(tmp_path / "events.arrow"), EVENT_SCHEMA) as writer:
        writer.write_table(events)
    script = (
        "import sys, pyarrow as pa; from applier.engine.exchange import partition_of; "
        "b = pa.ipc.open_file(sys.argv[1]).get_batch(0); print(partition_of(b, 7).tolist())"
    )
    seen = set()
    for seed in ("1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "events.arrow")],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        seen.add(done.stdout)
    assert len(seen) == 1 and seen.pop().strip() == str(exchange.partition_of(events.to_batches()[0], 7).tolist())


def test_each_partition_reads_back_exactly_its_events_from_every_tasks_file(tmp_path: Path) -> None:
    rng = random.Random(3)
    written = [_events(rng, 700, salts=2), _events(rng, 500, salts=2), _events(rng, 0)]
    locations = []
    for events in written:  # three tasks, outside Spark: each its own file
        locations += list(exchange.write(str(tmp_path), 5, events.to_batches(max_chunksize=128)))
    assert len(list(tmp_path.glob("*.arrow"))) == 2  # a task without events writes no file
    received = exchange.by_partition(locations)
    assert 1 < len(received) <= 5
    everything: Counter[str] = Counter()
    for where in received:
        part = pa.Table.from_batches(list(exchange.read(where)), schema=EVENT_SCHEMA)
        assert len({p for b in part.to_batches() for p in exchange.partition_of(b, 5).tolist()}) == 1
        everything += _rows(part)
    assert everything == _rows(pa.concat_tables(written))
    exchange.remove(tmp_path)
    assert not tmp_path.exists()


def test_a_task_that_fails_leaves_no_file_and_its_next_attempt_writes_it_whole(tmp_path: Path, task: _Task) -> None:
    events = _events(random.Random(4), 400)

    def failing() -> Iterator[pa.RecordBatch]:
        yield from events.to_batches(max_chunksize=100)[:2]
        raise OSError("executor lost")

    with pytest.raises(OSError, match="executor lost"):
        list(exchange.write(str(tmp_path), 4, failing()))
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary
    out = list(exchange.write(str(tmp_path), 4, events.to_batches(max_chunksize=100)))
    again = list(exchange.write(str(tmp_path), 4, events.to_batches(max_chunksize=100)))
    assert [p.name for p in tmp_path.iterdir()] == ["3.arrow"]  # named after the task: a retry replaces it
    assert out == again and {row["path"] for row in out} == {str(tmp_path / "3.arrow")}
    back = pa.concat_tables(
        pa.Table.from_batches(list(exchange.read(where)), schema=EVENT_SCHEMA) for where in exchange.by_partition(out)
    )
    assert _rows(back) == _rows(events)


@pytest.mark.spark
def test_the_compile_nets_through_the_exchange_and_removes_it(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from applier.engine.netting import net_changes
    from applier.intermediate.schema import Column, TableDef

    table = TableDef("s.t", (Column("id", "int", False), Column("v", "string", True)), ("id",))
    rows = [(i, "x", "s.t", "I", None, json.dumps({"id": i % 50, "v": f"v{i}"}), 100 + i) for i in range(400)]
    frame = spark.createDataFrame(rows, COMMITTED_DDL)
    crossed: list[Path] = []
    remove = exchange.remove
    monkeypatch.setattr(
        exchange, "remove", lambda folder: (crossed.extend(Path(folder).glob("*.arrow")), remove(folder))
    )
    chunks = net_changes(frame, {"s.t": table}, {}, str(tmp_path), partitions=3)
    assert crossed, "the events crossed in exchange files"
    assert not (tmp_path / exchange.FOLDER).exists()
    assert sum(chunk["I"] for chunk in chunks) == 50 and not any(chunk["U"] or chunk["D"] for chunk in chunks)


def test_two_attempts_of_one_task_stage_their_files_apart(tmp_path: Path) -> None:
    """A speculative attempt on another machine may run under the same pid: its staged file is its own."""
    from applier.engine.part_files import temporary

    final = tmp_path / "3.arrow"
    first, second = temporary(final), temporary(final)
    assert first != second and first.parent == second.parent == tmp_path
    assert first.name.startswith(".3.arrow.") and second.name.startswith(".3.arrow.")  # hidden until moved
