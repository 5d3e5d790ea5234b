"""Pure builders of the extract DAG: its schedule, its param, what a batch's end means for its task.

Plain values in, plain values out, like :mod:`applier_airflow.builders`; nothing
here imports the extractor (it imports pyarrow), so DAG files may import it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from applier.errors import ApplierError, RunLockedError

if TYPE_CHECKING:
    from applier.extract import ExtractSummary

EXTRACT_SCHEDULE = "* * * * *"


def max_wal_mb_from_params(params: Mapping[str, Any]) -> float | None:
    """The ``max_wal_mb`` param: the batch's WAL bound in MiB (None: up to the WAL end at its start).

    Raises:
        ValueError: the param is not a number above 0 (the form's schema refuses it first).
    """
    value = params.get("max_wal_mb")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"param max_wal_mb: {value!r} is not a number above 0")
    return float(value)


def extract_outcome(error: ApplierError) -> tuple[str, str]:
    """What an ``applier extract`` batch that raised ``error`` means for its task.

    Returns:
        ``(outcome, reason)``: ``skip`` when another extractor holds the
        intermediate folder's lock (a ``--follow`` container, or a batch still
        running: this one changed nothing); ``retry`` when the source could not
        be reached or the connection was lost (transient: the DAG's retries,
        then the next scheduled run, continue exactly where the last complete
        pair ends); ``fail`` for everything a retry cannot fix (configuration,
        a value or definition the source holds that cannot be extracted, a
        damaged state file).
    """
    if isinstance(error, RunLockedError):
        return "skip", f"skipped (exit code {error.exit_code}): {error}"
    if getattr(error, "transient", False):
        return "retry", str(error)
    return "fail", f"{type(error).__name__} (exit code {error.exit_code}): {error}"


def extract_figures(summary: ExtractSummary) -> dict[str, Any]:
    """A batch's figures for the task log and XCom."""
    lsn = summary.confirmed_lsn
    return {
        "pairs": summary.pairs,
        "transactions": summary.transactions,
        "rows": summary.rows,
        "confirmed_lsn": f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}",
        "held_back": summary.held_back,
    }


def extract_line(figures: Mapping[str, Any]) -> str:
    """The batch's figures in one line, as ``applier extract`` prints them."""
    line = (
        f"{figures['pairs']} pairs written, {figures['transactions']} transactions, {figures['rows']} rows; "
        f"slot confirmed at {figures['confirmed_lsn']}"
    )
    if figures["held_back"]:
        line += "; held back by the unapplied backlog (extract.max_backlog_mb): ended early"
    return line


MODES = ("atomic", "incremental", "nonatomic")
_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*$")


def subscription_from_params(params: Mapping[str, Any]) -> tuple[str, str, int | None]:
    """The ``applier_materialize`` params: ``(table, mode, chunk_rows)``.

    Raises:
        ValueError: a param the form's schema should have refused (a direct call), naming it.
    """
    table, mode, chunk_rows = params.get("table"), params.get("mode", "atomic"), params.get("chunk_rows")
    if not isinstance(table, str) or not _TABLE.match(table):
        raise ValueError(f"param table: {table!r} is not schema.table")
    if mode not in MODES:
        raise ValueError(f"param mode: {mode!r} is not one of {', '.join(MODES)}")
    if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1):
        raise ValueError(f"param chunk_rows: {chunk_rows!r} is not a whole number above 0")
    return table, mode, chunk_rows
