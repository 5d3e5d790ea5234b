"""The Delta target against real Delta tables in a temporary folder (delta-rs, no Spark)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from applier.config import Config, TargetConfig
from applier.engine.changes import COUNT_COLUMN, TableChanges, arrow_schema, remove_copies
from applier.errors import ConfigError, TargetError
from applier.intermediate.schema import Column, TableDef
from applier.targets import Part, open_target
from applier.targets.collisions import Collisions
from applier.targets.delta import DeltaTarget

APP = "demo"
UTC = dt.UTC
NAN, INF = float("nan"), float("inf")


def table_def(name: str, columns: list[tuple[str, str, bool]], key: tuple[str, ...] = ()) -> TableDef:
    return TableDef(name, tuple(Column(n, t, nullable) for n, t, nullable in columns), key)


def keyed(
    td: TableDef, upserts: Sequence[dict[str, Any]], deletes: Sequence[dict[str, Any]] = (), *, truncate: bool = False
) -> TableChanges:
    schema = arrow_schema(td)
    key_schema = pa.schema([schema.field(k) for k in td.primary_key])
    return TableChanges(
        table=td,
        truncate=truncate,
        upserts=pa.Table.from_pylist(list(upserts), schema=schema),
        deletes=pa.Table.from_pylist(list(deletes), schema=key_schema),
        counted=None,
        stats={"I": len(upserts), "U": 0, "D": len(deletes), "T": int(truncate)},
    )


def counted(td: TableDef, rows: list[tuple[dict[str, Any], int]], *, truncate: bool = False) -> TableChanges:
    schema = arrow_schema(td)
    full = schema.append(pa.field(COUNT_COLUMN, pa.int64(), nullable=False))
    table = pa.Table.from_pylist([{**row, COUNT_COLUMN: n} for row, n in rows], schema=full)
    return TableChanges(
        table=td,
        truncate=truncate,
        upserts=schema.empty_table(),
        deletes=pa.schema([]).empty_table(),
        counted=table,
        stats={"I": sum(n for _, n in rows if n > 0), "U": 0, "D": -sum(n for _, n in rows if n < 0), "T": 0},
    )


def version(target: DeltaTarget, name: str) -> int:
    return int(DeltaTable(str(target.table_path(name))).version())


def rows_of(target: DeltaTarget, name: str) -> list[dict[str, Any]]:
    """The table's rows, NaN shown as the string "NaN" so rows compare with ``==``, sorted by their repr."""
    table = target.read_arrow(name)
    assert table is not None
    plain = [
        {k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in table.to_pylist()
    ]
    return sorted(plain, key=repr)


ALL_TYPES = table_def(
    "public.all_types",
    [
        ("id", "bigint", False),
        ("i", "int", True),
        ("flag", "boolean", True),
        ("x", "double", True),
        ("amount", "decimal(12,2)", True),
        ("note", "string", True),
        ("day", "date", True),
        ("at", "timestamp", True),
        ("blob", "binary", True),
    ],
    ("id",),
)


def test_every_type_round_trips_with_specials(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    rows = [
        {"id": 1, "i": 2**31 - 1, "flag": True, "x": NAN, "amount": Decimal("1234567890.12"), "note": "héllo ✓ 日本",
         "day": dt.date(2026, 11, 21), "at": dt.datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC),
         "blob": b"\x00\xff\x10"},
        {"id": 2, "i": -(2**31), "flag": False, "x": INF, "amount": Decimal("-0.01"), "note": "",
         "day": dt.date(1, 1, 1), "at": dt.datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC), "blob": b""},
        {"id": 3, "i": None, "flag": None, "x": -INF, "amount": None, "note": None,
         "day": None, "at": None, "blob": None},
        {"id": 2**63 - 1, "i": 0, "flag": True, "x": -0.5e-300, "amount": Decimal("9999999999.99"), "note": "a`b'c\n",
         "day": dt.date(9999, 12, 31), "at": dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
         "blob": bytes(range(256))},
    ]  # fmt: skip
    target.apply(1, keyed(ALL_TYPES, rows))

    table = target.read_arrow("public.all_types")
    assert table is not None
    assert table.schema.equals(arrow_schema(ALL_TYPES))
    assert [str(f.type) for f in DeltaTable(str(target.table_path("public.all_types"))).schema().fields] == [
        'PrimitiveType("long")', 'PrimitiveType("integer")', 'PrimitiveType("boolean")', 'PrimitiveType("double")',
        'PrimitiveType("decimal(12,2)")', 'PrimitiveType("string")', 'PrimitiveType("date")',
        'PrimitiveType("timestamp")', 'PrimitiveType("binary")',
    ]  # fmt: skip
    got = {r["id"]: r for r in table.to_pylist()}
    assert math.isnan(got[1]["x"]) and got[2]["x"] == INF and got[3]["x"] == -INF and got[2**63 - 1]["x"] == -0.5e-300
    assert got[1]["amount"] == Decimal("1234567890.12") and str(got[2]["amount"]) == "-0.01"
    assert got[1]["note"] == "héllo ✓ 日本" and got[2**63 - 1]["note"] == "a`b'c\n"
    assert got[1]["at"] == dt.datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC)
    assert got[2]["at"] == dt.datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
    assert got[2**63 - 1]["at"] == dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert got[1]["blob"] == b"\x00\xff\x10" and got[2]["blob"] == b"" and got[2**63 - 1]["blob"] == bytes(range(256))
    assert got[2]["day"] == dt.date(1, 1, 1) and got[1]["i"] == 2**31 - 1 and got[2]["i"] == -(2**31)
    assert got[3] == {"id": 3, "i": None, "flag": None, "x": -INF, "amount": None, "note": None, "day": None,
                      "at": None, "blob": None}  # fmt: skip


