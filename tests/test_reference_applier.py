"""Tests of the reference applier (tests/reference): conformance vectors and hand-built streams."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reference.applier import ReferenceApplyError, RefTable, canonical_rows, canonical_value, reference_apply


def _vectors_dir() -> Path:
    """The conformance vectors: ``$CDC_SPEC_DIR/vectors`` or ``<repo>/../shared/spec/vectors``."""
    override = os.environ.get("CDC_SPEC_DIR")
    if override:
        return Path(override) / "vectors"
    return Path(__file__).resolve().parents[1].parent / "shared" / "spec" / "vectors"


VECTORS = _vectors_dir()
VALID = sorted(p for p in (VECTORS / "valid").glob("*") if p.is_dir())
INVALID = sorted(p for p in (VECTORS / "invalid").glob("*") if p.is_dir())


# --------------------------------------------------------------------------- conformance vectors


def assert_tables_match(actual: dict[str, RefTable], expected: dict[str, Any]) -> None:
    """Compare reference tables with an expected.json ``tables`` object (rows as multisets)."""
    for name, exp in expected.items():
        if name not in actual:
            assert not exp["rows"], f"{name} missing from the reference result"
            continue
        table = actual[name]
        assert table.columns == exp["columns"], name
        assert table.primary_key == exp["primary_key"], name
        assert table.rows == canonical_rows(list(zip(table.columns, table.types, strict=True)), exp["rows"]), name
    for name in set(actual) - set(expected):
        assert not actual[name].rows, f"{name} has rows but is not expected"


def _expected(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "expected.json").read_text(encoding="utf-8"))


def test_vectors_present() -> None:
    """The vectors directory was found (otherwise the parametrised tests would silently vanish)."""
    assert VALID, f"no valid vectors under {VECTORS}"
    assert INVALID, f"no invalid vectors under {VECTORS}"


@pytest.mark.parametrize("folder", VALID, ids=lambda p: p.name)
def test_valid_vector(folder: Path) -> None:
    """Applying every pair of a valid vector gives exactly its expected tables."""
    expected = _expected(folder)
    actual = reference_apply(folder)
    assert_tables_match(actual, expected["tables"])
    assert actual == reference_apply(folder, through_seq=expected["applied_through_seq"])


@pytest.mark.parametrize("folder", INVALID, ids=lambda p: p.name)
def test_invalid_vector_good_prefix(folder: Path) -> None:
    """Applying the good pairs of an invalid vector gives its expected tables."""
    expected = _expected(folder)
    actual = reference_apply(folder, through_seq=expected["applied_through_seq"])
    assert_tables_match(actual, expected["tables"])


# --------------------------------------------------------------------------- stream builder

Columns = list[tuple[str, str, bool]]
ACCOUNTS: Columns = [("id", "bigint", False), ("name", "string", True), ("amount", "decimal(10,2)", True)]
LOG: Columns = [("msg", "string", True), ("n", "int", True)]


class Stream:
    """Writes intermediate-file pairs by hand (an independent, minimal writer for these tests)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.tables: dict[str, tuple[Columns, list[str]]] = {
            "s.accounts": (ACCOUNTS, ["id"]),
            "s.log": (LOG, []),
        }
        self.rows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.lsn = 100
        self.seq = 0

    def _next_lsn(self) -> int:
        self.lsn += 1
        return self.lsn

    def event(self, record: str, xid: str) -> Stream:
        """Add a begin/commit/rollback event."""
        self.events.append({"record": record, "xid": xid, "lsn": self._next_lsn(), "ts": "2026-01-01T00:00:00.000000Z"})
        return self

    def row(self, xid: str, table: str, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> Stream:
        """Add a row change."""
        self.rows.append(
            {
                "lsn": self._next_lsn(),
                "xid": xid,
                "table": table,
                "op": op,
                "before": None if before is None else json.dumps(before),
                "after": None if after is None else json.dumps(after),
            }
        )
        return self

    def flush(self) -> int:
        """Write the pending rows and events as the next pair; return its sequence number."""
        self.seq += 1
        stem = self.directory / f"{self.seq:012d}"
        described = {r["table"] for r in self.rows} or set(self.tables)
        meta = {
            name: {
                "columns": [{"name": n, "type": t, "nullable": nl} for n, t, nl in self.tables[name][0]],
                "primary_key": self.tables[name][1],
            }
            for name in sorted(described)
        }
        schema = pa.schema(
            [
                ("lsn", pa.int64(), False),
                ("xid", pa.string(), False),
                ("table", pa.string(), False),
                ("op", pa.string(), False),
                ("before", pa.string()),
                ("after", pa.string()),
            ],
            metadata={"cdc.tables": json.dumps(meta)},
        )
        pq.write_table(pa.Table.from_pylist(self.rows, schema=schema), f"{stem}.dat")
        data = Path(f"{stem}.dat").read_bytes()
        lsns = [r["lsn"] for r in self.rows] + [e["lsn"] for e in self.events]
        header = {
            "record": "header",
            "format": "cdc-intermediate",
            "version": 1,
            "seq": self.seq,
            "dat_rows": len(self.rows),
            "dat_bytes": len(data),
            "dat_sha256": hashlib.sha256(data).hexdigest(),
            "first_lsn": min(lsns, default=None),
            "last_lsn": max(lsns, default=None),
            "created_at": "2026-01-01T00:00:00.000000Z",
        }
        lines = [header, *self.events]
        Path(f"{stem}.trn").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
        self.rows, self.events = [], []
        return self.seq


def acct(id_: int, name: str = "n", amount: str | None = "1.00") -> dict[str, Any]:
    """A full s.accounts image."""
    return {"id": id_, "name": name, "amount": amount}


def ins(s: Stream, xid: str, *ids: int) -> Stream:
    """Insert accounts ``ids`` in transaction ``xid``."""
    for i in ids:
        s.row(xid, "s.accounts", "I", None, acct(i))
    return s


def rows_of(tables: dict[str, RefTable], name: str = "s.accounts") -> list[list[Any]]:
    return tables[name].rows


@pytest.fixture
def stream(tmp_path: Path) -> Stream:
    return Stream(tmp_path)


# --------------------------------------------------------------------------- hand-built streams


def test_key_move(stream: Stream) -> None:
    ins(stream.event("begin", "1"), "1", 1, 2).event("commit", "1")
    stream.event("begin", "2").row("2", "s.accounts", "U", {"id": 1}, acct(10, "moved")).event("commit", "2")
    stream.flush()
    assert rows_of(reference_apply(stream.directory)) == [[10, "moved", "1.00"], [2, "n", "1.00"]]  # json-text order


def test_insert_then_delete_and_delete_then_reinsert(stream: Stream) -> None:
    stream.event("begin", "1")
    ins(stream, "1", 1, 2).row("1", "s.accounts", "D", {"id": 1}, None)
    stream.row("1", "s.accounts", "D", {"id": 2}, None).row("1", "s.accounts", "I", None, acct(2, "again"))
    stream.event("commit", "1").flush()
    assert rows_of(reference_apply(stream.directory)) == [[2, "again", "1.00"]]


def test_delete_then_reinsert_across_transactions(stream: Stream) -> None:
    ins(stream.event("begin", "1"), "1", 1).event("commit", "1")
    stream.event("begin", "2").row("2", "s.accounts", "D", {"id": 1}, None).event("commit", "2")
    stream.event("begin", "3").row("3", "s.accounts", "I", None, acct(1, "back")).event("commit", "3")
    stream.flush()
    assert rows_of(reference_apply(stream.directory)) == [[1, "back", "1.00"]]


def test_rollback_and_open_transactions_have_no_effect(stream: Stream) -> None:
    ins(stream.event("begin", "1"), "1", 1).event("rollback", "1")
    ins(stream.event("begin", "2"), "2", 2)  # still open
    ins(stream.event("begin", "3"), "3", 3).event("commit", "3")
    stream.flush()
    result = reference_apply(stream.directory)
    assert rows_of(result) == [[3, "n", "1.00"]]
    assert result["s.accounts"].columns == ["id", "name", "amount"]
    assert result["s.accounts"].primary_key == ["id"]


def test_long_transaction_spanning_pairs(stream: Stream) -> None:
    ins(stream.event("begin", "1"), "1", 1).flush()
    ins(stream, "1", 2).event("commit", "1").flush()
    assert rows_of(reference_apply(stream.directory, through_seq=1)) == []
    assert rows_of(reference_apply(stream.directory)) == [[1, "n", "1.00"], [2, "n", "1.00"]]


def test_commit_lsn_order_decides(stream: Stream) -> None:
    """T1 begins first, T2 inserts and commits, then T1 updates T2's row and commits."""
    stream.event("begin", "T1")
    ins(stream.event("begin", "T2"), "T2", 7).event("commit", "T2")
    stream.row("T1", "s.accounts", "U", {"id": 7}, acct(7, "updated", "9.50")).event("commit", "T1")
    stream.flush()
    assert rows_of(reference_apply(stream.directory)) == [[7, "updated", "9.50"]]


def test_truncate_then_insert(stream: Stream) -> None:
    ins(stream.event("begin", "1"), "1", 1, 2).event("commit", "1")
    stream.event("begin", "2").row("2", "s.accounts", "T", None, None)
    ins(stream, "2", 3).event("commit", "2").flush()
    assert rows_of(reference_apply(stream.directory)) == [[3, "n", "1.00"]]


def test_no_pk_delete_and_update_touch_exactly_one_row(stream: Stream) -> None:
    dup = {"msg": "dup", "n": 1}
    stream.event("begin", "1")
    for _ in range(3):
        stream.row("1", "s.log", "I", None, dup)
    stream.event("commit", "1").event("begin", "2").row("2", "s.log", "D", dup, None)
    stream.row("2", "s.log", "U", dup, {"msg": "changed", "n": None}).event("commit", "2").flush()
    result = reference_apply(stream.directory)
    assert result["s.log"].primary_key == []
    assert rows_of(result, "s.log") == [["changed", None], ["dup", 1]]


def test_added_nullable_column_reads_null_for_old_rows(stream: Stream) -> None:
    stream.event("begin", "1").row("1", "s.log", "I", None, {"msg": "old", "n": 1})
    ins(stream, "1", 1).event("commit", "1").flush()
    stream.tables["s.accounts"] = ([*ACCOUNTS, ("extra", "string", True)], ["id"])
    stream.tables["s.log"] = ([*LOG, ("extra", "string", True)], [])
    stream.event("begin", "2").row("2", "s.accounts", "I", None, {**acct(2), "extra": "x"})
    stream.row("2", "s.log", "I", None, {"msg": "new", "n": 2, "extra": "y"})
    stream.row("2", "s.log", "D", {"msg": "old", "n": 1, "extra": None}, None)  # old row matches with NULL
    stream.event("commit", "2").flush()
    result = reference_apply(stream.directory)
    assert result["s.accounts"].columns == ["id", "name", "amount", "extra"]
    assert rows_of(result) == [[1, "n", "1.00", None], [2, "n", "1.00", "x"]]
    assert rows_of(result, "s.log") == [["new", 2, "y"]]


def test_incompatible_schema_change_is_refused(stream: Stream) -> None:
    ins(stream.event("begin", "1"), "1", 1).event("commit", "1").flush()
    stream.tables["s.accounts"] = ([("id", "string", False), *ACCOUNTS[1:]], ["id"])
    stream.event("begin", "2").row("2", "s.accounts", "I", None, {**acct(2), "id": "2"}).event("commit", "2").flush()
    assert rows_of(reference_apply(stream.directory, through_seq=1)) == [[1, "n", "1.00"]]
    with pytest.raises(ReferenceApplyError, match="incompatible"):
        reference_apply(stream.directory)


@pytest.mark.parametrize(
    ("op", "before", "after"),
    [("U", {"id": 9}, acct(9)), ("D", {"id": 9}, None), ("I", None, acct(1)), ("U", {"id": 1}, acct(2))],
    ids=["update-missing", "delete-missing", "insert-existing", "move-onto-existing"],
)
def test_unrealistic_changes_raise(stream: Stream, op: str, before: Any, after: Any) -> None:
    ins(stream.event("begin", "1"), "1", 1, 2).event("commit", "1")
    stream.event("begin", "2").row("2", "s.accounts", op, before, after).event("commit", "2").flush()
    with pytest.raises(ReferenceApplyError):
        reference_apply(stream.directory)


def test_no_pk_delete_of_missing_row_raises(stream: Stream) -> None:
    stream.event("begin", "1").row("1", "s.log", "I", None, {"msg": "a", "n": 1})
    stream.row("1", "s.log", "D", {"msg": "a", "n": 2}, None).event("commit", "1").flush()
    with pytest.raises(ReferenceApplyError):
        reference_apply(stream.directory)


def test_rolled_back_unrealistic_change_is_ignored(stream: Stream) -> None:
    stream.event("begin", "1").row("1", "s.accounts", "D", {"id": 42}, None).event("rollback", "1").flush()
    assert rows_of(reference_apply(stream.directory)) == []


def test_gap_temp_names_and_incomplete_pairs(stream: Stream) -> None:
    ins(stream.event("begin", "1"), "1", 1).event("commit", "1").flush()
    ins(stream.event("begin", "2"), "2", 2).event("commit", "2").flush()
    ins(stream.event("begin", "3"), "3", 3).event("commit", "3").flush()
    d = stream.directory
    (d / "000000000002.trn").rename(d / ".000000000002.trn")  # pair 2 incomplete -> gap before pair 3
    (d / "000000000004.trn.tmp").write_text("garbage")
    assert rows_of(reference_apply(d)) == [[1, "n", "1.00"]]
    with pytest.raises(ReferenceApplyError):
        reference_apply(d, through_seq=3)


def test_every_described_table_is_returned_even_if_empty(stream: Stream) -> None:
    stream.event("begin", "1").flush()  # no rows: the pair describes every table
    result = reference_apply(stream.directory)
    assert set(result) == {"s.accounts", "s.log"}
    assert all(not t.rows for t in result.values())
    assert result["s.accounts"].types == ["bigint", "string", "decimal(10,2)"]


def test_empty_directory(tmp_path: Path) -> None:
    assert reference_apply(tmp_path) == {}


# --------------------------------------------------------------------------- canonical encoding


def test_values_are_normalised_in_stream(stream: Stream) -> None:
    stream.tables["s.d"] = ([("k", "decimal(6,2)", False), ("x", "double", True)], ["k"])
    stream.event("begin", "1").row("1", "s.d", "I", None, {"k": "1.5", "x": 2})
    stream.row("1", "s.d", "I", None, {"k": "2", "x": "NaN"})
    stream.row("1", "s.d", "U", {"k": "1.50"}, {"k": "1.5", "x": 2.5}).event("commit", "1").flush()
    result = reference_apply(stream.directory)
    assert rows_of(result, "s.d") == [["1.50", 2.5], ["2.00", "NaN"]]
    assert rows_of(result, "s.d") == canonical_rows(
        [("k", "decimal(6,2)"), ("x", "double")], [["2.0", float("nan")], ["01.5", 2.5]]
    )


@pytest.mark.parametrize(
    ("type_name", "value", "canonical"),
    [
        ("decimal(5,2)", "1.5", "1.50"),
        ("decimal(5,2)", "-0.00", "0.00"),
        ("decimal(5,2)", decimal.Decimal("3"), "3.00"),
        ("decimal(38,0)", "12345678901234567890123456789012345678", "12345678901234567890123456789012345678"),
        ("double", 2, 2.0),
        ("double", -0.0, 0.0),
        ("double", float("inf"), "Infinity"),
        ("double", "-Infinity", "-Infinity"),
        ("int", 5, 5),
        ("boolean", False, False),
        ("date", dt.date(2026, 3, 1), "2026-03-01"),
        ("timestamp", "2026-03-01T08:30:01.25Z", "2026-03-01T08:30:01.250000Z"),
        (
            "timestamp",
            dt.datetime(2026, 3, 1, 9, 30, tzinfo=dt.timezone(dt.timedelta(hours=1))),
            "2026-03-01T08:30:00.000000Z",
        ),
        ("binary", b"\x00\xff", "AP8="),
        ("binary", "AP8=", "AP8="),
        ("string", None, None),
    ],
)
def test_canonical_value(type_name: str, value: Any, canonical: Any) -> None:
    assert canonical_value(type_name, value) == canonical


@pytest.mark.parametrize(
    ("type_name", "value"),
    [
        ("decimal(5,2)", "1.234"),
        ("decimal(5,2)", "1234.5"),
        ("decimal(5,2)", 1.5),
        ("double", "nan"),
        ("int", 2**31),
        ("bigint", True),
        ("bigint", "1"),
        ("boolean", 1),
        ("date", "2026-3-1"),
        ("timestamp", "2026-03-01T08:30:01"),
        ("binary", "not base64!"),
        ("string", 1),
        ("varchar", "x"),
    ],
)
def test_canonical_value_rejects(type_name: str, value: Any) -> None:
    with pytest.raises(ReferenceApplyError):
        canonical_value(type_name, value)


def test_canonical_rows_sorts_with_nulls_and_mixed_values() -> None:
    rows = canonical_rows([("a", "double"), ("b", "string")], [["NaN", None], [1, "x"], [None, "y"], [1.0, None]])
    assert sorted(json.dumps(r) for r in rows) == [json.dumps(r) for r in rows]
    assert ["NaN", None] in rows and [1.0, "x"] in rows
