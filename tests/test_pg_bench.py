"""The benchmark's PostgreSQL parts: the baselines, the limit and the report.

The baselines run against the real server (a fresh database per
test); the last tests run the PostgreSQL steps of ``python -m bench`` at a tiny
size in a subprocess.
"""

from __future__ import annotations

import math
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from applier.intermediate.schema import Column, TableDef
from applier.targets import pg_sql

# bench/ is a folder of scripts at the repository root, not an installed package.
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import figures, limit, pertxn, pg_rowbyrow, report_details  # noqa: E402
from bench.measure import BenchError  # noqa: E402
from bench.pg_server import fingerprints, is_local  # noqa: E402
from bench.source import Prefix, Typed, transaction_net  # noqa: E402

ITEMS = TableDef(
    "shop.items",
    (
        Column("id", "bigint", False),
        Column("name", "string", True),
        Column("price", "decimal(10,2)", False),
        Column("score", "double", True),
    ),
    ("id",),
)
LOG = TableDef(
    "shop.log", (Column("at", "timestamp", False), Column("kind", "string", False), Column("value", "double", True)), ()
)
TAGS = TableDef("shop.tags", (Column("tag", "string", False),), ("tag",))
DEFS = {t.name: t for t in (ITEMS, LOG, TAGS)}
T0, T1 = "2026-01-05T08:00:00Z", "2026-01-05T08:00:01.5Z"


def item(i: int, name: str | None, price: str, score: Any) -> dict[str, Any]:
    return {"id": i, "name": name, "price": price, "score": score}


def log(at: str, kind: str, value: Any) -> dict[str, Any]:
    return {"at": at, "kind": kind, "value": value}


# Three source transactions touching every kind of change: a key that changes, a delete by key-only
# before-image, duplicate rows without a key and a delete of one of them, NaN, nulls, and a truncate
# between inserts of one transaction.
TRANSACTIONS = {
    "t1": [
        ("shop.items", "I", None, item(1, "a", "1.50", 0.5)),
        ("shop.items", "I", None, item(2, "b", "2.00", "NaN")),
        ("shop.items", "I", None, item(3, None, "3.00", None)),
        ("shop.log", "I", None, log(T0, "x", 1.0)),
        ("shop.log", "I", None, log(T0, "x", 1.0)),
        ("shop.log", "I", None, log(T1, "y", "NaN")),
        ("shop.tags", "I", None, {"tag": "p"}),
    ],
    "t2": [
        ("shop.items", "U", item(1, "a", "1.50", 0.5), item(1, "a2", "1.75", 0.5)),
        ("shop.items", "U", {"id": 2}, item(20, "b", "2.00", "NaN")),
        ("shop.items", "D", {"id": 3}, None),
        ("shop.log", "D", log(T0, "x", 1.0), None),
        ("shop.log", "U", log(T1, "y", "NaN"), log(T1, "y", 2.0)),
    ],
    "t3": [
        ("shop.tags", "I", None, {"tag": "q"}),
        ("shop.tags", "T", None, None),
        ("shop.tags", "I", None, {"tag": "r"}),
    ],
}
EXPECTED = {
    "shop.items": [(1, "a2", Decimal("1.75"), 0.5), (20, "b", Decimal("2.00"), "NaN")],
    "shop.log": [("x", 1.0), ("y", 2.0)],
    "shop.tags": [("r",)],
}


def prefix() -> Prefix:
    rows = sum(len(c) for c in TRANSACTIONS.values())
    return Prefix(dict(DEFS), list(TRANSACTIONS), {k: list(v) for k, v in TRANSACTIONS.items()}, rows, 0.0)


QUERIES = {
    "shop.items": "SELECT id, name, price, score FROM shop.items ORDER BY id",
    "shop.log": "SELECT kind, value FROM shop.log ORDER BY kind, value",
    "shop.tags": "SELECT tag FROM shop.tags ORDER BY tag",
}


def table_rows(url: str, tables: tuple[str, ...] = tuple(QUERIES)) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {
            name: [
                tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in r)
                for r in conn.execute(QUERIES[name])
            ]
            for name in tables
        }


# ------------------------------------------------------------------ pure parts


def test_transaction_net_keeps_the_last_image_per_key_and_cuts_at_a_truncate() -> None:
    typed = {name: Typed(t) for name, t in DEFS.items()}
    nets = transaction_net(TRANSACTIONS["t2"] + TRANSACTIONS["t3"], typed)
    items, tags = nets["shop.items"], nets["shop.tags"]
    assert items.truncate is False
    upserts = items.upserts.to_pylist()
    assert [{**r, "score": "NaN" if math.isnan(r["score"]) else r["score"]} for r in upserts] == [
        {"id": 1, "name": "a2", "price": Decimal("1.75"), "score": 0.5},
        {"id": 20, "name": "b", "price": Decimal("2.00"), "score": "NaN"},
    ]
    assert items.deletes.to_pylist() == [{"id": 2}, {"id": 3}]
    assert (tags.truncate, tags.upserts.column("tag").to_pylist(), tags.deletes.num_rows) == (True, ["r"], 0)


