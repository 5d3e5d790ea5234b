"""Validation of target loads with Great Expectations: suites, clean loads, damaged tables, the CLI.

The Spark tests share one real engine run over a small generated workload
(module fixture); each damage case copies its target and checkpoint first and
damages the copy with delta-rs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Field, write_deltalake

from applier.config import Config, ValidateConfig
from applier.engine.checkpoint import CheckpointStore
from applier.errors import UsageError, ValidationError
from applier.generate import generate_workload
from applier.generate.tables import CUSTOMERS, EVENTS, ORDER_LINES, ORDERS, PRODUCTS, TABLE_DEFS, table_def
from applier.validate import (
    ExpectationResult,
    ExpectColumnValuesToBeOfSparkType,
    TableResult,
    ValidationReport,
    table_expectations,
    validate_target,
)
from applier.validate._gx import gx
from applier.validate.read import read_target_table
from applier.validate.report import expectation_result
from engine_support import make_config, run

E = gx.expectations
ALL_TABLES = sorted(d.name for d in TABLE_DEFS)


def exactly(expectations: Sequence[Any]) -> list[tuple[str, Any]]:
    """Expectations compared with their kind: GX's ``==`` compares arguments only, not the class."""
    return [(type(e).__name__, e) for e in expectations]


# The suite, a pure function of the definition and the expected count.


def test_suite_of_a_keyed_table_checks_columns_count_types_nulls_and_a_unique_key() -> None:
    got = table_expectations(table_def(ORDERS), 42)
    expected = [
        E.ExpectTableColumnsToMatchOrderedList(
            column_list=["id", "customer_id", "status", "total", "ordered_at", "ship_date", "note"]
        ),
        E.ExpectTableRowCountToEqual(value=42),
        ExpectColumnValuesToBeOfSparkType(column="id", type_="LongType"),
        E.ExpectColumnValuesToNotBeNull(column="id"),
        ExpectColumnValuesToBeOfSparkType(column="customer_id", type_="LongType"),
        E.ExpectColumnValuesToNotBeNull(column="customer_id"),
        ExpectColumnValuesToBeOfSparkType(column="status", type_="StringType"),
        E.ExpectColumnValuesToNotBeNull(column="status"),
        ExpectColumnValuesToBeOfSparkType(column="total", type_="DecimalType(14,2)"),
        E.ExpectColumnValuesToNotBeNull(column="total"),
        ExpectColumnValuesToBeOfSparkType(column="ordered_at", type_="TimestampType"),
        E.ExpectColumnValuesToNotBeNull(column="ordered_at"),
        ExpectColumnValuesToBeOfSparkType(column="ship_date", type_="DateType"),
        ExpectColumnValuesToBeOfSparkType(column="note", type_="StringType"),
        E.ExpectColumnValuesToBeUnique(column="id"),
    ]
    assert exactly(got) == exactly(expected)


def test_suite_of_a_compound_key_table_checks_the_key_combination_unique() -> None:
    got = table_expectations(table_def(ORDER_LINES), 7)
    expected = [
        E.ExpectTableColumnsToMatchOrderedList(
            column_list=["order_id", "line_no", "product_id", "qty", "unit_price", "discount"]
        ),
        E.ExpectTableRowCountToEqual(value=7),
        ExpectColumnValuesToBeOfSparkType(column="order_id", type_="LongType"),
        E.ExpectColumnValuesToNotBeNull(column="order_id"),
        ExpectColumnValuesToBeOfSparkType(column="line_no", type_="IntegerType"),
        E.ExpectColumnValuesToNotBeNull(column="line_no"),
        ExpectColumnValuesToBeOfSparkType(column="product_id", type_="IntegerType"),
        E.ExpectColumnValuesToNotBeNull(column="product_id"),
        ExpectColumnValuesToBeOfSparkType(column="qty", type_="IntegerType"),
        E.ExpectColumnValuesToNotBeNull(column="qty"),
        ExpectColumnValuesToBeOfSparkType(column="unit_price", type_="DecimalType(10,2)"),
        E.ExpectColumnValuesToNotBeNull(column="unit_price"),
        ExpectColumnValuesToBeOfSparkType(column="discount", type_="DoubleType"),
        E.ExpectColumnValuesToNotBeNull(column="discount"),
        E.ExpectCompoundColumnsToBeUnique(column_list=["order_id", "line_no"]),
    ]
    assert exactly(got) == exactly(expected)