# Key columns of three types compared by value, and names that need quoting.
ORDERS = table_def(
    "sales.orders",
    [("order", "decimal(10,2)", False), ("Placed", "timestamp", False), ("k b", "binary", False),
     ("we`ird", "string", True), ("qty", "int", True)],
    ("order", "Placed", "k b"),
)  # fmt: skip
T0 = dt.datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
T1 = dt.datetime(2026, 1, 1, 0, 0, 0, 2, tzinfo=UTC)


def order(n: str, at: dt.datetime, k: bytes, note: str | None, qty: int | None) -> dict[str, Any]:
    return {"order": Decimal(n), "Placed": at, "k b": k, "we`ird": note, "qty": qty}


def test_merge_of_upserts_and_deletes_on_a_composite_key_is_one_commit(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    target.apply(1, keyed(ORDERS, [
        order("1.00", T0, b"a", "one", 1),
        order("1.00", T1, b"a", "same order, other time", 2),
        order("1.00", T0, b"b", "same order, other k", 3),
        order("2.50", T0, b"a", "to delete", 4),
    ]))  # fmt: skip
    before = version(target, "sales.orders")

    target.apply(2, keyed(
        ORDERS,
        upserts=[order("1.00", T0, b"a", "ONE", 10), order("3.00", T1, b"\x00", "new", None)],
        deletes=[{"order": Decimal("2.50"), "Placed": T0, "k b": b"a"},
                 {"order": Decimal("1.00"), "Placed": T0, "k b": b"zz"}],  # not in the table: nothing to delete
    ))  # fmt: skip

    assert version(target, "sales.orders") == before + 1
    assert DeltaTable(str(target.table_path("sales.orders"))).transaction_version(APP) == 2
    assert target.committed_cycle("sales.orders") == 2
    assert rows_of(target, "sales.orders") == sorted([
        order("1.00", T0, b"a", "ONE", 10),
        order("1.00", T1, b"a", "same order, other time", 2),
        order("1.00", T0, b"b", "same order, other k", 3),
        order("3.00", T1, b"\x00", "new", None),
    ], key=repr)  # fmt: skip


def test_same_cycle_applied_twice_changes_nothing(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    events = table_def("app.events", [("what", "string", True), ("n", "bigint", True)])
    target.apply(1, keyed(ORDERS, [order("1.00", T0, b"a", "one", 1)]))
    target.apply(1, counted(events, [({"what": "click", "n": 1}, 2)]))
    versions = (version(target, "sales.orders"), version(target, "app.events"))

    target.apply(1, keyed(ORDERS, [order("1.00", T0, b"a", "changed", 9)], truncate=True))
    target.apply(1, counted(events, [({"what": "click", "n": 1}, 2)]))  # appending again would duplicate

    assert (version(target, "sales.orders"), version(target, "app.events")) == versions
    assert rows_of(target, "sales.orders") == [order("1.00", T0, b"a", "one", 1)]
    assert rows_of(target, "app.events") == [{"what": "click", "n": 1}, {"what": "click", "n": 1}]
    target.apply(3, counted(events, [({"what": "view", "n": None}, 1)]))
    target.apply(2, counted(events, [({"what": "late", "n": None}, 1)]))  # a lower cycle is committed already
    assert target.committed_cycle("app.events") == 3
    assert [r["what"] for r in rows_of(target, "app.events")] == ["click", "click", "view"]
    # Each Delta table answers for itself; a table never written holds no cycle.
    assert target.committed_cycles(["app.events", "sales.orders", "sales.never"]) == {
        "app.events": 3,
        "sales.orders": 1,
        "sales.never": 0,
    }


def test_truncate_then_inserts_in_one_commit(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    target.apply(1, keyed(ORDERS, [order("1.00", T0, b"a", "old", 1), order("2.00", T0, b"a", "old", 2)]))
    before = version(target, "sales.orders")

    target.apply(2, keyed(ORDERS, [order("1.00", T0, b"a", "after truncate", 5)], truncate=True))

    assert version(target, "sales.orders") == before + 1 and target.committed_cycle("sales.orders") == 2
    assert rows_of(target, "sales.orders") == [order("1.00", T0, b"a", "after truncate", 5)]
    target.apply(3, keyed(ORDERS, [], truncate=True))
    assert version(target, "sales.orders") == before + 2 and target.committed_cycle("sales.orders") == 3
    assert rows_of(target, "sales.orders") == []


NOKEY = table_def("app.log", [("msg", "string", True), ("x", "double", True), ("amount", "decimal(5,1)", True)])


def test_no_key_table_deletes_exactly_the_copies_asked_null_and_nan_safe(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    dup = {"msg": None, "x": NAN, "amount": Decimal("1.5")}
    target.apply(1, counted(NOKEY, [
        (dup, 3),
        ({"msg": None, "x": 1.0, "amount": Decimal("1.5")}, 1),
        ({"msg": "", "x": NAN, "amount": None}, 2),
    ]))  # fmt: skip
    before = version(target, "app.log")

    target.apply(
        2,
        counted(
            NOKEY,
            [(dup, -2), ({"msg": "", "x": NAN, "amount": None}, -1), ({"msg": "new", "x": INF, "amount": None}, 1)],
        ),
    )

    assert version(target, "app.log") == before + 1 and target.committed_cycle("app.log") == 2
    assert rows_of(target, "app.log") == sorted([
        {"msg": None, "x": "NaN", "amount": Decimal("1.5")},
        {"msg": None, "x": 1.0, "amount": Decimal("1.5")},
        {"msg": "", "x": "NaN", "amount": None},
        {"msg": "new", "x": INF, "amount": None},
    ], key=repr)  # fmt: skip


def test_no_key_table_counts_copies_to_delete_that_it_does_not_hold_as_collisions(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    row = {"msg": "a", "x": None, "amount": None}
    target.apply(1, counted(NOKEY, [(row, 1)]))
    assert target.apply_one(2, counted(NOKEY, [(row, -2)])) == (True, 2, {"delete": 1})
    assert rows_of(target, "app.log") == []
    with pytest.raises(ConfigError, match=r"errors\.actions\.collision.*cannot refuse them"):
        DeltaTarget(tmp_path, APP, collisions=Collisions(refuse=True, action="stop"))


def test_a_merge_counts_deletes_that_found_nothing_and_the_balance_of_inserts(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    orders = table_def("sales.items", [("id", "bigint", False), ("qty", "int", True)], ("id",))
    target.apply(1, keyed(orders, [{"id": 1, "qty": 1}, {"id": 2, "qty": 2}]))
    change = keyed(orders, [{"id": 2, "qty": 20}, {"id": 3, "qty": 30}], [{"id": 1}, {"id": 9}])
    held_insert = replace(change, new=pa.array([True, False]))  # 2 is held; 3 is an update that finds nothing
    assert target.apply_one(2, held_insert) == (True, 2, {"delete": 1})  # the two upsert collisions cancel out
    lone = replace(keyed(orders, [{"id": 3, "qty": 31}]), new=pa.array([True]))  # 3 is held now
    assert target.apply_one(3, lone) == (True, 3, {"insert": 1})
    assert sorted(r["qty"] for r in rows_of(target, "sales.items")) == [20, 31]


def test_no_key_deletes_rewrite_only_the_files_holding_the_copies(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    a, b, c = ({"msg": m, "x": 1.0, "amount": None} for m in "abc")
    target.apply(1, counted(NOKEY, [(a, 2)]))
    target.apply(2, counted(NOKEY, [(a, 1), (b, 1)]))
    target.apply(3, counted(NOKEY, [(c, 5)]))
    before = _files(tmp_path / "app" / "log")
    assert sorted(before.values()) == ["a,a", "a,b", "c,c,c,c,c"]

    target.apply(4, counted(NOKEY, [(a, -3), (b, 1)]))  # every copy of a, spread over two files

    after = _files(tmp_path / "app" / "log")
    untouched = {name for name, held in before.items() if held == "c,c,c,c,c"}
    assert untouched <= set(after) and not (set(before) - untouched) & set(after)
    assert sorted(after.values()) == ["b", "b", "c,c,c,c,c"]  # the rewritten a,b file and the inserted copy
    assert target.committed_cycle("app.log") == 4
    assert rows_of(target, "app.log") == sorted([b, b, *[c] * 5], key=repr)


def _files(path: Path) -> dict[str, str]:
    """Each data file of a keyless table: its name and the messages it holds."""
    return {
        uri.rsplit("/", 1)[-1]: ",".join(sorted(pq.read_table(uri.removeprefix("file://")).column("msg").to_pylist()))
        for uri in DeltaTable(str(path)).file_uris()
    }


def test_remove_copies_treats_negative_zero_as_zero_and_keeps_other_values_exact() -> None:
    schema = pa.schema([pa.field("x", pa.float64())])
    current = pa.Table.from_pylist([{"x": -0.0}, {"x": 0.0}, {"x": -0.0}, {"x": None}], schema=schema)
    removals = pa.Table.from_pylist([{"x": 0.0, COUNT_COLUMN: -2}, {"x": None, COUNT_COLUMN: -1}],
                                    schema=schema.append(pa.field(COUNT_COLUMN, pa.int64())))  # fmt: skip

    kept = remove_copies(current, removals)

    assert [math.copysign(1, v) for v in kept.column("x").to_pylist()] == [-1.0]


def test_remove_copies_compares_every_type_by_value_and_null_equals_null() -> None:
    schema = arrow_schema(table_def("a.b", [(c.name, c.type, True) for c in ALL_TYPES.columns]))
    row = {"id": 1, "i": 2, "flag": True, "x": -INF, "amount": Decimal("1.10"), "note": "ü", "day": dt.date(2020, 1, 1),
           "at": dt.datetime(2020, 1, 1, 0, 0, 0, 7, tzinfo=UTC), "blob": b"\x00"}  # fmt: skip
    other = {**row, "blob": b"\x01"}
    nulls = dict.fromkeys(row)
    current = pa.Table.from_pylist([row, other, row, nulls, nulls], schema=schema)
    removals = pa.Table.from_pylist([{**row, COUNT_COLUMN: -1}, {**nulls, COUNT_COLUMN: -2}],
                                    schema=schema.append(pa.field(COUNT_COLUMN, pa.int64())))  # fmt: skip

    assert sorted(remove_copies(current, removals).to_pylist(), key=repr) == sorted([other, row], key=repr)


def test_added_nullable_column_reads_null_in_earlier_rows(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    v1 = table_def("public.items", [("id", "int", False), ("name", "string", True)], ("id",))
    v2 = table_def("public.items", [("id", "int", False), ("name", "string", True), ("price", "decimal(8,2)", True)],
                   ("id",))  # fmt: skip
    target.apply(1, keyed(v1, [{"id": 1, "name": "old"}]))

    target.apply(2, keyed(v2, [{"id": 2, "name": "new", "price": Decimal("3.10")}]))

    table = target.read_arrow("public.items")
    assert table is not None and table.schema.equals(arrow_schema(v2))
    assert sorted(table.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "name": "old", "price": None},
        {"id": 2, "name": "new", "price": Decimal("3.10")},
    ]
    v3 = table_def("public.items", [*((c.name, c.type, c.nullable) for c in v2.columns), ("sku", "string", False)],
                   ("id",))  # fmt: skip
    with pytest.raises(TargetError, match=r"public.items: cannot add non-nullable columns \['sku'\]"):
        target.apply(3, keyed(v3, []))


def test_table_folder_outside_the_target_folder_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "evil").symlink_to(outside, target_is_directory=True)
    target = DeltaTarget(root, APP)

    with pytest.raises(TargetError, match="is outside the target folder"):
        target.apply(1, keyed(table_def("evil.t", [("id", "int", False)], ("id",)), [{"id": 1}]))
    with pytest.raises(TargetError, match=r"not a plain schema\.table"):
        target.committed_cycle("../x.y")
    assert list(outside.iterdir()) == []


def test_delta_failure_raises_target_error_naming_the_table(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    target.apply(1, keyed(ORDERS, [order("1.00", T0, b"a", "one", 1)]))
    before = version(target, "sales.orders")
    null_key = keyed(ORDERS, [order("1.00", T0, b"a", "x", 1)])
    null_key = TableChanges(**{**null_key.__dict__, "upserts": pa.table({
        "order": pa.array([None], pa.decimal128(10, 2)), "Placed": pa.array([T0], pa.timestamp("us", tz="UTC")),
        "k b": pa.array([b"n"]), "we`ird": pa.array(["x"]), "qty": pa.array([1], pa.int32())})})  # fmt: skip

    with pytest.raises(TargetError, match=r"table sales\.orders: applying cycle 2 failed") as caught:
        target.apply(2, null_key)
    assert isinstance(caught.value.__cause__, DeltaError)
    assert "\n" not in str(caught.value)  # the preview of offending rows stays in the cause

    wrong_type = TableChanges(**{**null_key.__dict__, "upserts": null_key.upserts.set_column(
        4, "qty", pa.array(["not a number"]))})  # fmt: skip
    with pytest.raises(TargetError, match=r"table sales\.orders: applying cycle 2 failed"):
        target.apply(2, wrong_type)
    assert version(target, "sales.orders") == before and target.committed_cycle("sales.orders") == 1


def test_a_new_table_is_created_by_its_first_data_commit_with_the_definitions_schema(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    change = keyed(ORDERS, [order("1.00", T0, b"a", "one", 1)])
    loose = pa.schema([f.with_nullable(True) for f in change.upserts.schema])  # as compiled: every column nullable
    target.apply(4, replace(change, upserts=change.upserts.cast(loose)))

    table = DeltaTable(str(target.table_path("sales.orders")))
    assert table.version() == 0 and table.transaction_version(APP) == 4 and target.committed_cycle("sales.orders") == 4
    assert [f.nullable for f in table.schema().fields] == [False, False, False, True, True]
    assert table.metadata().name == "sales.orders"
    # A keyless table's first change deletes what it cannot hold: collisions; the table is created empty.
    assert target.apply_one(4, counted(NOKEY, [({"msg": "a", "x": None, "amount": None}, -2)]))[2] == {"delete": 2}
    assert rows_of(target, "app.log") == []


def test_key_repeated_in_the_changes_is_refused_before_writing(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    twice = [order("5.00", T0, b"a", "x", 1), order("5.00", T0, b"a", "y", 2), order("6.00", T0, b"a", "z", 3)]
    with pytest.raises(TargetError, match=r"table sales\.orders: 1 keys appear more than once"):
        target.apply(1, keyed(ORDERS, twice))
    with pytest.raises(TargetError, match=r"table sales\.orders: 1 keys appear more than once"):
        target.apply(1, keyed(ORDERS, twice[:1], [{"order": Decimal("5.00"), "Placed": T0, "k b": b"a"}]))
    assert target.committed_cycle("sales.orders") == 0 and target.read_arrow("sales.orders") is None


def test_empty_change_writes_nothing_and_keeps_the_committed_cycle(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    target.apply(1, keyed(ORDERS, [order("1.00", T0, b"a", "one", 1)]))
    before = version(target, "sales.orders")

    target.apply(2, keyed(ORDERS, []))
    target.apply(3, counted(NOKEY, []))

    assert version(target, "sales.orders") == before and target.committed_cycle("sales.orders") == 1
    assert target.committed_cycle("app.log") == 0 and target.read_arrow("app.log") == arrow_schema(NOKEY).empty_table()


def test_missing_table_reads_as_never_written(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    assert target.committed_cycle("a.b") == 0
    assert target.read_arrow("a.b") is None
    assert target.file_uris("a.b") == []
    target.apply(1, counted(NOKEY, [({"msg": "a", "x": 1.0, "amount": None}, 1)]))
    uris = target.file_uris("app.log")
    assert len(uris) == 1 and uris[0].endswith(".parquet") and Path(uris[0]).parent == tmp_path / "app" / "log"


def test_open_target_builds_a_delta_target_from_the_configuration(tmp_path: Path) -> None:
    config = Config("nightly", tmp_path / "in", tmp_path / "out", target=TargetConfig("delta", tmp_path / "tgt"))
    target = open_target(config)
    assert isinstance(target, DeltaTarget) and target.root == tmp_path / "tgt" and target.app_id == "nightly"
    with pytest.raises(ConfigError, match=r"target\.path"):
        open_target(Config("nightly", tmp_path, tmp_path, target=TargetConfig("delta", None)))


def test_parts_of_a_cycle_are_tagged_with_their_end_and_each_applies_once(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP)
    events = table_def("app.events", [("what", "string", True)])
    first, last = Part(0, 3, 5), Part(3, 5, 5)
    assert target.apply_one(2, counted(events, [({"what": "a"}, 1)]), first) == (True, 2, {})
    assert DeltaTable(str(tmp_path / "app" / "events")).history(1)[0]["applier.through"] == "3"
    assert target.apply_one(2, counted(events, [({"what": "a"}, 1)]), first) == (False, 2, {})  # a re-run
    with pytest.raises(TargetError, match="holds only its first 3 transactions"):
        target.apply_one(2, counted(events, [({"what": "a"}, 1)]))  # whole, over a part: the parts were lost
    assert target.apply_one(2, counted(events, [({"what": "b"}, 1)]), last) == (True, 2, {})
    assert "applier.through" not in DeltaTable(str(tmp_path / "app" / "events")).history(1)[0]  # the cycle is whole
    assert target.apply_one(2, counted(events, [({"what": "b"}, 1)]), last) == (False, 2, {})
    assert target.apply_one(2, counted(events, [({"what": "c"}, 1)]), first) == (False, 2, {})
    assert sorted(r["what"] for r in rows_of(target, "app.events")) == ["a", "b"]
    assert target.committed_cycle("app.events") == 2 and target.applied_through(2) == 0


def test_every_write_keeps_row_groups_within_the_bound_delta_rs_encodes_in_memory(tmp_path: Path) -> None:
    """A cycle's changes to a table are written in row groups of at most ROW_GROUP_ROWS: created, merged, appended."""
    from applier.targets.delta_write import ROW_GROUP_ROWS

    events = table_def("app.events", [("id", "bigint", False), ("note", "string", True)])
    items = table_def("app.items", [("id", "bigint", False), ("note", "string", True)], ("id",))
    n = ROW_GROUP_ROWS + 1_000
    target = DeltaTarget(tmp_path, APP)
    target.apply(1, keyed(items, [{"id": i, "note": "a"} for i in range(n)]))  # created
    target.apply(2, keyed(items, [{"id": i, "note": "b"} for i in range(n, 2 * n)], [{"id": 0}]))  # a MERGE
    target.apply(3, counted(events, [({"id": i, "note": None}, 1) for i in range(n)]))  # created
    target.apply(4, counted(events, [({"id": i, "note": "x"}, 1) for i in range(n)]))  # appended

    for name in ("app.items", "app.events"):
        files = DeltaTable(str(target.table_path(name))).file_uris()
        groups = [pq.ParquetFile(f).metadata for f in files]
        sizes = [m.row_group(i).num_rows for m in groups for i in range(m.num_row_groups)]
        assert sum(sizes) == 2 * n - (name == "app.items") and max(sizes) <= ROW_GROUP_ROWS, (name, sizes)
