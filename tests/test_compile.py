"""Net-change compilation on small explicit inputs, compared with explicit expected rows."""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from applier.engine.compile import compile_cycle, compile_table
from applier.engine.images_spark import parse_image, spark_type
from applier.intermediate.schema import Column, TableDef

pytestmark = pytest.mark.spark

COMMITTED_DDL = "lsn long, xid string, `table` string, op string, before string, after string, commit_lsn long"
ACCOUNTS = TableDef(
    "bank.accounts",
    (Column("id", "bigint", False), Column("owner", "string", True), Column("balance", "decimal(10,2)", True)),
    ("id",),
)
LEDGER = TableDef("bank.ledger", (Column("entry", "string", True), Column("amount", "decimal(10,2)", True)), ())
UTC = dt.UTC


def change(lsn: int, op: str, before: Any = None, after: Any = None, commit: int | None = None, xid: str = "") -> tuple:
    """One committed row (images as dicts); by default its own transaction, committed right after it."""
    commit_lsn = lsn + 1 if commit is None else commit
    return (lsn, xid or f"x{commit_lsn}", "t.t", op, _json(before), _json(after), commit_lsn)


def _json(image: dict[str, Any] | None) -> str | None:
    return None if image is None else json.dumps(image)


def account(id_: int, owner: str, balance: str) -> dict[str, Any]:
    return {"id": id_, "owner": owner, "balance": balance}


def compiled(spark: Any, table: TableDef, changes: list[tuple]) -> Any:
    return compile_table(spark.createDataFrame(changes, COMMITTED_DDL), table)


def rows_of(table: pa.Table, *sort_keys: str) -> list[dict[str, Any]]:
    return table.sort_by([(k, "ascending") for k in sort_keys]).to_pylist() if sort_keys else table.to_pylist()


# --------------------------------------------------------------------------- tables with a primary key


# Scenarios on one table, each on its own keys, so that one Spark compile serves them all:
# name -> (committed rows, expected upserts, expected deletes). Rows without a commit
# are their own transaction, committed right after them.
KEYED_SCENARIOS: dict[str, tuple[list[tuple], list[dict[str, Any]], list[dict[str, Any]]]] = {
    "insert_then_update_is_one_insert_of_the_final_image": (
        [
            change(10, "I", after=account(1, "ann", "1.00")),
            change(20, "U", before={"id": 1}, after=account(1, "ann", "2.50")),
        ],
        [account(1, "ann", "2.50")],
        [],
    ),
    "update_then_update_is_an_update_of_the_final_image": (
        [
            change(110, "U", before=account(2, "bo", "1.00"), after=account(2, "bo", "2.00")),
            change(120, "U", before={"id": 2}, after=account(2, "bob", "3.00")),
        ],
        [account(2, "bob", "3.00")],
        [],
    ),
    "update_then_delete_is_a_delete_of_the_key": (
        [change(210, "U", before={"id": 3}, after=account(3, "cy", "2.00")), change(220, "D", before={"id": 3})],
        [],
        [{"id": 3}],
    ),
    "insert_then_delete_leaves_nothing": (
        [change(310, "I", after=account(4, "di", "1.00")), change(320, "D", before={"id": 4})],
        [],
        [],
    ),
    "delete_then_insert_is_an_update_with_the_final_image": (
        [change(410, "D", before={"id": 5}), change(420, "I", after=account(5, "new", "9.99"))],
        [account(5, "new", "9.99")],
        [],
    ),
    "key_move_deletes_the_old_key_and_inserts_the_new_one": (
        [change(510, "U", before={"id": 6}, after=account(7, "ed", "1.00"))],
        [account(7, "ed", "1.00")],
        [{"id": 6}],
    ),
    "key_move_onto_a_key_deleted_earlier_updates_that_key": (
        [change(610, "D", before={"id": 9}), change(620, "U", before={"id": 8}, after=account(9, "fay", "5.00"))],
        [account(9, "fay", "5.00")],
        [{"id": 8}],
    ),
    "transactions_take_effect_in_commit_order_not_row_order": (
        [
            # Transaction "early" writes first but commits last, so its image wins.
            change(710, "U", before={"id": 10}, after=account(10, "early", "1.00"), commit=750, xid="early"),
            change(720, "U", before={"id": 10}, after=account(10, "late", "2.00"), commit=730, xid="late"),
            change(725, "U", before={"id": 10}, after=account(10, "late-2", "3.00"), commit=730, xid="late"),
        ],
        [account(10, "early", "1.00")],
        [],
    ),
    "insert_moved_away_and_back_is_one_insert": (
        [
            change(810, "I", after=account(11, "gus", "1.00")),
            change(820, "U", before={"id": 11}, after=account(12, "gus", "2.00")),
            change(830, "U", before={"id": 12}, after=account(11, "gus", "3.00")),
        ],
        [account(11, "gus", "3.00")],
        [],
    ),
    "keys_swapped_through_a_free_key_are_two_updates": (
        [
            change(910, "U", before={"id": 13}, after=account(15, "hal", "1.00")),
            change(920, "U", before={"id": 14}, after=account(13, "ivy", "2.00")),
            change(930, "U", before={"id": 15}, after=account(14, "hal", "1.00")),
        ],
        [account(13, "ivy", "2.00"), account(14, "hal", "1.00")],
        [],
    ),
}


