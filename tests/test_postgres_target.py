"""The PostgreSQL target against the real server (a fresh database per test; no Spark)."""

from __future__ import annotations

import datetime as dt
import math
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from applier.engine.changes import arrow_schema
from applier.engine.compiled import CompiledCycle
from applier.engine.identity import NET_OP
from applier.engine.queue import MemoryQueue
from applier.errors import TargetError
from applier.targets import Part, pg_sql
from applier.targets.pg_load import binary_copy
from applier.targets.postgres import PostgresTarget, redacted
from test_delta_target import ALL_TYPES, counted, keyed, table_def

pytestmark = pytest.mark.postgres

UTC = dt.UTC
NAN, INF = float("nan"), float("inf")
ORDERS = table_def(
    "shop.orders", [("id", "bigint", False), ("status", "string", True), ("total", "decimal(10,2)", True)], ("id",)
)
LINES = table_def(
    "shop.lines", [("order_id", "bigint", False), ("line", "int", False), ("qty", "int", True)], ("order_id", "line")
)
EVENTS = table_def("shop.events", [("kind", "string", True), ("value", "double", True)])


def target(url: str, tmp_path: Path, **kwargs: Any) -> PostgresTarget:
    return PostgresTarget(url, "demo", **kwargs)


def rows(url: str, table: str, order: str) -> list[tuple[Any, ...]]:
    schema, name = table.split(".")
    with psycopg.connect(url) as conn:
        query = sql.SQL("SELECT * FROM {} ORDER BY {}").format(sql.Identifier(schema, name), sql.SQL(order))
        return [tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in r) for r in conn.execute(query)]


def checkpoint_row(url: str) -> tuple[Any, ...] | None:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT cycle_id, applied_seq, applied_commit_lsn, restart_seq FROM applier_checkpoint"
        ).fetchone()


# ------------------------------------------------------------------ pure parts


def test_sql_quotes_every_identifier() -> None:
    weird = table_def('s.t"x', [('a"b', "bigint", False), ("select", "string", True)], ('a"b',))
    ident = pg_sql.target_table(weird, {"s": "replica"})
    stage = sql.Identifier("applier_staging", "demo_0")
    assert pg_sql.create_table(ident, weird).as_string(None) == (
        'CREATE TABLE IF NOT EXISTS "replica"."t""x" ("a""b" bigint NOT NULL, "select" text, PRIMARY KEY ("a""b"))'
    )
    assert pg_sql.delete_keyed(ident, stage, weird).as_string(None) == (
        'DELETE FROM "replica"."t""x" AS t USING "applier_staging"."demo_0" AS s '
        'WHERE s."__op" = \'D\' AND "t"."a""b" = "s"."a""b"'
    )
    assert pg_sql.update_keyed(ident, stage, weird, "U").as_string(None) == (
        'UPDATE "replica"."t""x" AS t SET "select" = "s"."select" FROM "applier_staging"."demo_0" AS s '
        'WHERE s."__op" = \'U\' AND "t"."a""b" = "s"."a""b"'
    )
    assert pg_sql.insert_missing(ident, stage, weird, "I").as_string(None) == (
        'INSERT INTO "replica"."t""x" ("a""b", "select") SELECT "a""b", "select" FROM "applier_staging"."demo_0" '
        'WHERE "__op" = \'I\' ON CONFLICT ("a""b") DO NOTHING'
    )


def test_types_map_to_postgresql_types() -> None:
    assert [pg_sql.pg_type(t) for t in ("int", "bigint", "boolean", "double", "string")] == [
        "integer",
        "bigint",
        "boolean",
        "double precision",
        "text",
    ]
    assert [pg_sql.pg_type(t) for t in ("decimal(12,2)", "date", "timestamp", "binary")] == [
        "numeric(12,2)",
        "date",
        "timestamptz",
        "bytea",
    ]


def test_binary_copy_is_pgcopy_data_and_nothing_for_no_rows() -> None:
    data = b"".join(binary_copy(pa.table({"s": ["x"]})))
    assert data.startswith(b"PGCOPY\n\xff\r\n\x00") and data.endswith(b"\xff\xff")  # signature ... trailer
    assert list(binary_copy(None)) == []


