"""Open-transaction buffers and their spill files (applier.engine.buffers), on real files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from applier.engine.buffers import OpenTxn, SpillEvent, TransactionBuffers, safe_xid
from applier.engine.reading import read_dat_rows
from applier.engine.spill import read_spill, spill_segments
from applier.intermediate.pairs import DAT_COLUMNS

# Every row built by _rows() has table "public.t" (8), op "I" (1), no before image,
# and the after image '{"id":N}' padded to 10 characters: 8 + len(xid) + 8 + 1 + 10 bytes.
ROW_BYTES_XID_3 = 30  # xid "731"


def _row(lsn: int, xid: str) -> dict[str, Any]:
    return {
        "lsn": lsn,
        "xid": xid,
        "table": "public.t",
        "op": "I",
        "before": None,
        "after": f'{{"id":{lsn}}}'.ljust(10),
    }


def _rows(*pairs: tuple[int, str]) -> pa.Table:
    """A batch of .dat rows from (lsn, xid) pairs, given in lsn order."""
    return pa.Table.from_pylist([_row(lsn, xid) for lsn, xid in pairs])


def _lsns(table: pa.Table) -> list[int]:
    return list(table.column("lsn").to_pylist())


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def _read(path: Path) -> pa.Table:
    return pa.Table.from_batches(list(read_spill(path)))


def test_small_transaction_stays_in_memory(tmp_path: Path) -> None:
    buffers = TransactionBuffers(tmp_path / "tmp", "cfg", buffer_size=100)
    buffers.add(_rows((1, "731"), (2, "731"), (3, "731")), seq=1)

    assert _names(tmp_path / "tmp") == []
    assert buffers.memory_bytes == 3 * ROW_BYTES_XID_3 == 90
    taken = buffers.take("731")
    assert taken is not None
    assert taken.spill_path is None
    assert taken.memory is not None
    assert taken.memory.to_pylist() == [_row(1, "731"), _row(2, "731"), _row(3, "731")]
    assert (taken.rows, taken.bytes, taken.spill_bytes) == (3, 90, 0)
    assert buffers.memory_bytes == 0
    assert buffers.spill_events == []


def test_open_transaction_spills_above_buffer_size(tmp_path: Path) -> None:
    spill_dir = tmp_path / "tmp"
    buffers = TransactionBuffers(spill_dir, "cfg", buffer_size=100)
    buffers.add(_rows((1, "731"), (2, "731"), (3, "731")))  # 90 bytes: stays in memory
    assert _names(spill_dir) == []

    buffers.add(_rows((4, "731")))  # 120 bytes > 100: flushed
    assert _names(spill_dir) == ["cfg_731.spill"]
    assert buffers.memory_bytes == 0
    buffers.add(_rows((5, "731"), (6, "731")))  # 60 bytes wait in memory again
    assert buffers.memory_bytes == 60
    [txn] = buffers.open_transactions()
    assert (txn.rows, txn.bytes, txn.memory_bytes, txn.spilled) == (6, 180, 60, True)

    taken = buffers.take("731")
    assert taken is not None and taken.spill_path == spill_dir / "cfg_731.spill"
    assert taken.memory is None  # the memory rows were flushed into the file on take
    assert _lsns(_read(taken.spill_path)) == [1, 2, 3, 4, 5, 6]
    assert buffers.memory_bytes == 0


def test_rows_of_interleaved_transactions_are_grouped_per_xid_in_lsn_order(tmp_path: Path) -> None:
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=1_000)
    buffers.add(_rows((10, "b"), (11, "a"), (12, "b"), (13, "a")))
    buffers.add(_rows((20, "a"), (21, "c"), (22, "b")))

    taken = {xid: buffers.take(xid) for xid in ("a", "b", "c")}
    assert {xid: _lsns(t.memory) for xid, t in taken.items() if t and t.memory} == {
        "a": [11, 13, 20],
        "b": [10, 12, 22],
        "c": [21],
    }


def test_take_returns_closed_readable_file_with_the_rows_added(tmp_path: Path) -> None:
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=50)
    buffers.add(_rows((1, "731"), (2, "9"), (3, "731")))  # 731: 60 bytes, spills
    buffers.add(_rows((4, "731")))

    taken = buffers.take("731")
    assert taken is not None and taken.spill_path is not None
    table = _read(taken.spill_path)
    assert table.to_pylist() == [_row(1, "731"), _row(3, "731"), _row(4, "731")]
    assert table.column_names == ["lsn", "xid", "table", "op", "before", "after"]
    assert spill_segments(taken.spill_path) == 2  # one spool while open, the rest on take
    assert (taken.rows, taken.bytes) == (3, 90)
    assert taken.spill_bytes == taken.spill_path.stat().st_size
    assert [t.xid for t in buffers.open_transactions()] == ["9"]


def test_take_of_an_unknown_transaction_returns_none(tmp_path: Path) -> None:
    assert TransactionBuffers(tmp_path, "cfg", buffer_size=50).take("nope") is None


def test_release_removes_the_spill_file_and_is_idempotent(tmp_path: Path) -> None:
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=10)
    buffers.add(_rows((1, "731")))
    taken = buffers.take("731")
    assert taken is not None and taken.spill_path is not None and taken.spill_path.exists()

    buffers.release("731")
    buffers.release("731")
    assert _names(tmp_path) == []


def test_release_of_an_open_transaction_is_refused(tmp_path: Path) -> None:
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=10)
    buffers.add(_rows((1, "731")))
    with pytest.raises(ValueError, match="still open"):
        buffers.release("731")


def test_discard_on_rollback_removes_spill_file_and_memory_rows(tmp_path: Path) -> None:
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=50)
    buffers.add(_rows((1, "731"), (2, "731")))  # spills
    buffers.add(_rows((3, "731"), (4, "8")))
    assert _names(tmp_path) == ["cfg_731.spill"]
    assert buffers.memory_bytes == ROW_BYTES_XID_3 + 28

    buffers.discard("731")
    buffers.discard("731")
    assert _names(tmp_path) == []
    assert buffers.memory_bytes == 28
    assert [t.xid for t in buffers.open_transactions()] == ["8"]
    assert buffers.take("731") is None


def test_rows_of_a_taken_transaction_are_refused_until_released(tmp_path: Path) -> None:
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=10)
    buffers.add(_rows((1, "731")))
    buffers.take("731")
    with pytest.raises(ValueError, match="after they were taken"):
        buffers.add(_rows((2, "731")))


def test_rows_without_a_dat_column_are_refused(tmp_path: Path) -> None:
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=10)
    with pytest.raises(ValueError, match=r"\['after'\]"):
        buffers.add(_rows((1, "731")).drop_columns(["after"]))


def test_clear_leftovers_removes_old_spill_files_of_this_configuration_only(tmp_path: Path) -> None:
    for name in ["cfg_1.spill", "cfg_x-2F1.spill", "cfg_b_1.spill", "other_1.spill", "cfg_1.dat", "cfg.spill"]:
        (tmp_path / name).write_bytes(b"old")
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=10)
    buffers.add(_rows((1, "9")))  # spills to cfg_9.spill, which is in use

    assert buffers.clear_leftovers() == ["cfg_1.spill", "cfg_x-2F1.spill"]
    assert _names(tmp_path) == ["cfg.spill", "cfg_1.dat", "cfg_9.spill", "cfg_b_1.spill", "other_1.spill"]
    assert TransactionBuffers(tmp_path / "missing", "cfg", buffer_size=10).clear_leftovers() == []


def test_odd_xids_give_safe_distinct_names_inside_spill_dir(tmp_path: Path) -> None:
    assert safe_xid("731") == "731"
    assert safe_xid("a/b") == "a-2Fb"
    assert safe_xid("..") == "-2E-2E"
    assert safe_xid("x y") == "x-20y"
    assert safe_xid("é") == "-C3-A9"
    assert safe_xid("a_b") == "a-5Fb"
    assert safe_xid("-") == "-2D"
    # An encoding over 120 characters becomes "--" and the SHA-256 of the xid.
    assert safe_xid("x" * 200) == "--aa20c23e3201834050679e1d88941b9a6fed0557c9a705cb2c315e2e63fd486d"
    assert safe_xid("x" * 120) == "x" * 120

    xids = ["a/b", "..", "x y", "é", "日本", "a_b", "a-b", "a-2Db", "", "-", "_", "../../etc", "x" * 200, "x" * 201]
    spill_dir = tmp_path / "tmp"
    buffers = TransactionBuffers(spill_dir, "cfg", buffer_size=1)
    buffers.add(_rows(*((lsn, xid) for lsn, xid in enumerate(xids, start=1))))

    paths = [buffers.spill_path(xid) for xid in xids]
    assert len(set(paths)) == len(xids)
    assert all(path.parent == spill_dir for path in paths)
    assert _names(spill_dir) == sorted(path.name for path in paths)
    assert all(len(path.name) < 255 for path in paths)
    assert list(tmp_path.iterdir()) == [spill_dir]


def test_spill_events_name_files_created_and_removed_with_their_bytes(tmp_path: Path) -> None:
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=50)
    buffers.add(_rows((1, "731"), (2, "731")))
    created_size = (tmp_path / "cfg_731.spill").stat().st_size
    buffers.add(_rows((3, "731")))
    taken = buffers.take("731")
    assert taken is not None
    buffers.release("731")
    buffers.add(_rows((4, "8"), (5, "8")))
    buffers.discard("8")

    assert created_size > 0 and taken.spill_bytes > created_size
    events = buffers.drain_spill_events()
    assert events[:2] == [
        SpillEvent("created", "cfg_731.spill", created_size),
        SpillEvent("removed", "cfg_731.spill", taken.spill_bytes),
    ]
    assert [(e.kind, e.name) for e in events[2:]] == [("created", "cfg_8.spill"), ("removed", "cfg_8.spill")]
    assert buffers.spill_events == []


def test_open_transactions_report_rows_bytes_first_seq_and_spilled(tmp_path: Path) -> None:
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=58)
    buffers.add(_rows((1, "731"), (2, "8")), seq=5)
    buffers.add(_rows((3, "731")), seq=6)  # 731 spills: 60 bytes
    buffers.add(_rows((4, "8")), seq=4)  # the smallest seq is kept
    buffers.add(_rows((5, "new")))

    spill = tmp_path / "cfg_731.spill"
    assert buffers.open_transactions() == [
        OpenTxn("731", 2, 60, 5, True, spill, spill.stat().st_size, 0),
        OpenTxn("8", 2, 56, 4, False, None, 0, 56),
        OpenTxn("new", 1, 30, None, False, None, 0, 30),
    ]
    assert buffers.memory_bytes == 86


def test_close_deletes_every_spill_file_open_or_taken(tmp_path: Path) -> None:
    with TransactionBuffers(tmp_path, "cfg", buffer_size=10) as buffers:
        buffers.add(_rows((1, "1"), (2, "2"), (3, "3")))
        buffers.take("1")
        assert _names(tmp_path) == ["cfg_1.spill", "cfg_2.spill", "cfg_3.spill"]
    assert _names(tmp_path) == []
    assert buffers.open_transactions() == []


def _big_batch(first_lsn: int, rows: int, xid: str) -> pa.Table:
    """``rows`` rows of one transaction, 422 bytes each: 8 + "big" + "public.big" + "I" + 400-character image."""
    lsns = pa.array(range(first_lsn, first_lsn + rows), pa.int64())
    return pa.table(
        {
            "lsn": lsns,
            "xid": pa.array([xid] * rows),
            "table": pa.array(["public.big"] * rows),
            "op": pa.array(["I"] * rows),
            "before": pa.nulls(rows, pa.string()),
            "after": pa.array(["x" * 400] * rows),
        }
    )


def test_memory_stays_bounded_while_a_20_mb_transaction_spills(tmp_path: Path) -> None:
    buffer_size = 64 * 1024
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=buffer_size)
    baseline = pa.total_allocated_bytes()
    rows_per_batch, batches = 40, 1_200  # 40 rows x 422 bytes = 16,880 bytes a batch; 20.3 MB in all
    seen_memory, seen_arrow = [], []
    for i in range(batches):
        buffers.add(_big_batch(i * rows_per_batch, rows_per_batch, "big"), seq=1)
        seen_memory.append(buffers.memory_bytes)
        seen_arrow.append(pa.total_allocated_bytes() - baseline)

    # Three batches wait in memory; the fourth takes the buffer over 64 KiB and all four are flushed.
    assert seen_memory[:5] == [16_880, 33_760, 50_640, 0, 16_880]
    assert max(seen_memory) == 50_640 <= buffer_size
    assert max(seen_arrow) < 1024 * 1024  # Arrow holds no more than the buffer (and some slack)
    taken = buffers.take("big")
    assert taken is not None and taken.memory is None and taken.spill_path is not None
    assert (taken.rows, taken.bytes) == (48_000, 20_256_000)
    assert pa.total_allocated_bytes() - baseline < 1024 * 1024  # take read nothing back
    assert _read(taken.spill_path).num_rows == 48_000


@pytest.mark.slow
def test_one_million_rows_of_a_thousand_transactions_are_all_buffered(tmp_path: Path) -> None:
    n = 1_000_000
    batch = pa.table(
        {
            "lsn": pa.array(range(n), pa.int64()),
            "xid": pa.array([str(i % 1_000) for i in range(n)]),
            "table": pa.array(["public.t"] * n),
            "op": pa.array(["I"] * n),
            "before": pa.nulls(n, pa.string()),
            "after": pa.array(['{"id": 1, "amount": "1.00"}'] * n),
        }
    )
    buffers = TransactionBuffers(tmp_path, "cfg", buffer_size=1_048_576)
    buffers.add(batch, seq=1)

    assert len(buffers.open_transactions()) == 1_000
    assert sum(t.rows for t in buffers.open_transactions()) == n


@pytest.mark.parametrize("batch_rows", [1, 3, 8_192])
def test_open_rows_are_read_back_a_batch_at_a_time_as_the_whole_file_filtered(tmp_path: Path, batch_rows: int) -> None:
    """Buffering a pair's open transactions reads it in batches: the same rows, in file order, as reading it whole."""
    path = tmp_path / "000000000001.dat"
    xids = ["731", "9", "731", "12", "9", "731", "5"]
    pq.write_table(_rows(*enumerate(xids, start=1)), path)
    whole = pq.read_table(path)
    for wanted in (["731"], ["9", "5"], ["404"], []):
        value_set = pa.array(wanted, pa.string())
        expected = whole.filter(pc.is_in(whole["xid"], value_set=value_set))
        got = read_dat_rows(path, value_set, batch_rows=batch_rows)
        assert got.to_pylist() == expected.to_pylist()
        assert got.schema.names == list(DAT_COLUMNS)