def test_suite_of_a_table_without_a_key_checks_no_uniqueness() -> None:
    got = table_expectations(table_def(EVENTS), 0)
    expected = [
        E.ExpectTableColumnsToMatchOrderedList(column_list=["at", "kind", "entity_id", "score", "payload"]),
        E.ExpectTableRowCountToEqual(value=0),
        ExpectColumnValuesToBeOfSparkType(column="at", type_="TimestampType"),
        E.ExpectColumnValuesToNotBeNull(column="at"),
        ExpectColumnValuesToBeOfSparkType(column="kind", type_="StringType"),
        E.ExpectColumnValuesToNotBeNull(column="kind"),
        ExpectColumnValuesToBeOfSparkType(column="entity_id", type_="LongType"),
        E.ExpectColumnValuesToNotBeNull(column="entity_id"),
        ExpectColumnValuesToBeOfSparkType(column="score", type_="DoubleType"),
        ExpectColumnValuesToBeOfSparkType(column="payload", type_="StringType"),
    ]
    assert exactly(got) == exactly(expected)


def test_suite_types_cover_every_spec_type() -> None:
    types = {e.column: e.type_ for e in table_expectations(table_def(CUSTOMERS), 1) if hasattr(e, "type_")}
    types |= {e.column: e.type_ for e in table_expectations(table_def(PRODUCTS), 1) if hasattr(e, "type_")}
    assert types["vip"] == "BooleanType"
    assert types["loyalty_points"] == "IntegerType"
    assert types["balance"] == "DecimalType(12,2)"
    assert types["avatar"] == "BinaryType"
    assert types["birth_date"] == "DateType"
    assert types["rating"] == "DoubleType"


# Reading GX results into plain ones (hand-written GX result JSON).


def test_a_per_row_failure_reads_as_its_count_of_unexpected_values() -> None:
    raw = {
        "success": False,
        "expectation_config": {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "order_id"}},
        "result": {"element_count": 10, "unexpected_count": 3, "partial_unexpected_list": [1, 1, 1]},
        "exception_info": {"raised_exception": False, "exception_message": None},
    }
    got = expectation_result(raw)
    assert got == ExpectationResult("expect_column_values_to_be_unique", ("order_id",), False, observed=3)
    assert TableResult("shop.orders", 10, (got,)).failures() == [
        "shop.orders: expect_column_values_to_be_unique(order_id) failed: 3 unexpected values"
    ]


def test_a_table_level_failure_reads_as_observed_and_expected() -> None:
    raw = {
        "success": False,
        "expectation_config": {"type": "expect_table_row_count_to_equal", "kwargs": {"value": 12, "batch_id": "b"}},
        "result": {"observed_value": 11},
        "exception_info": {"raised_exception": False},
    }
    got = expectation_result(raw)
    assert got.describe() == "expect_table_row_count_to_equal failed: observed 11, expected 12"


def test_an_expectation_that_raised_reads_as_its_error() -> None:
    raw = {
        "success": False,
        "expectation_config": {
            "type": "expect_column_values_to_be_of_spark_type",
            "kwargs": {"column": "phone", "type_": "StringType"},
        },
        "result": {},
        "exception_info": {
            "('table.column_types', 'abc', ())": {
                "raised_exception": True,
                "exception_message": "column 'phone' is not in the table\nTraceback ...",
            }
        },
    }
    assert expectation_result(raw).describe() == (
        "expect_column_values_to_be_of_spark_type(phone) failed: raised: column 'phone' is not in the table"
    )


def test_a_missing_table_fails_only_once_it_was_written() -> None:
    never_written = TableResult("shop.x", None, missing=True)
    written = TableResult("shop.y", 4, missing=True)
    assert never_written.success and never_written.failures() == []
    assert not written.success
    assert written.failures() == ["shop.y: the target table is missing; the checkpoint expects 4 rows"]