def test_binary_copy_keeps_empty_from_null_bytes_specials_and_a_first_chunk_empty(pg_url: str) -> None:
    schema = pa.schema([("s", pa.string()), ("b", pa.binary()), ("f", pa.float64()), ("d", pa.decimal128(12, 3)),
                        ("t", pa.timestamp("us", tz="UTC")), ("day", pa.date32()), ("i", pa.int32()),
                        ("ok", pa.bool_())])  # fmt: skip
    values = [
        ["", None, 'a"b,\nc', "é ☃"],
        [b"\x00\xffA", b"", None, b"\x10"],
        [NAN, INF, -INF, None],
        [Decimal("-12.345"), Decimal("0.000"), None, Decimal("999999999.999")],
        [dt.datetime(1, 1, 1, tzinfo=UTC), None, dt.datetime(2026, 11, 28, 12, 0, 0, 123456, tzinfo=UTC),
         dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)],
        [dt.date(1, 1, 1), dt.date(2024, 2, 29), None, dt.date(9999, 12, 31)],
        [-(2**31), 0, None, 2**31 - 1],
        [True, False, None, True],
    ]  # fmt: skip
    rows = pa.concat_tables([schema.empty_table(), pa.Table.from_arrays(
        [pa.array(v, f.type) for v, f in zip(values, schema, strict=True)], schema=schema)])  # fmt: skip
    assert rows.column(0).num_chunks == 2 and len(rows.column(0).chunk(0)) == 0
    with psycopg.connect(pg_url) as conn:
        conn.execute(
            "CREATE TABLE copied (s text, b bytea, f double precision, d numeric(12,3), t timestamptz, day date, "
            "i integer, ok boolean)"
        )
        with conn.cursor().copy("COPY copied FROM STDIN (FORMAT binary)") as copy:
            for data in binary_copy(rows):
                copy.write(data)
        got = conn.execute("SELECT * FROM copied").fetchall()
    assert len(got) == 4
    for column, (sent, back) in enumerate(zip(values, zip(*got, strict=True), strict=True)):
        same = [("NaN" if isinstance(v, float) and math.isnan(v) else v) for v in back]
        want = [("NaN" if isinstance(v, float) and math.isnan(v) else v) for v in sent]
        assert same == want, schema.field(column).name


def test_redacted_drops_the_password() -> None:
    shown = redacted("postgresql://app:s3cret@db.example:5433/warehouse")
    assert "s3cret" not in shown and "db.example" in shown and "warehouse" in shown


# ------------------------------------------------------------------ against the server


def test_every_type_round_trips_with_specials(pg_url: str, tmp_path: Path) -> None:
    row = {
        "id": 1,
        "i": -5,
        "flag": True,
        "x": NAN,
        "amount": Decimal("12.50"),
        "note": "",
        "day": dt.date(1, 1, 1),
        "at": dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
        "blob": b"\x00\xff",
    }
    second = {**dict.fromkeys(row), "id": 2, "x": -INF, "note": 'quote " and, comma\nnewline'}
    t = target(pg_url, tmp_path)
    t.apply_cycle(1, {ALL_TYPES.name: keyed(ALL_TYPES, [row, second])}, {"applied_seq": 3})
    got = rows(pg_url, "public.all_types", "id")
    assert got[0] == tuple("NaN" if k == "x" else v for k, v in row.items())
    assert got[1] == (2, None, None, -INF, None, second["note"], None, None, None)
    read = t.read_arrow(ALL_TYPES.name)
    assert read is not None and read.schema.types == list(arrow_schema(ALL_TYPES).types)
    assert read.sort_by("id").column("at").to_pylist()[0] == row["at"]
    assert checkpoint_row(pg_url) == (1, 3, 0, 0)


def test_upserts_and_deletes_on_a_composite_key(pg_url: str, tmp_path: Path) -> None:
    t = target(pg_url, tmp_path)
    first = [{"order_id": 1, "line": 1, "qty": 1}, {"order_id": 1, "line": 2, "qty": 2}, {"order_id": 2, "line": 1}]
    t.apply_cycle(1, {LINES.name: keyed(LINES, first)}, {})
    change = keyed(LINES, [{"order_id": 1, "line": 2, "qty": 20}, {"order_id": 3, "line": 1, "qty": 3}])
    change = keyed(LINES, change.upserts.to_pylist(), [{"order_id": 1, "line": 1}])
    t.apply_cycle(2, {LINES.name: change}, {})
    assert rows(pg_url, "shop.lines", "order_id, line") == [(1, 2, 20), (2, 1, None), (3, 1, 3)]
    assert t.committed_cycle(LINES.name) == 2
    # One checkpoint row holds every table's cycle, even a table the cycle did not change.
    assert t.committed_cycles([LINES.name, "public.all_types"]) == {LINES.name: 2, "public.all_types": 2}