def _scenario_keys(rows: list[tuple]) -> set[int]:
    """The ids a scenario's rows touch."""
    images = [json.loads(image) for row in rows for image in row[4:6] if image is not None]
    return {image["id"] for image in images}


@pytest.fixture(scope="module")
def keyed_changes(spark: Any) -> Any:
    """All keyed scenarios compiled together (one Spark compile for the lot)."""
    return compiled(spark, ACCOUNTS, [row for rows, _, _ in KEYED_SCENARIOS.values() for row in rows])


@pytest.mark.parametrize("scenario", list(KEYED_SCENARIOS))
def test_keyed_net_change(keyed_changes: Any, scenario: str) -> None:
    rows, upserts, deletes = KEYED_SCENARIOS[scenario]
    keys = _scenario_keys(rows)

    assert [r for r in rows_of(keyed_changes.upserts, "id") if r["id"] in keys] == [
        {**r, "balance": Decimal(r["balance"])} for r in upserts
    ]
    assert [r for r in rows_of(keyed_changes.deletes, "id") if r["id"] in keys] == deletes


def test_keyed_changes_are_typed_and_counted(keyed_changes: Any) -> None:
    assert keyed_changes.truncate is False
    assert keyed_changes.counted is None
    assert keyed_changes.upserts.schema.names == ["id", "owner", "balance"]
    assert keyed_changes.upserts.schema.types == [pa.int64(), pa.string(), pa.decimal128(10, 2)]
    assert keyed_changes.deletes.schema.names == ["id"]
    assert keyed_changes.deletes.schema.types == [pa.int64()]
    # Inserts: 1, 7, 11; updates: 2, 5, 9, 10, 13, 14; deletes: 3, 6, 8.
    assert keyed_changes.stats == {"I": 3, "U": 6, "D": 3, "T": 0}


def test_composite_key_matches_on_every_key_column(spark: Any) -> None:
    stock = TableDef(
        "shop.stock",
        (Column("region", "string", False), Column("item", "int", False), Column("qty", "int", True)),
        ("region", "item"),
    )
    changes = compiled(
        spark,
        stock,
        [
            change(10, "I", after={"region": "eu", "item": 1, "qty": 5}),
            change(20, "I", after={"region": "us", "item": 1, "qty": 6}),
            change(30, "D", before={"region": "eu", "item": 1}),
            change(40, "U", before={"region": "eu", "item": 2}, after={"region": "eu", "item": 2, "qty": 0}),
            change(50, "D", before={"region": "us", "item": 2}),
        ],
    )

    assert rows_of(changes.upserts, "region", "item") == [
        {"region": "eu", "item": 2, "qty": 0},
        {"region": "us", "item": 1, "qty": 6},
    ]
    assert rows_of(changes.deletes) == [{"region": "us", "item": 2}]
    assert changes.stats == {"I": 1, "U": 1, "D": 1, "T": 0}


