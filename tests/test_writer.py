"""The writer: pairs read back intact, rotated at the size limit, written atomically."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from applier.intermediate.pairs import list_pairs
from applier.intermediate.reader import read_pair
from applier.intermediate.schema import Column, TableDef
from applier.intermediate.stream import StreamValidator
from applier.intermediate.writer import IntermediateWriter

T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
ITEMS = TableDef(
    "shop.items",
    (Column("id", "bigint", False), Column("name", "string", True), Column("price", "decimal(8,2)", True)),
    ("id",),
)


def _read_all(directory: Path) -> list:
    validator = StreamValidator()
    pairs = []
    for ref in list_pairs(directory).pairs:
        pair = read_pair(ref)
        validator.check(pair)
        pairs.append(pair)
    return pairs


def test_what_is_written_reads_back_intact(tmp_path: Path) -> None:
    with IntermediateWriter(tmp_path, max_file_size_bytes=10**9, clock=lambda: T0) as w:
        w.define_table(ITEMS)
        w.begin("x1", 1, T0)
        w.row(2, "x1", "shop.items", "I", None, {"id": 1, "name": "café ☕", "price": "3.50"})
        w.row(3, "x1", "shop.items", "U", {"id": 1}, {"id": 1, "name": "tea", "price": "2.00"})
        w.begin("x2", 4, T0)
        w.row(5, "x2", "shop.items", "D", {"id": 1}, None)
        w.commit("x1", 6, T0)
        w.rollback("x2", 7, T0)
    (pair,) = _read_all(tmp_path)
    assert pair.header.seq == 1 and pair.header.first_lsn == 1 and pair.header.last_lsn == 7
    assert pair.header.created_at == "2026-11-21T10:00:00.000000Z"
    assert [(e.record, e.xid, e.lsn) for e in pair.events] == [
        ("begin", "x1", 1),
        ("begin", "x2", 4),
        ("commit", "x1", 6),
        ("rollback", "x2", 7),
    ]
    assert pair.data["lsn"].to_pylist() == [2, 3, 5]
    assert pair.data["op"].to_pylist() == ["I", "U", "D"]
    assert json.loads(pair.data["after"][0].as_py()) == {"id": 1, "name": "café ☕", "price": "3.50"}
    assert pair.data["before"][0].as_py() is None and json.loads(pair.data["before"][2].as_py()) == {"id": 1}
    assert pair.tables == {"shop.items": ITEMS}


def test_pairs_rotate_at_the_size_limit_and_each_begin_stays_with_its_first_row(tmp_path: Path) -> None:
    lsn = 0
    with IntermediateWriter(tmp_path, max_file_size_bytes=4000) as w:
        w.define_table(ITEMS)
        for t in range(60):
            xid = f"t{t}"
            w.begin(xid, lsn := lsn + 1, T0)
            for i in range(5):
                w.row(
                    lsn := lsn + 1, xid, "shop.items", "I", None, {"id": t * 10 + i, "name": "n" * 40, "price": "1.00"}
                )
            w.commit(xid, lsn := lsn + 1, T0)
    pairs = _read_all(tmp_path)
    assert len(pairs) > 5
    assert all(p.ref.size < 3 * 4000 for p in pairs)
    begin_pair = {e.xid: p.seq for p in pairs for e in p.events if e.record == "begin"}
    first_row_pair: dict[str, int] = {}
    for p in pairs:
        for xid in p.data["xid"].to_pylist():
            first_row_pair.setdefault(xid, p.seq)
    assert begin_pair == first_row_pair
    assert sum(p.data.num_rows for p in pairs) == 300


def test_a_changed_table_definition_starts_a_new_pair(tmp_path: Path) -> None:
    evolved = TableDef("shop.items", (*ITEMS.columns, Column("colour", "string", True)), ("id",))
    with IntermediateWriter(tmp_path, max_file_size_bytes=10**9) as w:
        w.define_table(ITEMS)
        w.begin("a", 1, T0)
        w.row(2, "a", "shop.items", "I", None, {"id": 1, "name": None, "price": None})
        w.define_table(evolved)
        w.row(3, "a", "shop.items", "I", None, {"id": 2, "name": None, "price": None, "colour": "red"})
        w.commit("a", 4, T0)
    first, second = _read_all(tmp_path)
    assert first.tables["shop.items"] == ITEMS and second.tables["shop.items"] == evolved


def test_only_complete_pairs_are_left_no_temporary_files(tmp_path: Path) -> None:
    with IntermediateWriter(tmp_path, max_file_size_bytes=10**9) as w:
        w.define_table(ITEMS)
        w.begin("a", 1, T0)
        w.commit("a", 2, T0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000000001.dat", "000000000001.trn"]


def test_the_writer_refuses_lsns_that_do_not_increase(tmp_path: Path) -> None:
    w = IntermediateWriter(tmp_path, max_file_size_bytes=10**9)
    w.define_table(ITEMS)
    w.begin("a", 5, T0)
    with pytest.raises(ValueError, match="lsn 5"):
        w.commit("a", 5, T0)


def test_pairs_after_the_first_come_close_to_the_size_limit_despite_compression(tmp_path: Path) -> None:
    limit = 200_000
    lsn = 0
    with IntermediateWriter(tmp_path, max_file_size_bytes=limit) as w:
        w.define_table(ITEMS)
        for t in range(3000):
            w.begin(f"t{t}", lsn := lsn + 1, T0)
            w.row(
                lsn := lsn + 1, f"t{t}", "shop.items", "I", None, {"id": t, "name": f"item {t % 97}", "price": "1.00"}
            )
            w.commit(f"t{t}", lsn := lsn + 1, T0)
    sizes = [p.size for p in list_pairs(tmp_path).pairs]
    assert len(sizes) >= 3
    assert all(s <= 1.3 * limit for s in sizes)
    assert all(s >= 0.5 * limit for s in sizes[1:-1]), sizes