def test_raise_for_failure_raises_validation_error_with_exit_code_5_listing_the_failures(tmp_path: Path) -> None:
    failed = ExpectationResult("expect_column_values_to_not_be_null", ("name",), False, observed=1)
    report = ValidationReport(
        "cfg",
        "r1",
        {"shop.a": TableResult("shop.a", 1, (failed,)), "shop.b": TableResult("shop.b", 2, missing=True)},
        tmp_path / "validation.json",
        tmp_path / "index.html",
    )
    with pytest.raises(ValidationError) as caught:
        report.raise_for_failure()
    assert caught.value.exit_code == 5
    assert str(caught.value) == (
        "validation failed: shop.a: expect_column_values_to_not_be_null(name) failed: 1 unexpected value; "
        f"shop.b: the target table is missing; the checkpoint expects 2 rows (results: {tmp_path / 'validation.json'})"
    )
    assert report.summary()["tables"] == {
        "shop.a": {"success": False, "expectations": 1, "failed": 1, "missing": False},
        "shop.b": {"success": False, "expectations": 0, "failed": 0, "missing": True},
    }


# Real loads: one engine run, copies damaged with delta-rs.


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Config:
    """A generated workload (with the schema change on shop.customers) applied to Delta by the engine."""
    root = tmp_path_factory.mktemp("loaded")
    workload = generate_workload(root / "in", seed=11, transactions=120, file_size_mb=0.05, profile="demo")
    assert "schema_change" in workload.features
    config = make_config(root, root / "in")
    run(config, spark)
    return config


def copy_of(loaded: Config, tmp_path: Path) -> Config:
    """The loaded target and checkpoint, copied under ``tmp_path`` (the copy is what a test damages)."""
    assert loaded.target.path is not None
    shutil.copytree(loaded.target.path, tmp_path / "target")
    config = make_config(tmp_path, loaded.intermediate_dir)
    config.work_dir.mkdir(parents=True)
    shutil.copy2(loaded.work_dir / "checkpoint.json", config.work_dir / "checkpoint.json")
    return config


ENGINES = ["in memory", "Spark"]


def on(config: Config, engine: str) -> Config:
    """``config`` validating in memory (pandas on Arrow, the default for small tables) or through Spark."""
    return dataclasses.replace(config, validate=ValidateConfig(1_000_000 if engine == "in memory" else 0))


def table_path(config: Config, table: str) -> str:
    assert config.target.path is not None
    schema_name, table_name = table.split(".")
    return str(config.target.path / schema_name / table_name)


@pytest.mark.spark
def test_a_clean_load_passes_every_table_and_writes_json_and_data_docs(loaded: Config, spark: Any) -> None:
    report = validate_target(loaded, spark, results_name="clean")
    assert report.failures() == []
    assert report.success
    assert sorted(report.tables) == ALL_TABLES
    checkpoint = CheckpointStore(loaded.work_dir).load()
    for name, result in report.tables.items():
        suite = table_expectations(checkpoint.tables[name], checkpoint.row_counts[name])
        assert len(result.expectations) == len(suite), name
        assert result.expected_rows == checkpoint.row_counts[name]
        assert result.data_docs_page is not None and result.data_docs_page.is_file(), name
    assert report.json_path == loaded.work_dir / "validation" / "clean" / "validation.json"
    document = json.loads(report.json_path.read_text())
    assert document["success"] is True and document["results_name"] == "clean"
    assert sorted(document["tables"]) == ALL_TABLES
    orders = document["tables"][ORDERS]
    assert orders["expected_rows"] == checkpoint.row_counts[ORDERS]
    assert orders["gx_result"]["success"] is True
    unique = {
        "expectation": "expect_column_values_to_be_unique",
        "columns": ["id"],
        "success": True,
        "observed": 0,
        "expected": None,
        "error": None,
    }
    assert unique in orders["expectations"]
    assert report.data_docs_path == loaded.work_dir / "validation" / "data_docs" / "index.html"
    index = report.data_docs_path.read_text()
    for name in ALL_TABLES:
        assert name in index, f"index.html does not name {name}"
    assert json.loads(json.dumps(report.summary()))["tables"][EVENTS] == {
        "success": True,
        "expectations": 10,
        "failed": 0,
        "missing": False,
    }