def test_keys_compare_as_typed_values_not_text(spark: Any) -> None:
    prices = TableDef("shop.prices", (Column("code", "decimal(5,2)", False), Column("v", "int", True)), ("code",))
    changes = compiled(
        spark,
        prices,
        [
            change(10, "U", before={"code": "1.5"}, after={"v": 2, "code": "1.50"}),
            change(20, "I", after={"code": "2.00", "v": 1}),
            change(30, "D", before={"code": "2.0"}),
        ],
    )

    assert rows_of(changes.upserts) == [{"code": Decimal("1.50"), "v": 2}]
    assert changes.deletes.num_rows == 0
    assert changes.stats == {"I": 0, "U": 1, "D": 0, "T": 0}


def test_truncate_keeps_only_later_rows_and_is_flagged(spark: Any) -> None:
    changes = compiled(
        spark,
        ACCOUNTS,
        [
            change(10, "I", after=account(1, "gone", "1.00")),
            change(20, "D", before={"id": 2}),
            change(30, "T"),
            change(40, "I", after=account(3, "kept", "3.00")),
            change(50, "U", before={"id": 3}, after=account(3, "kept", "4.00")),
            change(60, "I", after=account(4, "brief", "0.00")),
            change(70, "D", before={"id": 4}),
        ],
    )

    assert changes.truncate is True
    assert rows_of(changes.upserts) == [{"id": 3, "owner": "kept", "balance": Decimal("4.00")}]
    assert changes.deletes.num_rows == 0
    assert changes.stats == {"I": 1, "U": 0, "D": 0, "T": 1}


def test_truncate_position_follows_commit_order(spark: Any) -> None:
    changes = compiled(
        spark,
        ACCOUNTS,
        [
            # The insert has the higher lsn but commits before the truncate: it is emptied away.
            change(10, "T", commit=90, xid="trunc"),
            change(20, "I", after=account(1, "before-truncate", "1.00"), commit=80, xid="ins"),
            change(30, "I", after=account(2, "after-truncate", "2.00"), commit=95, xid="ins2"),
        ],
    )

    assert changes.truncate is True
    assert rows_of(changes.upserts) == [{"id": 2, "owner": "after-truncate", "balance": Decimal("2.00")}]
    assert changes.stats == {"I": 1, "U": 0, "D": 0, "T": 1}


def test_added_nullable_column_reads_as_null_in_older_images(spark: Any) -> None:
    evolved = TableDef("bank.accounts", (*ACCOUNTS.columns, Column("note", "string", True)), ("id",))
    changes = compiled(
        spark,
        evolved,
        [
            change(10, "I", after=account(1, "old", "1.00")),
            change(20, "I", after={**account(2, "new", "2.00"), "note": "hi"}),
        ],
    )

    assert rows_of(changes.upserts, "id") == [
        {"id": 1, "owner": "old", "balance": Decimal("1.00"), "note": None},
        {"id": 2, "owner": "new", "balance": Decimal("2.00"), "note": "hi"},
    ]


# --------------------------------------------------------------------------- tables without a primary key


def test_no_key_two_inserts_and_one_delete_of_a_value_count_one(spark: Any) -> None:
    changes = compiled(
        spark,
        LEDGER,
        [
            change(10, "I", after={"entry": "fee", "amount": "1.50"}),
            change(20, "I", after={"amount": "1.5", "entry": "fee"}),
            change(30, "D", before={"entry": "fee", "amount": "1.50"}),
        ],
    )

    assert rows_of(changes.counted) == [{"entry": "fee", "amount": Decimal("1.50"), "__count": 1}]
    assert changes.counted.schema.types == [pa.string(), pa.decimal128(10, 2), pa.int64()]
    assert changes.upserts.num_rows == 0
    assert changes.deletes.num_rows == 0
    assert changes.stats == {"I": 1, "U": 0, "D": 0, "T": 0}


