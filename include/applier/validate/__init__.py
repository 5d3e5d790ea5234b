"""Validation of target loads with Great Expectations 1.x.

After a run, each target table the run changed (or every table of the
checkpoint) is checked against a suite derived from its definition — columns
and types as defined, primary key not null and unique, non-nullable columns
not null — and against the row count the checkpoint expects. Results are kept
as JSON and as Data Docs HTML under ``<output_dir>/<configuration_name>/validation/``.

The library knows nothing of Airflow: an operator calls :func:`validate_target`
and :meth:`ValidationReport.raise_for_failure`.
"""

from __future__ import annotations

from applier.validate.report import ExpectationResult, TableResult, ValidationReport
from applier.validate.run import RESULTS_FILE, validate_target, validation_dir
from applier.validate.suite import ExpectColumnValuesToBeOfSparkType, spark_type_name, table_expectations

__all__ = [
    "RESULTS_FILE",
    "ExpectColumnValuesToBeOfSparkType",
    "ExpectationResult",
    "TableResult",
    "ValidationReport",
    "spark_type_name",
    "table_expectations",
    "validate_target",
    "validation_dir",
]