def test_a_cycle_already_committed_is_skipped(pg_url: str, tmp_path: Path) -> None:
    t = target(pg_url, tmp_path)
    assert t.apply_cycle(1, {ORDERS.name: keyed(ORDERS, [{"id": 1, "status": "new"}])}, {}).skipped_tables == []
    again = t.apply_cycle(1, {ORDERS.name: keyed(ORDERS, [{"id": 1, "status": "changed"}])}, {})
    assert again.skipped_tables == [ORDERS.name]
    assert rows(pg_url, "shop.orders", "id") == [(1, "new", None)]


def test_truncate_then_inserts_in_one_cycle(pg_url: str, tmp_path: Path) -> None:
    t = target(pg_url, tmp_path)
    t.apply_cycle(1, {ORDERS.name: keyed(ORDERS, [{"id": 1}, {"id": 2}])}, {})
    t.apply_cycle(2, {ORDERS.name: keyed(ORDERS, [{"id": 3, "status": "after"}], truncate=True)}, {})
    assert rows(pg_url, "shop.orders", "id") == [(3, "after", None)]


def test_keyless_table_deletes_exactly_the_copies_asked_null_and_nan_safe(pg_url: str, tmp_path: Path) -> None:
    t = target(pg_url, tmp_path)
    a, b, c = {"kind": "a", "value": 1.0}, {"kind": None, "value": NAN}, {"kind": "c", "value": None}
    t.apply_cycle(1, {EVENTS.name: counted(EVENTS, [(a, 3), (b, 2), (c, 1)])}, {})
    t.apply_cycle(2, {EVENTS.name: counted(EVENTS, [(a, -2), (b, -1), (c, 2)])}, {})
    assert rows(pg_url, "shop.events", "kind NULLS FIRST, value") == [
        (None, "NaN"),
        ("a", 1.0),
        ("c", None),
        ("c", None),
        ("c", None),
    ]


def test_added_nullable_column_reads_null_in_earlier_rows(pg_url: str, tmp_path: Path) -> None:
    t = target(pg_url, tmp_path)
    t.apply_cycle(1, {ORDERS.name: keyed(ORDERS, [{"id": 1, "status": "old"}])}, {})
    wider = table_def(ORDERS.name, [*((c.name, c.type, c.nullable) for c in ORDERS.columns), ("note", "string", True)])
    wider = type(wider)(wider.name, wider.columns, ("id",))
    t.apply_cycle(2, {ORDERS.name: keyed(wider, [{"id": 2, "note": "new"}])}, {})
    assert rows(pg_url, "shop.orders", "id") == [(1, "old", None, None), (2, None, None, "new")]


def test_a_failing_table_rolls_back_every_table_and_names_table_and_key(pg_url: str, tmp_path: Path) -> None:
    t = target(pg_url, tmp_path)
    t.apply_cycle(1, {ORDERS.name: keyed(ORDERS, [{"id": 1, "status": "kept"}])}, {"applied_seq": 1})
    bad = keyed(LINES, [{"order_id": 7, "line": 1, "qty": 1}])
    too_big = keyed(ORDERS, [{"id": 2, "total": Decimal("12345678.90")}])
    broken = type(too_big)(
        table=too_big.table,
        truncate=False,
        upserts=too_big.upserts.set_column(2, "total", pa.array([Decimal("1e9")], pa.decimal128(38, 2))),
        deletes=too_big.deletes,
        counted=None,
        stats=too_big.stats,
    )
    with pytest.raises(TargetError, match=r"shop\.orders.*key id=2.*numeric field overflow") as caught:
        t.apply_cycle(2, {LINES.name: bad, ORDERS.name: broken}, {"applied_seq": 2})
    assert "password" not in str(caught.value)
    assert rows(pg_url, "shop.orders", "id") == [(1, "kept", None)]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('shop.lines')").fetchone() == (None,)
    assert checkpoint_row(pg_url) == (1, 1, 0, 0)
    t.apply_cycle(2, {LINES.name: bad}, {"applied_seq": 2})  # the next attempt goes through
    assert checkpoint_row(pg_url) == (2, 2, 0, 0)


def test_lost_connection_is_a_target_error_without_the_password(tmp_path: Path) -> None:
    t = PostgresTarget("host=127.0.0.1 port=1 user=app password=s3cret dbname=x connect_timeout=2", "demo")
    with pytest.raises(TargetError) as caught:
        t.apply_cycle(1, {ORDERS.name: keyed(ORDERS, [{"id": 1}])}, {})
    assert "s3cret" not in str(caught.value) and "port=1" in str(caught.value)