def test_transaction_net_of_a_keyless_table_counts_row_values() -> None:
    typed = {name: Typed(t) for name, t in DEFS.items()}
    changes = [
        ("shop.log", "I", None, log(T0, "x", 1.0)),
        ("shop.log", "I", None, log(T0, "x", 1.0)),
        ("shop.log", "D", log(T0, "x", 1.0), None),
        ("shop.log", "U", log(T1, "y", "NaN"), log(T1, "y", 2.0)),
        ("shop.log", "I", None, log(T1, "z", None)),
        ("shop.log", "D", log(T1, "z", None), None),
    ]
    counted = transaction_net(changes, typed)["shop.log"].counted
    assert counted is not None
    got = [(r["kind"], r["__count"]) for r in counted.to_pylist()]
    assert got == [("x", 1), ("y", -1), ("y", 1)]
    assert math.isnan(counted.column("value")[1].as_py())


def test_row_statements_quote_identifiers_and_bind_every_value() -> None:
    weird = TableDef('s.t"x', (Column('a"b', "bigint", False), Column("select", "string", True)), ('a"b',))
    keyless = TableDef("s.l", (Column("v", "double", True), Column("k", "string", False)), ())
    ident, plain = sql.Identifier("s", 't"x'), sql.Identifier("s", "l")
    assert pg_rowbyrow.insert_row(ident, weird).as_string(None) == (
        'INSERT INTO "s"."t""x" ("a""b", "select") VALUES (%s, %s)'
    )
    assert pg_rowbyrow.update_row(ident, weird).as_string(None) == (
        'UPDATE "s"."t""x" SET "a""b" = %s, "select" = %s WHERE "a""b" = %s'
    )
    assert pg_rowbyrow.delete_row(ident, weird).as_string(None) == 'DELETE FROM "s"."t""x" WHERE "a""b" = %s'
    assert pg_rowbyrow.delete_one_copy(plain, keyless).as_string(None) == (
        'DELETE FROM "s"."l" WHERE ctid = (SELECT ctid FROM "s"."l" WHERE "v" IS NOT DISTINCT FROM %s AND "k" = %s '
        "LIMIT 1)"
    )


def test_merge_statement_deletes_updates_and_inserts_from_staging() -> None:
    stage = sql.Identifier("applier_staging", "x_0")
    assert pg_sql.merge_keyed(sql.Identifier("shop", "items"), stage, ITEMS).as_string(None) == (
        'MERGE INTO "shop"."items" AS t USING "applier_staging"."x_0" AS s ON "t"."id" = "s"."id" '
        "WHEN MATCHED AND s.\"__op\" = 'D' THEN DELETE "
        'WHEN MATCHED THEN UPDATE SET "name" = "s"."name", "price" = "s"."price", "score" = "s"."score" '
        'WHEN NOT MATCHED AND s."__op" <> \'D\' THEN INSERT ("id", "name", "price", "score") '
        'VALUES ("s"."id", "s"."name", "s"."price", "s"."score")'
    )


def test_extrapolations_count_the_first_half_once_or_scale_the_whole_prefix() -> None:
    part = {"transactions": 100, "half_transactions": 50, "seconds": 30.0, "half_s": 20.0}
    assert figures.linear(part, 1000) == 300.0
    assert figures.steady(part, 1000) == 20.0 + 10.0 / 50 * 950


def _baselines(per_transactions: int, row_transactions: int, committed: int = 1000) -> dict[str, Any]:
    part = {"rows": 10, "half_transactions": 1, "half_rows": 5, "seconds": 2.0, "half_s": 1.0}
    return {
        "workloads": {"narrow": {"committed": committed}},
        "pg-pertxn": {**part, "transactions": per_transactions},
        "pg-rowbyrow": {**part, "transactions": row_transactions},
    }


def test_a_baseline_that_applies_every_transaction_is_measured_and_a_prefix_is_extrapolated() -> None:
    assert figures.whole({"transactions": 1000}, 1000) and not figures.whole({"transactions": 999}, 1000)