def test_no_key_update_removes_the_old_value_and_adds_the_new(spark: Any) -> None:
    changes = compiled(
        spark,
        LEDGER,
        [
            change(10, "U", before={"entry": "fee", "amount": "1.00"}, after={"entry": "fee", "amount": "2.00"}),
            change(20, "I", after={"entry": None, "amount": None}),
        ],
    )

    assert rows_of(changes.counted, "__count", "amount") == [
        {"entry": "fee", "amount": Decimal("1.00"), "__count": -1},
        {"entry": "fee", "amount": Decimal("2.00"), "__count": 1},
        {"entry": None, "amount": None, "__count": 1},
    ]
    assert changes.stats == {"I": 2, "U": 0, "D": 1, "T": 0}


def test_no_key_values_group_null_safely_and_nan_with_nan(spark: Any) -> None:
    samples = TableDef("lab.samples", (Column("x", "double", True), Column("note", "string", True)), ())
    changes = compiled(
        spark,
        samples,
        [
            change(10, "I", after={"x": "NaN", "note": None}),
            change(20, "I", after={"x": "NaN", "note": None}),
            change(30, "D", before={"x": "NaN", "note": None}),
            change(40, "I", after={"x": None}),  # an image from before "note" was added
            change(50, "D", before={"x": None, "note": None}),
        ],
    )

    counted = changes.counted.to_pylist()
    assert len(counted) == 1
    assert math.isnan(counted[0]["x"])
    assert counted[0]["note"] is None
    assert counted[0]["__count"] == 1


def test_no_key_truncate_keeps_only_later_rows(spark: Any) -> None:
    changes = compiled(
        spark,
        LEDGER,
        [
            change(10, "I", after={"entry": "a", "amount": "1.00"}),
            change(20, "T"),
            change(30, "D", before={"entry": "b", "amount": "2.00"}),
        ],
    )

    assert changes.truncate is True
    assert rows_of(changes.counted) == [{"entry": "b", "amount": Decimal("2.00"), "__count": -1}]
    assert changes.stats == {"I": 0, "U": 0, "D": 1, "T": 1}


# --------------------------------------------------------------------------- typed parsing

ALL_TYPES = TableDef(
    "lab.types",
    (
        Column("id", "int", False),
        Column("big", "bigint", True),
        Column("flag", "boolean", True),
        Column("ratio", "double", True),
        Column("amount", "decimal(38,10)", True),
        Column("label", "string", True),
        Column("day", "date", True),
        Column("at", "timestamp", True),
        Column("blob", "binary", True),
    ),
    ("id",),
)
ALL_TYPES_ARROW = [
    pa.int32(),
    pa.int64(),
    pa.bool_(),
    pa.float64(),
    pa.decimal128(38, 10),
    pa.string(),
    pa.date32(),
    pa.timestamp("us", tz="UTC"),
    pa.binary(),
]


def test_every_type_is_parsed_exactly(spark: Any) -> None:
    images = [
        {
            "id": 2147483647,
            "big": 9223372036854775807,
            "flag": True,
            "ratio": "NaN",
            "amount": "1234567890123456789012345678.0123456789",
            "label": "Zürich ✓ 日本 😀",
            "day": "0001-01-01",
            "at": "2026-11-21T10:00:00.123456Z",
            "blob": "AAEC/w==",
        },
        {
            "id": -2147483648,
            "big": -9223372036854775808,
            "flag": False,
            "ratio": "Infinity",
            "amount": "-0.0000000001",
            "label": "",
            "day": "9999-12-31",
            "at": "1900-01-01T00:00:00.000001Z",
            "blob": "",
        },
        {"id": 0, "big": None, "flag": None, "ratio": "-Infinity", "amount": None, "label": None, "day": None},
        {"id": 1, "ratio": 0.1, "amount": "12.5", "at": "9999-12-31T23:59:59.999999Z"},
    ]
    changes = compiled(spark, ALL_TYPES, [change(10 * (i + 1), "I", after=image) for i, image in enumerate(images)])

    assert changes.upserts.schema.types == ALL_TYPES_ARROW
    got = rows_of(changes.upserts, "id")
    assert got[0] == {
        "id": -2147483648,
        "big": -9223372036854775808,
        "flag": False,
        "ratio": math.inf,
        "amount": Decimal("-0.0000000001"),
        "label": "",
        "day": dt.date(9999, 12, 31),
        "at": dt.datetime(1900, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        "blob": b"",
    }
    assert got[1] == {
        "id": 0,
        "big": None,
        "flag": None,
        "ratio": -math.inf,
        "amount": None,
        "label": None,
        "day": None,
        "at": None,
        "blob": None,
    }
    assert got[2]["ratio"] == 0.1
    assert got[2]["amount"] == Decimal("12.5000000000")
    assert got[2]["at"] == dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert math.isnan(got[3].pop("ratio"))
    assert got[3] == {
        "id": 2147483647,
        "big": 9223372036854775807,
        "flag": True,
        "amount": Decimal("1234567890123456789012345678.0123456789"),
        "label": "Zürich ✓ 日本 😀",
        "day": dt.date(1, 1, 1),
        "at": dt.datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC),
        "blob": b"\x00\x01\x02\xff",
    }