class _Loads(HTMLParser):
    """What a page loads: scripts, stylesheets and icons, images, and ``url()`` in its styles."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.cors: list[str] = []
        self._style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        rel = found.get("rel") or ""
        url = found.get("src") if tag in ("script", "img") else found.get("href") if tag == "link" else None
        if url is not None and (tag != "link" or "stylesheet" in rel or "icon" in rel):
            self.urls.append(url)
            if "crossorigin" in found or "integrity" in found:
                self.cors.append(url)
        self._style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._style = False

    def handle_data(self, data: str) -> None:
        if self._style:
            self.urls.extend(css_urls(data))


def css_urls(css: str) -> list[str]:
    return [u for u in re.findall(r"url\(\s*['\"]?([^'\")]+)", css) if not u.startswith("data:")]


def site_loads(site: Path) -> dict[Path, list[str]]:
    """Per page or stylesheet of the site, the URLs it loads."""
    loads: dict[Path, list[str]] = {}
    for page in sorted(site.rglob("*.html")):
        parser = _Loads()
        parser.feed(page.read_text(encoding="utf-8"))
        assert parser.cors == [], f"{page}: a local file with integrity or crossorigin fails from file://"
        loads[page] = parser.urls
    for sheet in sorted(site.rglob("*.css")):
        loads[sheet] = css_urls(sheet.read_text(encoding="utf-8"))
    return loads


@pytest.mark.spark
def test_data_docs_load_every_script_style_font_and_image_from_the_site(loaded: Config, tmp_path: Path) -> None:
    """Offline: nothing is fetched from the network, and every file a page or stylesheet names is in the site."""
    report = validate_target(copy_of(loaded, tmp_path), None, results_name="offline")
    site = report.data_docs_path.parent
    loads = site_loads(site)
    pages = [p.relative_to(site).as_posix() for p in loads if p.suffix == ".html"]
    assert "index.html" in pages and len(pages) == 1 + 2 * len(ALL_TABLES)
    named = [(p, u) for p, urls in loads.items() for u in urls]
    assert [(p.relative_to(site).as_posix(), u) for p, u in named if re.match(r"(https?:)?//", u)] == []
    missing = []
    for page, url in named:
        file = (page.parent / re.split(r"[?#]", url)[0]).resolve()
        if not (file.is_file() and file.is_relative_to(site.resolve())):
            missing.append((page.relative_to(site).as_posix(), url))
    assert missing == []
    index = loads[site / "index.html"]
    assert "vendor/bootstrap-table-1.19.1/bootstrap-table.min.js" in index
    assert "vendor/jquery-3.7.1/jquery.min.js" in index
    fonts = loads[site / "vendor" / "fontawesome-free-6.6.0" / "css" / "all.min.css"]
    assert "../webfonts/fa-solid-900.woff2" in fonts


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.spark
def test_a_duplicate_key_fails_naming_the_table_and_the_uniqueness_expectation(
    loaded: Config, spark: Any, tmp_path: Path, engine: str
) -> None:
    config = on(copy_of(loaded, tmp_path), engine)
    path = table_path(config, ORDERS)
    rows = DeltaTable(path).to_pyarrow_table()
    write_deltalake(path, rows.slice(0, 1), mode="append")
    expected = CheckpointStore(config.work_dir).load().row_counts[ORDERS]
    report = validate_target(config, spark, [ORDERS], results_name="manual__2026-01-02T03:04:05+00:00")
    assert not report.success
    assert report.failures() == [
        f"{ORDERS}: expect_table_row_count_to_equal failed: observed {expected + 1}, expected {expected}",
        f"{ORDERS}: expect_column_values_to_be_unique(id) failed: 2 unexpected values",
    ]
    with pytest.raises(ValidationError) as caught:
        report.raise_for_failure()
    assert caught.value.exit_code == 5
    assert f"{ORDERS}: expect_column_values_to_be_unique(id) failed" in str(caught.value)
    results = config.work_dir / "validation" / "manual__2026-01-02T03:04:05+00:00" / "validation.json"
    assert json.loads(results.read_text())["failures"] == report.failures()


@pytest.mark.spark
def test_a_deleted_row_fails_the_reconciliation_with_the_checkpoint_count(
    loaded: Config, spark: Any, tmp_path: Path
) -> None:
    config = copy_of(loaded, tmp_path)
    path = table_path(config, ORDER_LINES)
    first = DeltaTable(path).to_pyarrow_table().slice(0, 1).to_pylist()[0]
    DeltaTable(path).delete(f"order_id = {first['order_id']} AND line_no = {first['line_no']}")
    expected = CheckpointStore(config.work_dir).load().row_counts[ORDER_LINES]
    report = validate_target(config, spark, [ORDER_LINES])
    assert report.failures() == [
        f"{ORDER_LINES}: expect_table_row_count_to_equal failed: observed {expected - 1}, expected {expected}"
    ]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.spark
def test_a_null_in_a_non_nullable_column_fails_naming_the_column(
    loaded: Config, spark: Any, tmp_path: Path, engine: str
) -> None:
    # delta-rs refuses a null in a NOT NULL column, so the damage is a rewrite
    # that relaxed the column first: the way such a null gets into a table.
    config = on(copy_of(loaded, tmp_path), engine)
    path = table_path(config, CUSTOMERS)
    rows = DeltaTable(path).to_pyarrow_table()
    at = rows.schema.get_field_index("name")
    names = pc.if_else(pa.array([i == 0 for i in range(rows.num_rows)]), pa.scalar(None, pa.string()), rows["name"])
    damaged = rows.set_column(at, pa.field("name", pa.string(), nullable=True), names)
    write_deltalake(path, damaged, mode="overwrite", schema_mode="overwrite")
    report = validate_target(config, spark, [CUSTOMERS])
    assert report.failures() == [f"{CUSTOMERS}: expect_column_values_to_not_be_null(name) failed: 1 unexpected value"]
    with pytest.raises(ValidationError, match=r"shop\.customers: expect_column_values_to_not_be_null\(name\)"):
        report.raise_for_failure()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.spark
def test_a_decimal_of_another_precision_fails_the_type_expectation(
    loaded: Config, spark: Any, tmp_path: Path, engine: str
) -> None:
    # GX's own type expectation would pass: it compares a Spark type's class only.
    config = on(copy_of(loaded, tmp_path), engine)
    path = table_path(config, PRODUCTS)
    rows = DeltaTable(path).to_pyarrow_table()
    at = rows.schema.get_field_index("price")
    wider = rows.set_column(
        at, pa.field("price", pa.decimal128(12, 2), nullable=False), rows["price"].cast(pa.decimal128(12, 2))
    )
    write_deltalake(path, wider, mode="overwrite", schema_mode="overwrite")
    report = validate_target(config, spark, [PRODUCTS])
    assert report.failures() == [
        f"{PRODUCTS}: expect_column_values_to_be_of_spark_type(price) failed: "
        "observed DecimalType(12,2), expected DecimalType(10,2)"
    ]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.spark
def test_a_table_whose_older_file_predates_an_added_column_reads_it_as_null_and_validates(
    loaded: Config, spark: Any, tmp_path: Path, engine: str
) -> None:
    config = on(copy_of(loaded, tmp_path), engine)
    path = table_path(config, CUSTOMERS)
    rows = DeltaTable(path).to_pyarrow_table()
    assert rows.column_names[-1] == "phone", "the workload adds phone to shop.customers"
    old, new = rows.slice(0, 100), rows.slice(100)
    shutil.rmtree(path)
    write_deltalake(path, old.drop_columns(["phone"]))
    DeltaTable(path).alter.add_columns([Field("phone", "string", nullable=True)])
    write_deltalake(path, new, mode="append")
    files = DeltaTable(path).file_uris()
    assert sorted("phone" in pq.read_schema(f).names for f in files) == [False, True]

    frame = read_target_table(config, spark, CUSTOMERS)
    assert frame is not None and frame.columns == rows.column_names
    old_ids = old["id"].to_pylist()
    assert frame.where(frame.id.isin(old_ids) & frame.phone.isNotNull()).count() == 0
    report = validate_target(config, spark, [CUSTOMERS])
    assert report.failures() == [] and report.success


@pytest.mark.spark
def test_an_emptied_table_reads_as_no_rows_of_its_columns_and_fails_only_the_count(
    loaded: Config, spark: Any, tmp_path: Path
) -> None:
    config = copy_of(loaded, tmp_path)
    path = table_path(config, PRODUCTS)
    DeltaTable(path).delete()
    assert DeltaTable(path).file_uris() == []
    frame = read_target_table(config, spark, PRODUCTS)
    assert frame is not None and frame.count() == 0
    assert frame.columns == list(table_def(PRODUCTS).column_names)
    expected = CheckpointStore(config.work_dir).load().row_counts[PRODUCTS]
    report = validate_target(config, spark, [PRODUCTS])
    assert report.failures() == [f"{PRODUCTS}: expect_table_row_count_to_equal failed: observed 0, expected {expected}"]


@pytest.mark.spark
def test_a_removed_table_fails_as_missing(loaded: Config, spark: Any, tmp_path: Path) -> None:
    config = copy_of(loaded, tmp_path)
    shutil.rmtree(table_path(config, EVENTS))
    expected = CheckpointStore(config.work_dir).load().row_counts[EVENTS]
    report = validate_target(config, spark, [EVENTS])
    assert report.failures() == [f"{EVENTS}: the target table is missing; the checkpoint expects {expected} rows"]


@pytest.mark.spark
def test_a_table_outside_the_checkpoint_or_a_bad_results_name_is_refused(loaded: Config, spark: Any) -> None:
    with pytest.raises(UsageError, match=r"table shop\.nope is not in the checkpoint of configuration test_cfg"):
        validate_target(loaded, spark, ["shop.nope"])
    with pytest.raises(UsageError, match=r"results name '\.\./up' cannot name a folder"):
        validate_target(loaded, spark, [ORDERS], results_name="../up")


@pytest.mark.spark
@pytest.mark.slow
def test_the_cli_prints_each_table_and_exits_5_when_validation_fails(loaded: Config, tmp_path: Path) -> None:
    config = copy_of(loaded, tmp_path)
    path = table_path(config, ORDERS)
    write_deltalake(path, DeltaTable(path).to_pyarrow_table().slice(0, 1), mode="append")
    config_file = tmp_path / "applier.yaml"
    config_file.write_text(
        f"configuration_name: test_cfg\nintermediate_dir: {loaded.intermediate_dir}\n"
        f"output_dir: {tmp_path / 'out'}\ntarget: {{path: {tmp_path / 'target'}}}\n"
        "spark: {master: 'local[1]', conf: {spark.sql.shuffle.partitions: 2}}\n"
    )
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    command = [sys.executable, "-m", "applier.cli", "validate", "--config", str(config_file)]
    done = subprocess.run(
        [*command, "--table", PRODUCTS, "--table", ORDERS],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 5, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == f"{PRODUCTS}: 19 expectations passed"
    assert lines[1] == f"{ORDERS}: 2 of 15 expectations FAILED"
    assert "  expect_column_values_to_be_unique(id) failed: 2 unexpected values" in lines
    assert f"data docs: {config.work_dir / 'validation' / 'data_docs' / 'index.html'}" in lines
    assert f"applier: error: validation failed: {ORDERS}: expect_table_row_count_to_equal failed" in done.stderr


@pytest.mark.spark
def test_small_tables_are_validated_without_starting_spark(loaded: Config, tmp_path: Path) -> None:
    """A load under ``validate.in_memory_max_rows`` starts no JVM: checked in a fresh process."""
    config = copy_of(loaded, tmp_path)
    script = (
        "import sys\n"
        "from pyspark import SparkContext\n"
        "from applier.config import load_config\n"
        "from applier.validate import validate_target\n"
        "config = load_config(None, sys.argv[1:])\n"
        "report = validate_target(config, None, results_name='no-spark')\n"
        "print(report.success, len(report.tables), SparkContext._active_spark_context is None)\n"
    )
    settings = [f"configuration_name={config.configuration_name}", f"intermediate_dir={config.intermediate_dir}",
                f"output_dir={config.output_dir}", f"target.path={config.target.path}"]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script, *settings], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", str(len(ALL_TABLES)), "True"]
