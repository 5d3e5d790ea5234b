"""One queue-memory budget over open transactions and compiled tables: who spools, when, and what it reports."""

from __future__ import annotations

import gc
import json
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from applier.engine.buffers import TransactionBuffers
from applier.engine.changes import TableChanges
from applier.engine.compiled import CompiledCycle
from applier.engine.identity import NET_OP
from applier.engine.queue import MemoryQueue
from applier.engine.spill import read_spill
from applier.intermediate.schema import Column, TableDef
from applier.intermediate.writer import DAT_SCHEMA
from applier.targets.per_table import apply_tables

IMAGE = '{"id": 1, "v": "' + "x" * 80 + '"}'  # 98 bytes
ROW_BYTES = 8 + 1 + len("s.t") + 1 + len(IMAGE)  # xid of one character: 111 bytes by the buffers' rule


def _rows(xid: str, count: int, first_lsn: int = 1) -> pa.Table:
    return pa.table(
        {
            "lsn": pa.array(range(first_lsn, first_lsn + count), pa.int64()),
            "xid": [xid] * count,
            "table": ["s.t"] * count,
            "op": ["I"] * count,
            "before": pa.nulls(count, pa.string()),
            "after": [IMAGE] * count,
        },
        schema=DAT_SCHEMA,
    )


def test_a_transaction_spools_once_it_exceeds_half_the_queue_memory(tmp_path: Path) -> None:
    queue = MemoryQueue(20_000)
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=10**9, queue=queue)  # the buffer size is no limit
    buffers.add(_rows("a", 80), seq=1)  # 8,880 bytes: under half the queue
    assert [t.spilled for t in buffers.open_transactions()] == [False]
    buffers.add(_rows("a", 15, first_lsn=100), seq=2)  # 10,545 bytes: over half of 20,000
    (txn,) = buffers.open_transactions()
    assert txn.spilled and txn.memory_bytes == 0 and txn.bytes == 95 * ROW_BYTES
    spooled = queue.cycle_figures()["spooled"]
    assert [(s["kind"], s["name"], s["file"], s["bytes"]) for s in spooled] == [
        ("transactions", "a", "cfg_a.spill", 95 * ROW_BYTES)
    ]
    assert queue.held == 0  # the segments it left hold nothing else
    taken = buffers.take("a")
    assert taken is not None and taken.spill_path is not None
    assert sum(b.num_rows for b in read_spill(taken.spill_path)) == 95


def test_when_the_queue_is_full_the_largest_buffers_spool_first(tmp_path: Path) -> None:
    queue = MemoryQueue(40_000)
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=10**9, queue=queue)
    for xid, rows in (("a", 150), ("b", 120), ("c", 60)):
        buffers.add(_rows(xid, rows, first_lsn=1000 * ord(xid)), seq=1)
    # Each add holds its own Arrow segment: a, b and c need about 18, 15 and 8 KB, together over 40,000.
    spilled = {t.xid: t.spilled for t in buffers.open_transactions()}
    assert spilled == {"a": True, "b": False, "c": False}
    assert queue.held <= queue.budget
    assert [s["name"] for s in queue.cycle_figures()["spooled"]] == ["a"]


def test_compiled_tables_and_open_transactions_share_one_budget(tmp_path: Path) -> None:
    queue = MemoryQueue(60_000)
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=10**9, queue=queue)
    buffers.add(_rows("a", 200), seq=1)  # about 24 KB
    table = TableDef("s.t", (Column("id", "bigint", False), Column("v", "string", True)), ("id",))
    compiled = CompiledCycle({"s.t": table}, frozenset(), queue, tmp_path, "cfg")
    chunk = pa.table({NET_OP: ["I"] * 400, "id": pa.array(range(400), pa.int64()), "v": ["y" * 80] * 400})
    compiled.add("s.t", chunk)  # about 37 KB more: over the budget, and the compiled table is the largest
    figures = queue.cycle_figures()
    assert [(s["kind"], s["name"]) for s in figures["spooled"]] == [("tables", "s.t")]
    assert figures["memory_bytes"]["tables"] == 0 and figures["memory_bytes"]["transactions"] > 0
    assert figures["budget_bytes"] >= figures["peak_bytes"] >= queue.held  # the peak is what stayed held
    changes = compiled["s.t"]  # read back from its spill file when applied
    assert changes.upserts.num_rows == 400 and queue.held_by_kind()["compiled"] > 0
    compiled.release("s.t")
    compiled.close()
    assert queue.held_by_kind()["compiled"] == 0 and not list(tmp_path.glob("cfg_s-2Et.spill"))