def test_the_report_says_how_a_prefix_was_extrapolated_and_which_baseline_matched_the_compiled_rows() -> None:
    r = {**_baselines(1000, 60), "pg-baselines": {"agree": None, "match_compiled": {"pg-pertxn": True}}}
    lines: list[str] = []
    report_details._pg_basis(r, lines.append)
    text = " ".join(lines)
    assert "extrapolated linearly to all 1,000 committed transactions" in text
    assert (
        "in every table: not compared (different prefixes); per-transaction and the one-cycle compiled apply "
        "leave the same rows: yes." in text
    )
    assert "row-by-row and the one-cycle" not in text


@pytest.mark.parametrize(
    ("server", "local"),
    [
        ("host=127.0.0.1 port=5432 user=postgres", True),
        ("user=postgres", True),
        ("host=/var/run/postgresql", True),
        ("postgresql://ci@localhost:5433", True),
        ("host=db.example user=ci", False),
        ("postgresql://ci@10.0.0.7/postgres", False),
    ],
)
def test_a_server_is_local_on_loopback_or_a_socket(server: str, local: bool) -> None:
    assert is_local(server) is local


# ------------------------------------------------------------------ against PostgreSQL


@pytest.mark.postgres
@pytest.mark.parametrize("apply_prefix", [pertxn.apply_prefix, pg_rowbyrow.apply_prefix], ids=["pertxn", "rowbyrow"])
def test_baseline_applies_each_source_transaction_to_the_expected_rows(apply_prefix: Any, pg_url: str) -> None:
    result = apply_prefix(pg_url, prefix())
    assert table_rows(pg_url) == EXPECTED
    assert (result["transactions"], result["rows"], result["commits"]) == (3, 15, 3)
    assert (result["half_transactions"], result["half_rows"]) == (1, 7)


@pytest.mark.postgres
def test_row_by_row_refuses_an_update_of_a_row_the_table_does_not_hold(pg_url: str) -> None:
    bad = Prefix(dict(DEFS), ["t"], {"t": [("shop.items", "U", {"id": 9}, item(9, "z", "1.00", None))]}, 1, 0.0)
    with pytest.raises(BenchError, match=r"shop\.items: U of \{'id': 9\} touched 0 rows"):
        pg_rowbyrow.apply_prefix(pg_url, bad)


@pytest.mark.postgres
def test_limit_rebuilds_the_source_rows(pg_url: str) -> None:
    from pg_support import fresh_database

    pertxn.apply_prefix(pg_url, prefix())
    with fresh_database() as limit_url:
        result = limit.copy_and_apply(pg_url, limit_url, DEFS)
        assert fingerprints(limit_url, DEFS) == fingerprints(pg_url, DEFS)
        assert result["final_rows"] == 5
        assert {name: t["rows"] for name, t in result["per_table"].items()} == {
            "shop.items": 2,
            "shop.log": 2,
            "shop.tags": 1,
        }


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.postgres
def test_whole_benchmark_runs_at_a_tiny_size_and_drops_its_databases(tmp_path: Path) -> None:
    from pg_support import SERVER, database_url

    out = tmp_path / "report.md"
    cmd = [
        sys.executable, "-m", "bench", "--steps", "pg", "--transactions", "300", "--file-size-mb", "0.25",
        "--server", SERVER,
        "--workdir", str(tmp_path / "work"), "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-3000:]
    report = out.read_text(encoding="utf-8")
    headings = (
        "## Side by side: PostgreSQL",
        "## Goals of the issues",
        "## Peak memory",
    )
    for heading in headings:
        assert heading in report
    assert "Both compiled runs leave the same rows (count and digest) in every table: yes." in report
    assert report.split("Both baselines leave the same rows")[1].startswith(" (count and digest) in every table: yes;")
    # By default both baselines apply every committed transaction: measured, and equal to the compiled apply.
    assert "| per-transaction (measured) |" in report and "| log-order row-by-row (measured) |" in report
    assert "extrapolated" not in report.split("## Side by side")[1].split("## Every `applier run`")[0]
    assert "per-transaction and the one-cycle compiled apply leave the same rows: yes" in report
    assert "row-by-row and the one-cycle compiled apply leave the same rows: yes" in report
    with psycopg.connect(database_url("postgres")) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [f"cdc_bench_{proc.pid}_%"])
        assert left.fetchall() == []
    assert not (tmp_path / "work").exists()


def test_benchmark_refuses_a_server_it_cannot_reach_without_showing_the_password(tmp_path: Path) -> None:
    server = "host=127.0.0.1 port=1 user=postgres password=s3cret connect_timeout=5"
    cmd = [sys.executable, "-m", "bench", "--server", server, "--workdir", str(tmp_path / "work")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "bench: error: cannot connect to PostgreSQL at " in proc.stderr
    assert "port=1" in proc.stderr
    assert "s3cret" not in proc.stderr + proc.stdout
    assert not (tmp_path / "work").exists()