def test_two_load_connections_load_ten_tables_in_batches_while_the_waiting_spool(pg_url: str, tmp_path: Path) -> None:
    tables = [table_def(f"wide.t{i}", [("id", "bigint", False), ("v", "string", True)], ("id",)) for i in range(10)]
    queue = MemoryQueue(40_000)  # each table's changes take about 12 KB in memory: most must spool
    compiled = CompiledCycle({td.name: td for td in tables}, frozenset(), queue, tmp_path / "tmp", "demo")
    for td in tables:
        ids = pa.array(range(200), pa.int64())
        compiled.add(td.name, pa.table({NET_OP: ["I"] * 200, "id": ids, "v": ["x" * 50] * 200}))
    assert queue.held <= 40_000
    spooled = {s["file"] for s in compiled.spill_created}
    assert len(spooled) >= 7 and spooled <= {f"demo_wide-2Et{i}.spill" for i in range(10)}
    t = target(pg_url, tmp_path, threads=2)
    seen: set[str] = set()
    peak = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        with psycopg.connect(pg_url, autocommit=True) as conn:
            while not done.is_set():
                n = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = 'applier demo'"
                ).fetchone()
                peak = max(peak, n[0] if n else 0)
                seen.update(p.name for p in (tmp_path / "tmp").glob("*.spill"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        load = t.apply_cycle(1, compiled, {})
    finally:
        done.set()
        watcher.join()
    assert load.batches == [[f"wide.t{i}", f"wide.t{j}"] for i, j in ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))]
    assert peak <= 2
    assert queue.held == 0  # every table was released once in staging
    compiled.close()
    assert {s["file"] for s in compiled.spill_removed} == spooled
    assert seen <= spooled and not list((tmp_path / "tmp").glob("*.spill"))
    for td in tables:
        assert len(rows(pg_url, td.name, "id")) == 200
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'applier_staging'").fetchone() == (0,)


@pytest.mark.parametrize("show_row_values", [False, True])
def test_a_check_failure_names_table_key_and_constraint_but_shows_other_values_only_when_asked(
    pg_url: str, tmp_path: Path, show_row_values: bool
) -> None:
    t = target(pg_url, tmp_path, show_row_values=show_row_values)
    t.apply_cycle(1, {ORDERS.name: keyed(ORDERS, [{"id": 1, "status": "kept", "total": Decimal("1.00")}])}, {})
    with psycopg.connect(pg_url) as conn:
        conn.execute("ALTER TABLE shop.orders ADD CONSTRAINT total_positive CHECK (total > 0)")
        conn.execute("CREATE UNIQUE INDEX orders_status ON shop.orders (status)")
    negative = keyed(ORDERS, [{"id": 2, "status": "private-note-4711", "total": Decimal("-5.00")}])
    with pytest.raises(TargetError) as caught:
        t.apply_cycle(2, {ORDERS.name: negative}, {})
    message = str(caught.value)
    assert "table shop.orders" in message and "key id=2" in message and "total_positive" in message, message
    assert ("private-note-4711" in message) is show_row_values and ("-5.00" in message) is show_row_values
    duplicate = keyed(ORDERS, [{"id": 3, "status": "kept", "total": Decimal("3.00")}])
    with pytest.raises(TargetError) as caught:
        t.apply_cycle(2, {ORDERS.name: duplicate}, {})
    message = str(caught.value)
    assert "orders_status" in message and "Key (status)" in message, message
    assert ("=(kept)" in message) is show_row_values
    assert checkpoint_row(pg_url) == (1, 0, 0, 0)


def test_a_part_of_a_cycle_moves_part_through_and_the_last_part_the_cycle(pg_url: str, tmp_path: Path) -> None:
    t = target(pg_url, tmp_path)
    t.apply_cycle(1, {ORDERS.name: keyed(ORDERS, [{"id": 1, "status": "one"}])}, {"applied_seq": 1})
    first, last = Part(0, 4, 9), Part(4, 9, 9)
    t.apply_cycle(2, {ORDERS.name: keyed(ORDERS, [{"id": 2, "status": "two"}])}, {"applied_seq": 5}, first)
    assert checkpoint_row(pg_url) == (1, 1, 0, 0) and (t.committed_cycle(), t.applied_through(2)) == (1, 4)
    again = t.apply_cycle(2, {ORDERS.name: keyed(ORDERS, [{"id": 2, "status": "again"}])}, {"applied_seq": 5}, first)
    assert again.skipped_tables == [ORDERS.name]
    t.apply_cycle(2, {ORDERS.name: keyed(ORDERS, [{"id": 3, "status": "three"}])}, {"applied_seq": 5}, last)
    assert checkpoint_row(pg_url) == (2, 5, 0, 0) and t.applied_through(2) == 0 and t.applied_through(3) == 0
    assert [r[:2] for r in rows(pg_url, "shop.orders", "id")] == [(1, "one"), (2, "two"), (3, "three")]