def test_closing_one_of_many_compiled_groups_reads_no_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = MemoryQueue(10**9)
    table = TableDef("s.t", (Column("id", "bigint", False),), ("id",))
    groups = [CompiledCycle({"s.t": table}, frozenset(), queue, tmp_path, "cfg") for _ in range(3)]
    for group in groups:
        group.add("s.t", pa.table({NET_OP: ["I"], "id": pa.array([1], pa.int64())}))
    assert groups[0] != groups[1] and groups[0] == groups[0]  # the same changes, yet two holders

    def read(self: CompiledCycle, name: str) -> None:
        raise AssertionError(f"{name} was read to compare holders")

    monkeypatch.setattr(CompiledCycle, "__getitem__", read)
    for group in reversed(groups):  # the last registered first: each is compared with those before it
        group.close()
    assert queue.held == 0


def test_committed_rows_in_memory_are_written_once_to_the_committed_file(tmp_path: Path) -> None:
    queue = MemoryQueue(10**9)
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=10**9, queue=queue)
    buffers.add(pa.concat_tables([_rows("a", 3), _rows("b", 2, first_lsn=10), _rows("c", 1, first_lsn=20)]), seq=1)
    taken, memory_file = buffers.take_committed(["a", "c", "x"], tmp_path / "cfg_--committed.spill")
    assert sorted(taken) == ["a", "c"] and all(t.memory is None for t in taken.values())
    assert memory_file is not None
    rows = pa.Table.from_batches(list(read_spill(memory_file)))
    assert sorted(zip(rows.column("xid").to_pylist(), rows.column("lsn").to_pylist(), strict=True)) == [
        ("a", 1),
        ("a", 2),
        ("a", 3),
        ("c", 20),
    ]
    assert [t.xid for t in buffers.open_transactions()] == ["b"]


def _pair_rows(batch: int, transactions: int) -> pa.Table:
    """One pair's rows: one row for each of ``transactions`` open transactions, realistic images."""
    images = [
        json.dumps(
            {
                "id": batch * transactions + t,
                "customer_id": t,
                "status": "pending",
                "amount": f"{t % 997}.50",
                "note": f"order {t} of batch {batch}",
            }
        )
        for t in range(transactions)
    ]
    return pa.table(
        {
            "lsn": pa.array(range(batch * transactions, (batch + 1) * transactions), pa.int64()),
            "xid": [f"{1_000_000 + t}" for t in range(transactions)],
            "table": ["shop.orders"] * transactions,
            "op": ["I"] * transactions,
            "before": pa.nulls(transactions, pa.string()),
            "after": images,
        },
        schema=DAT_SCHEMA,
    )


def _parquet_bytes(rows: pa.Table) -> int:
    sink = pa.BufferOutputStream()
    pq.write_table(rows, sink)
    return int(sink.getvalue().size)


# A buffered row costs its logical bytes (8 for the lsn plus its strings) times
# at most this factor, plus Arrow's offsets and validity bits (21 bytes a row).
ROW_FACTOR = 1.25
ROW_OVERHEAD = 24


