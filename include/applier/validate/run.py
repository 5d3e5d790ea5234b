"""Validate a configuration's target tables after a load.

For each table: read it from the target, build its suite from the
checkpoint's definition and row count, validate with GX. A table the
checkpoint expects to hold at most ``validate.in_memory_max_rows`` rows is read
into Arrow and validated with GX's pandas engine, in a fraction of a second
and without Spark; a larger one as a Spark DataFrame, with a session started
only then (measured on the demo load: docs/benchmarks.md). Then one
JSON file of results under ``<output_dir>/<configuration_name>/validation/<results_name>/``
and the Data Docs site under ``.../validation/data_docs/``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from applier.config import Config
from applier.engine.checkpoint import Checkpoint, CheckpointStore
from applier.errors import UsageError
from applier.preflight import tables_to_validate
from applier.validate.gxrun import SuiteRunner
from applier.validate.read import read_target_arrow, read_target_table
from applier.validate.report import TableResult, ValidationReport, expectation_result
from applier.validate.suite import table_expectations

log = logging.getLogger(__name__)

RESULTS_FILE = "validation.json"
# A results name becomes a folder name: no separators, no control characters, no leading dot.
_RESULTS_NAME = re.compile(r"[^./\\\x00-\x1f][^/\\\x00-\x1f]*")


def validation_dir(config: Config) -> Path:
    """``<output_dir>/<configuration_name>/validation``: results folders and Data Docs."""
    return config.work_dir / "validation"


class _LazySpark:
    """The caller's Spark session, or one started when a table first needs it (and stopped at the end)."""

    def __init__(self, config: Config, given: Any) -> None:
        self.config, self.session, self.started = config, given, False

    def __call__(self) -> Any:
        if self.session is None:
            from applier.engine.session import start_spark

            self.session, self.started = start_spark(self.config), True
        return self.session

    def stop(self) -> None:
        if self.started:
            self.session.stop()


def validate_target(
    config: Config,
    spark: Any = None,
    tables: Sequence[str] | None = None,
    *,
    results_name: str | None = None,
) -> ValidationReport:
    """Validate target tables against their definitions and the engine's row counts.

    Args:
        config: the configuration whose checkpoint and target are validated.
        spark: the Spark session to read large tables with; None starts one
            if a table needs it (and stops it at the end).
        tables: the tables to validate (``schema.table``); None validates every
            table of the checkpoint.
        results_name: names the results folder, e.g. the run key of the run
            that loaded the tables; default the current UTC time.

    Returns:
        The report; a failed expectation does not raise (see
        :meth:`ValidationReport.raise_for_failure`).

    Raises:
        UsageError: a table is not in the checkpoint, or ``results_name``
            cannot be a folder name.
        TargetError: a table cannot be read.
        ConfigError: the target type cannot be validated.
    """
    checkpoint = CheckpointStore(config.work_dir).load()
    names = tables_to_validate(config, tables, checkpoint)
    name = results_name if results_name is not None else dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    if not _RESULTS_NAME.fullmatch(name):
        raise UsageError(f"results name {name!r} cannot name a folder: use no '/', '\\\\' or control characters")
    runner = SuiteRunner(validation_dir(config) / "data_docs", name)
    results: dict[str, TableResult] = {}
    gx_results: dict[str, dict[str, Any]] = {}
    session = _LazySpark(config, spark)
    try:
        for number, table in enumerate(names, 1):
            where = f"{number}/{len(names)}"  # progress, one line a table: a long validation is not silent
            results[table], gx_result = _validate_table(config, session, runner, checkpoint, table, where)
            if gx_result is not None:
                gx_results[table] = gx_result
    finally:
        session.stop()
    log.info("building the Data Docs of %d tables", len(results))
    index, pages = runner.build_docs()
    results = {t: _with_page(r, pages.get(t)) for t, r in results.items()}
    json_path = validation_dir(config) / name / RESULTS_FILE
    report = ValidationReport(config.configuration_name, name, results, json_path, index)
    _write_results(report, checkpoint, gx_results)
    return report


def _validate_table(
    config: Config, spark: _LazySpark, runner: SuiteRunner, checkpoint: Checkpoint, table: str, where: str
) -> tuple[TableResult, dict[str, Any] | None]:
    """One table's result, and GX's result as JSON (None when the table is missing)."""
    started = time.perf_counter()
    expected = checkpoint.row_counts.get(table)
    in_memory = (expected or 0) <= config.validate.in_memory_max_rows
    frame = _read_in_memory(config, table) if in_memory else read_target_table(config, spark(), table)
    if frame is None:
        result = TableResult(table, expected, missing=True)
        missing = "" if result.success else " (FAILED: rows were written)"
        log.info("validated table %s %s: not in the target%s", where, table, missing)
        return result, None
    suite = table_expectations(checkpoint.tables[table], expected or 0)
    if in_memory:
        gx_result = runner.validate(table, frame, suite)
    else:
        context = spark().sparkContext
        context.setJobDescription(f"applier validate {table}")
        try:
            gx_result = runner.validate(table, frame, suite)
        finally:
            context.setJobDescription(None)
    outcomes = tuple(expectation_result(r) for r in gx_result.get("results", []))
    result = TableResult(table, expected, outcomes)
    log.info(
        "validated table %s %s: %d expectations, %d failed (%.1f s, %s)",
        where,
        table,
        len(outcomes),
        len(result.failed),
        time.perf_counter() - started,
        "in memory" if in_memory else "Spark",
    )
    return result, gx_result


def _read_in_memory(config: Config, table: str) -> Any | None:
    """The table as a pandas DataFrame of Arrow-backed columns (exact types: decimals keep their scale)."""
    import pandas as pd  # type: ignore[import-untyped]

    rows = read_target_arrow(config, table)
    return None if rows is None else rows.to_pandas(types_mapper=pd.ArrowDtype)


def _with_page(result: TableResult, page: Path | None) -> TableResult:
    return TableResult(result.table, result.expected_rows, result.expectations, result.missing, page)


def _write_results(report: ValidationReport, checkpoint: Checkpoint, gx_results: dict[str, dict[str, Any]]) -> None:
    """The run's JSON: the report, the checkpoint it was checked against, and GX's own results."""
    document = {
        "configuration_name": report.configuration_name,
        "results_name": report.results_name,
        "validated_at": dt.datetime.now(dt.UTC).isoformat(),
        "cycle_id": checkpoint.cycle_id,
        "success": report.success,
        "failures": report.failures(),
        "data_docs_path": str(report.data_docs_path),
        "tables": {
            name: {**result.to_json(), "gx_result": gx_results.get(name)} for name, result in report.tables.items()
        },
    }
    report.json_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = report.json_path.with_name(f".{report.json_path.name}.tmp")
    tmp.write_text(json.dumps(document, indent=1, sort_keys=True, default=str), encoding="utf-8")
    tmp.replace(report.json_path)
