"""What a validation found: per table, per expectation, in plain values.

GX's results are turned into small frozen dataclasses here (pure functions of
the result's JSON), so callers — the CLI, an Airflow operator — read
``report.success``, ``report.failures()`` or ``report.summary()`` without
knowing GX, and a failed expectation becomes a
:class:`~applier.errors.ValidationError` with exit code 5.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from applier.errors import ValidationError

# The kwarg holding what each kind of expectation asks for, when it is not about columns alone.
_EXPECTED_KWARGS = ("type_", "value", "column_list")
_COMPOUND = "expect_compound_columns_to_be_unique"


@dataclass(frozen=True)
class ExpectationResult:
    """The outcome of one expectation on one table.

    Attributes:
        expectation: the GX expectation type, e.g. ``expect_column_values_to_be_unique``.
        columns: the column(s) it is about; empty for a table-level expectation.
        success: whether it held.
        observed: what was found: the observed value (a count, a type, the
            column list) or, for a per-row expectation, the number of unexpected values.
        expected: what the suite asked for (a type, a count, the column list); None
            for per-row expectations.
        error: the first line of the error GX raised instead of evaluating, if any.
    """

    expectation: str
    columns: tuple[str, ...]
    success: bool
    observed: Any = None
    expected: Any = None
    error: str | None = None

    def describe(self) -> str:
        """One line: ``expect_column_values_to_be_unique(id) failed: 3 unexpected values``."""
        call = f"{self.expectation}({', '.join(self.columns)})" if self.columns else self.expectation
        if self.success:
            return f"{call} passed"
        if self.error is not None:
            return f"{call} failed: {self.error}"
        if self.expected is None and isinstance(self.observed, int):
            return f"{call} failed: {self.observed} unexpected value{'' if self.observed == 1 else 's'}"
        return f"{call} failed: observed {self.observed}, expected {self.expected}"

    def to_json(self) -> dict[str, Any]:
        return {
            "expectation": self.expectation,
            "columns": list(self.columns),
            "success": self.success,
            "observed": self.observed,
            "expected": self.expected,
            "error": self.error,
        }


@dataclass(frozen=True)
class TableResult:
    """The validation of one target table.

    Attributes:
        table: ``schema.table``.
        expected_rows: the row count the checkpoint holds for the table; None
            when the engine never wrote it.
        expectations: the outcome of each expectation of the table's suite.
        missing: the table does not exist in the target (no expectation ran).
        data_docs_page: the table's validation page in Data Docs, if built.
    """

    table: str
    expected_rows: int | None
    expectations: tuple[ExpectationResult, ...] = ()
    missing: bool = False
    data_docs_page: Path | None = None

    @property
    def success(self) -> bool:
        """Every expectation held, and the table exists unless it was never written."""
        missing_written = self.missing and self.expected_rows is not None
        return not missing_written and all(e.success for e in self.expectations)

    @property
    def failed(self) -> list[ExpectationResult]:
        return [e for e in self.expectations if not e.success]

    def failures(self) -> list[str]:
        """One line per failure, each starting with the table's name."""
        lines = [f"{self.table}: {e.describe()}" for e in self.failed]
        if self.missing and self.expected_rows is not None:
            expects = f"the checkpoint expects {self.expected_rows} rows"
            lines.insert(0, f"{self.table}: the target table is missing; {expects}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "expected_rows": self.expected_rows,
            "missing": self.missing,
            "data_docs_page": None if self.data_docs_page is None else str(self.data_docs_page),
            "expectations": [e.to_json() for e in self.expectations],
        }


@dataclass(frozen=True)
class ValidationReport:
    """The validation of a configuration's target tables.

    Attributes:
        configuration_name: the configuration validated.
        results_name: the name of this validation's results folder.
        tables: each validated table's result, by name.
        json_path: the JSON file holding this validation's results.
        data_docs_path: the Data Docs site's ``index.html``.
    """

    configuration_name: str
    results_name: str
    tables: Mapping[str, TableResult]
    json_path: Path
    data_docs_path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", MappingProxyType(dict(self.tables)))

    @property
    def success(self) -> bool:
        """Every table passed (true when no table was validated)."""
        return all(t.success for t in self.tables.values())

    def failures(self) -> list[str]:
        """One readable line per failure, naming the table, the expectation and what was observed."""
        return [line for t in self.tables.values() for line in t.failures()]

    def summary(self) -> dict[str, Any]:
        """A JSON-able digest: the outcome, where the results are, and per table expectations run and failed."""
        return {
            "success": self.success,
            "results_name": self.results_name,
            "json_path": str(self.json_path),
            "data_docs_path": str(self.data_docs_path),
            "tables": {
                name: {
                    "success": t.success,
                    "expectations": len(t.expectations),
                    "failed": len(t.failed),
                    "missing": t.missing,
                }
                for name, t in self.tables.items()
            },
        }

    def raise_for_failure(self) -> None:
        """Raise :class:`ValidationError` listing every failure, if there is one.

        Raises:
            ValidationError: an expectation failed or a written table is missing.
        """
        if not self.success:
            raise ValidationError(self.failures(), self.json_path)


def expectation_result(raw: Mapping[str, Any]) -> ExpectationResult:
    """Read one GX expectation validation result (its JSON dict) into an :class:`ExpectationResult`.

    Args:
        raw: ``ExpectationValidationResult.to_json_dict()``.

    Returns:
        The plain result.
    """
    config = raw.get("expectation_config") or {}
    kind = str(config.get("type", "unknown"))
    kwargs = config.get("kwargs") or {}
    result = raw.get("result") or {}
    if "column" in kwargs:
        columns: tuple[str, ...] = (str(kwargs["column"]),)
    elif kind == _COMPOUND:
        columns = tuple(str(c) for c in kwargs.get("column_list", ()))
    else:
        columns = ()
    expected = None
    if kind != _COMPOUND:
        expected = next((kwargs[k] for k in _EXPECTED_KWARGS if k in kwargs), None)
    observed = result.get("observed_value", result.get("unexpected_count"))
    return ExpectationResult(
        expectation=kind,
        columns=columns,
        success=bool(raw.get("success")),
        observed=observed,
        expected=expected,
        error=_raised(raw.get("exception_info")),
    )


def _raised(info: Any) -> str | None:
    """The first line of the message of an exception GX caught, if it caught one.

    GX gives either one ``{"raised_exception": ..., "exception_message": ...}``
    or a mapping of such, one per metric that failed.
    """
    if not isinstance(info, Mapping):
        return None
    if "raised_exception" not in info:
        return next((m for m in map(_raised, info.values()) if m is not None), None)
    if not info.get("raised_exception"):
        return None
    lines = str(info.get("exception_message") or "error").strip().splitlines()
    return f"raised: {lines[0] if lines else 'error'}"