def test_a_buffered_row_costs_what_it_weighs_with_thousands_of_small_transactions_or_one_large(
    tmp_path: Path,
) -> None:
    pairs, transactions = 25, 4_000
    for shape in ("many small", "one large"):
        queue = MemoryQueue(10**10)
        buffers = TransactionBuffers(tmp_path / shape, "cfg", buffer_size=10**9, queue=queue)
        # Arrow memory of earlier tests in this process, held by reference cycles (a caught exception's
        # frames), must not be freed by the collector while the buffers' allocations are counted.
        gc.collect()
        gc.disable()
        try:
            before = pa.total_allocated_bytes()
            for batch in range(pairs):
                rows = _pair_rows(batch, transactions)
                if shape == "one large":
                    rows = rows.set_column(1, "xid", pa.array(["1"] * transactions))
                buffers.add(rows, seq=batch + 1)
            held = pa.total_allocated_bytes() - before
        finally:
            gc.enable()
        logical = buffers.memory_bytes
        count = pairs * transactions
        assert held <= ROW_FACTOR * logical + ROW_OVERHEAD * count, (shape, held / count, logical / count)
        assert abs(queue.held - held) <= 0.1 * held  # the queue is charged what Arrow really holds
        # Against the pair, whose Parquet compresses JSON images about fivefold: at most six times its share.
        in_pair = _parquet_bytes(_pair_rows(0, transactions)) / transactions
        assert held / count <= 6 * in_pair, (shape, held / count, in_pair)
        buffers.close()


class _Recorder:
    """A per-table target that notes how many tables it holds at once (each held a moment)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.rows: dict[str, int] = {}

    def apply_one(self, cycle_id: int, changes: TableChanges, part: object = None) -> tuple[bool, int, dict[str, int]]:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.rows[changes.table.name] = changes.upserts.num_rows
        time.sleep(0.2)
        with self.lock:
            self.now -= 1
        return True, cycle_id, {}


def _compiled_tables(tmp_path: Path, budget: int) -> tuple[MemoryQueue, CompiledCycle]:
    queue = MemoryQueue(budget)
    names = [f"s.t{i}" for i in range(4)]
    defs = {n: TableDef(n, (Column("id", "bigint", False), Column("v", "string", True)), ("id",)) for n in names}
    compiled = CompiledCycle(defs, frozenset(), queue, tmp_path, "cfg")
    for n in names:  # about 37 KB each
        compiled.add(n, pa.table({NET_OP: ["I"] * 400, "id": pa.array(range(400), pa.int64()), "v": ["y" * 80] * 400}))
    return queue, compiled


def test_tables_are_taken_only_while_the_queue_has_room_for_them(tmp_path: Path) -> None:
    queue, compiled = _compiled_tables(tmp_path / "small", 60_000)  # room for one table at a time
    spooled = queue.cycle_figures()["spooled"]
    assert queue.held <= queue.budget and len(spooled) >= 3
    table_bytes = max(s["bytes"] for s in spooled)
    target = _Recorder()
    load = apply_tables(target, 4, 1, compiled)
    assert target.most == 1 and target.rows == dict.fromkeys(compiled, 400) and sorted(load.held) == sorted(compiled)
    # Over the budget by less than one table: the first is taken whatever else is held (four at once: three more).
    assert queue.cycle_figures()["peak_bytes"] < queue.budget + table_bytes and queue.held_by_kind()["compiled"] == 0
    compiled.close()

    queue, compiled = _compiled_tables(tmp_path / "large", 10**8)  # room for all: four threads, four tables
    target = _Recorder()
    apply_tables(target, 4, 1, compiled)
    assert target.most > 1 and target.rows == dict.fromkeys(compiled, 400)
    compiled.close()


def test_a_table_larger_than_the_queue_is_still_taken_alone(tmp_path: Path) -> None:
    _, compiled = _compiled_tables(tmp_path, 20_000)  # each table alone is over the budget
    target = _Recorder()
    apply_tables(target, 4, 1, compiled)
    assert target.most == 1 and target.rows == dict.fromkeys(compiled, 400)
    compiled.close()
