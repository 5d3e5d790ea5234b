"""Drift: a target table changed by hand so that applying to it could lose data stops the run before it writes.

Each case reproduces a DBA's change, then applies a cycle: the apply is
refused (exit 4) naming the table, the column, the expected and the found
types, and nothing is written (no value rounded or cut); once changed back,
the same cycle goes through.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from applier.errors import TargetError
from applier.targets.delta import DeltaTarget
from applier.targets.pg_drift import FoundColumn, drift
from applier.targets.postgres import PostgresTarget
from test_delta_target import keyed, table_def
from test_postgres_target import checkpoint_row, rows

ORDERS = table_def(
    "shop.orders", [("id", "bigint", False), ("note", "string", True), ("total", "decimal(12,2)", True)], ("id",)
)


def col(
    name: str,
    data_type: str,
    *,
    length: int | None = None,
    ps: tuple[int, int] | None = None,
    nullable: bool = True,
    default: bool = False,
) -> FoundColumn:
    precision, scale = ps if ps is not None else (None, None)
    return FoundColumn(name, data_type, length, precision, scale, nullable, default)


AS_CREATED = [col("id", "bigint", nullable=False), col("note", "text"), col("total", "numeric", ps=(12, 2))]


def test_a_table_as_created_or_widened_is_no_drift() -> None:
    assert drift(ORDERS, AS_CREATED) is None
    widened = [
        col("id", "bigint", nullable=False),
        col("note", "character varying"),
        col("total", "numeric", ps=(14, 3)),
    ]
    assert drift(ORDERS, widened) is None
    unconstrained = [*AS_CREATED[:2], col("total", "numeric")]
    assert drift(ORDERS, unconstrained) is None
    extra = [*AS_CREATED, col("loaded_at", "timestamp with time zone", nullable=False, default=True), col("x", "text")]
    assert drift(ORDERS, extra) is None


@pytest.mark.parametrize(
    ("changed", "says"),
    [
        ({2: col("total", "numeric", ps=(12, 0))}, "column total: expected numeric(12,2), found numeric(12,0)"),
        ({2: col("total", "numeric", ps=(11, 2))}, "column total: expected numeric(12,2), found numeric(11,2)"),
        ({2: col("total", "double precision")}, "column total: expected numeric(12,2), found double precision"),
        ({1: col("note", "character varying", length=5)}, "column note: expected text, found character varying(5)"),
        ({1: col("note", "text", nullable=False)}, "column note: expected text (nullable), found text not null"),
        ({0: col("id", "integer", nullable=False)}, "column id: expected bigint, found integer not null"),
        ({1: None}, "column note: expected text, found no such column"),
        ({3: col("region", "text", nullable=False)}, "column region: not in the source, found text not null without"),
    ],
)
def test_a_change_that_could_lose_data_is_drift(changed: dict[int, FoundColumn | None], says: str) -> None:
    found: list[FoundColumn | None] = [*AS_CREATED, None]
    for i, c in changed.items():
        found[i] = c
    problem = drift(ORDERS, [c for c in found if c is not None])
    assert problem is not None and problem.startswith(says), problem


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("dba", "says", "undo"),
    [
        (
            "ALTER TABLE shop.orders ALTER COLUMN total TYPE numeric(12,0)",
            "column total: expected numeric(12,2), found numeric(12,0)",
            "ALTER TABLE shop.orders ALTER COLUMN total TYPE numeric(12,2)",
        ),
        (
            "ALTER TABLE shop.orders ALTER COLUMN note TYPE varchar(5)",
            "column note: expected text, found character varying(5)",
            "ALTER TABLE shop.orders ALTER COLUMN note TYPE text",
        ),
        (
            "ALTER TABLE shop.orders ADD COLUMN region text NOT NULL DEFAULT 'eu'; "
            "ALTER TABLE shop.orders ALTER COLUMN region DROP DEFAULT",
            "column region: not in the source, found text not null without a default",
            "ALTER TABLE shop.orders DROP COLUMN region",
        ),
    ],
)
def test_postgresql_drift_stops_the_cycle_before_it_writes_and_the_cycle_goes_through_once_undone(
    pg_url: str, dba: str, says: str, undo: str
) -> None:
    target = PostgresTarget(pg_url, "demo")
    target.apply_cycle(1, {ORDERS.name: keyed(ORDERS, [{"id": 1, "note": "a", "total": Decimal("1.25")}])}, {})
    with psycopg.connect(pg_url) as conn:
        for statement in dba.split("; "):
            conn.execute(statement)
    second = {ORDERS.name: keyed(ORDERS, [{"id": 2, "note": "longer than five", "total": Decimal("21.37")}])}
    with pytest.raises(TargetError) as refused:
        target.apply_cycle(2, second, {})
    message = str(refused.value)
    assert not refused.value.transient and "table shop.orders" in message and says in message, message
    assert checkpoint_row(pg_url) == (1, 0, 0, 0)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM shop.orders").fetchone() == (1,)
        conn.execute(undo)
    target.apply_cycle(2, second, {})
    assert rows(pg_url, "shop.orders", "id")[1] == (2, "longer than five", Decimal("21.37"))


def test_delta_drift_names_the_column_and_both_types(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, "demo")
    target.apply(1, keyed(ORDERS, [{"id": 1, "note": "a", "total": Decimal("1.25")}]))
    path = target.table_path(ORDERS.name)
    schema = pa.schema([("id", pa.int64(), False), ("note", pa.string()), ("total", pa.decimal128(12, 0))])
    rounded = pa.table({"id": [1], "note": ["a"], "total": [Decimal("1")]}, schema=schema)
    write_deltalake(str(path), rounded, mode="overwrite", schema_mode="overwrite")
    with pytest.raises(TargetError) as refused:
        target.apply(2, keyed(ORDERS, [{"id": 2, "note": "b", "total": Decimal("21.37")}]))
    message = str(refused.value)
    assert message.startswith("table shop.orders: the Delta table was changed so that applying to it could lose data")
    assert "column total: expected total decimal(12,2), found total decimal(12,0)" in message, message
    assert target.read_arrow(ORDERS.name).num_rows == 1  # type: ignore[union-attr]


WITH_REGION = table_def(
    "shop.orders",
    [("id", "bigint", False), ("note", "string", True), ("total", "decimal(12,2)", True), ("region", "string", True)],
    ("id",),
)
MISSING = table_def("shop.nowhere", [("id", "bigint", False)], ("id",))


@pytest.mark.postgres
def test_postgresql_drift_is_found_at_the_start_of_a_run_but_columns_still_to_add_are_not_drift(pg_url: str) -> None:
    target = PostgresTarget(pg_url, "demo")
    target.apply_cycle(1, {ORDERS.name: keyed(ORDERS, [{"id": 1, "note": "a", "total": Decimal("1.25")}])}, {})
    target.check_tables({ORDERS.name: ORDERS, MISSING.name: MISSING})
    target.check_tables({WITH_REGION.name: WITH_REGION})  # region comes with the next change to the table
    with psycopg.connect(pg_url) as conn:
        conn.execute("ALTER TABLE shop.orders ALTER COLUMN total TYPE numeric(12,0)")
    with pytest.raises(TargetError, match=r"table shop\.orders: .*column total: expected numeric\(12,2\), found"):
        target.check_tables({ORDERS.name: ORDERS, MISSING.name: MISSING})


def test_delta_drift_is_found_at_the_start_of_a_run_but_columns_still_to_add_are_not_drift(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, "demo")
    target.apply(1, keyed(ORDERS, [{"id": 1, "note": "a", "total": Decimal("1.25")}]))
    target.check_tables({ORDERS.name: ORDERS, MISSING.name: MISSING, WITH_REGION.name: WITH_REGION})
    schema = pa.schema([("id", pa.int64(), False), ("note", pa.string()), ("total", pa.decimal128(12, 0))])
    rounded = pa.table({"id": [1], "note": ["a"], "total": [Decimal("1")]}, schema=schema)
    write_deltalake(str(target.table_path(ORDERS.name)), rounded, mode="overwrite", schema_mode="overwrite")
    with pytest.raises(TargetError, match=r"column total: expected total decimal\(12,2\), found total decimal\(12,0\)"):
        target.check_tables({ORDERS.name: ORDERS})