def test_timestamps_keep_their_instant_whatever_the_session_time_zone(spark: Any) -> None:
    events = TableDef("lab.events", (Column("id", "int", False), Column("at", "timestamp", True)), ("id",))
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        changes = compiled(spark, events, [change(10, "I", after={"id": 1, "at": "2026-11-21T10:00:00.123456Z"})])
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")

    assert changes.upserts.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert rows_of(changes.upserts) == [{"id": 1, "at": dt.datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC)}]


def test_parse_image_reads_only_the_given_columns_by_exact_name(spark: Any) -> None:
    columns = [Column("id", "bigint", False), Column("Note", "string", True)]
    images = spark.createDataFrame(
        [('{"id": 5, "note": "lower", "other": [1, 2]}',), ('{"Note": "upper", "id": 6}',), (None,)], "j string"
    )

    parsed = images.select(parse_image(images["j"], columns).alias("p")).collect()

    assert [None if r["p"] is None else r["p"].asDict() for r in parsed] == [
        {"id": 5, "Note": None},
        {"id": 6, "Note": "upper"},
        None,
    ]


def test_parse_image_refuses_a_value_of_the_wrong_type(spark: Any) -> None:
    images = spark.createDataFrame([('{"id": "five"}',)], "j string")

    with pytest.raises(Exception, match="MALFORMED_RECORD_IN_PARSING"):
        images.select(parse_image(images["j"], [Column("id", "bigint", False)])).collect()


def test_spark_type_refuses_an_unknown_type() -> None:
    with pytest.raises(ValueError, match="unknown column type 'money'"):
        spark_type("money")


# --------------------------------------------------------------------------- many tables


def test_a_cycle_of_many_small_tables_writes_one_chunk_per_table_and_spreads_a_busy_one(spark: Any) -> None:
    small = [TableDef(f"s.t{i:02d}", ACCOUNTS.columns, ("id",)) for i in range(30)]
    busy = TableDef("s.busy", ACCOUNTS.columns, ("id",))
    changes = [(i, f"x{t}", t.name, "I", None, _json(account(i, "o", "1.00")), 10_000) for t in small for i in range(5)]
    changes += [(1000 + i, "xb", busy.name, "I", None, _json(account(i, "b", "2.00")), 10_000) for i in range(400)]
    rows = spark.createDataFrame(changes, COMMITTED_DDL)
    tables = {t.name: t for t in [*small, busy]}
    weights = {t.name: 5.0 for t in small} | {busy.name: 400.0}

    def chunk_files(**options: Any) -> tuple[int, dict[str, Any]]:
        result = compile_cycle(rows, tables, {}, tables, partitions=8, **options)
        try:
            files = len(list(result.folder.glob("*.arrow")))
            return files, {name: rows_of(result[name].upserts, "id") for name in result}
        finally:
            result.close()

    alone, changes_alone = chunk_files()
    spread, changes_spread = chunk_files(weights=weights)
    assert alone == 31  # no weights: every table's identities meet in one partition
    assert 31 < spread <= 30 + 16  # the busy table (83% of rows) is cut over up to 2 x 8 x 0.83 salts
    assert changes_spread == changes_alone and len(changes_spread["s.busy"]) == 400
