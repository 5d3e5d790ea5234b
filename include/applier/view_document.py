"""What the Applier view in the Airflow UI shows, as one JSON-able object, read from a configuration's files.

It is :func:`applier.status_document.status_document` (what ``applier status
--json`` prints), the last cycles of ``cycles.jsonl`` with their figures, the
last validation of each target table (from the ``validation.json`` files
under ``<work_dir>/validation/``), and the target's exceptions store (what
``applier exceptions list`` prints: counts and the newest records). No Spark,
no Airflow: the plugin (``applier_airflow.view``) only resolves the
configuration and serves this.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from applier.config import Config
from applier.engine.jsonlines import last_lines
from applier.errors import ApplierError
from applier.status_document import cycle_figures, status_document

RESULTS_FILE = "validation.json"  # as applier.validate writes it, read here without importing GX
DATA_DOCS = "data_docs"  # the Data Docs site beside the results folders, as applier.validate builds it
DEFAULT_CYCLES = 20
MAX_CYCLES = 500
DEFAULT_EXCEPTIONS = 20
MAX_EXCEPTIONS = 500
MESSAGE_CHARS = 300  # an exception's error message, on one line, cut to this (``applier exceptions show`` has it all)
RECORD_FIELDS = ("id", "cycle_id", "xid", "commit_lsn", "pair_seq", "table_name", "error_class", "sqlstate", "action")


def view_document(
    config: Config,
    *,
    cycles: int = DEFAULT_CYCLES,
    exceptions: int = DEFAULT_EXCEPTIONS,
    now: dt.datetime | None = None,
    source: bool = True,
) -> dict[str, Any]:
    """Where the Applier of ``config`` stands, its last cycles, each table's last validation and its exceptions.

    Args:
        config: the configuration.
        cycles: how many of the last cycles to list, oldest first (1 to :data:`MAX_CYCLES`).
        exceptions: how many of the newest exceptions to list (1 to :data:`MAX_EXCEPTIONS`).
        now: the moment ages and lags are measured at (default: now, UTC).
        source: read the source's slot too (as ``applier status`` does).

    Raises:
        ValueError: ``cycles`` or ``exceptions`` is out of range, or a line of ``cycles.jsonl`` is not JSON.
        StateFileError: the checkpoint or the intent is damaged.
    """
    if not 1 <= cycles <= MAX_CYCLES:
        raise ValueError(f"cycles: {cycles} is not between 1 and {MAX_CYCLES}")
    if not 1 <= exceptions <= MAX_EXCEPTIONS:
        raise ValueError(f"exceptions: {exceptions} is not between 1 and {MAX_EXCEPTIONS}")
    return {
        "status": status_document(config, now=now, source=source),
        "cycles": recent_cycles(config.work_dir / "cycles.jsonl", cycles),
        "validation": last_validation_per_table(config.work_dir / "validation"),
        "exceptions": exceptions_store(config, exceptions),
    }


def exceptions_store(config: Config, n: int) -> dict[str, Any]:
    """The target's exceptions store as :func:`exceptions_summary` tells it, read once.

    A store that cannot be read (the target unreachable) is this section's
    ``error``, one line, with no counts: the rest of the view still shows
    (the status is read from files, the store from the target).
    """
    from applier.targets import open_target

    try:
        target = open_target(config)
        try:
            records = target.exceptions()
        finally:
            target.close()
    except ApplierError as e:
        error = " ".join(f"{type(e).__name__}: {e}".split())
        return {"error": error, "open": None, "resubmitted": None, "total": None, "records": []}
    return exceptions_summary(records, n)


def exceptions_summary(records: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """Counts of ``records`` (as ``Target.exceptions()`` lists them) and the newest ``n``, newest first.

    Each listed record has what an operator decides on: the ids (exception,
    cycle, transaction, commit LSN, pair), the table, the error's class,
    SQLSTATE and message (one line, at most :data:`MESSAGE_CHARS`), the
    action that set it aside, how many changes it holds, and when it was
    logged and resubmitted (ISO moments; ``resubmitted_at`` None while open).
    The changes themselves stay in the store (``applier exceptions show ID``).
    """
    resubmitted = sum(1 for r in records if r["resubmitted_at"] is not None)
    newest = sorted(records, key=lambda r: r["id"], reverse=True)[:n]
    return {
        "error": None,
        "open": len(records) - resubmitted,
        "resubmitted": resubmitted,
        "total": len(records),
        "records": [
            {
                **{k: r[k] for k in RECORD_FIELDS},
                "message": _one_line(r["message"]),
                "changes": r["changes"],
                "logged_at": _moment(r["logged_at"]),
                "resubmitted_at": _moment(r["resubmitted_at"]),
            }
            for r in newest
        ],
    }


def _one_line(text: str | None) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 1] + "…"


def _moment(value: dt.datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, dt.datetime) else value


def recent_cycles(path: Path, n: int) -> list[dict[str, Any]]:
    """The last ``n`` cycle reports of ``path``, oldest first, each as status shows a cycle plus its queue peak."""
    rows = []
    for report in last_lines(path, n):
        figures = cycle_figures(report)
        if figures is not None:
            rows.append({**figures, "queue_peak_bytes": (report.get("queue") or {}).get("peak_bytes")})
    return rows


def docs_url(site: Path, page: str | None) -> str | None:
    """A Data Docs page as a URL relative to the view (``docs/validations/…``); None outside the site."""
    if not page:
        return None
    try:
        relative = Path(page).resolve().relative_to(site.resolve())
    except ValueError:
        return None
    return "docs/" + relative.as_posix()


def last_validation_per_table(folder: Path) -> dict[str, dict[str, Any]]:
    """Per target table, the newest validation that checked it (results folders by modification time).

    Each entry: the results folder's name, when it ran, the cycle it checked,
    its outcome, expectations run and failed, the failures' lines, and the
    table's Data Docs page. GX's own results are left out (they are large).
    Unreadable results files are skipped: a validation being written is not an error.
    """
    files = sorted(folder.glob(f"*/{RESULTS_FILE}"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    tables: dict[str, dict[str, Any]] = {}
    for path in reversed(files):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for name, result in (document.get("tables") or {}).items():
            if name in tables:
                continue
            expectations = result.get("expectations") or []
            tables[name] = {
                "results_name": document.get("results_name", path.parent.name),
                "validated_at": document.get("validated_at"),
                "cycle_id": document.get("cycle_id"),
                "success": result.get("success"),
                "missing": result.get("missing", False),
                "expected_rows": result.get("expected_rows"),
                "expectations": len(expectations),
                "failed": sum(1 for e in expectations if not e.get("success")),
                "failures": [f for f in document.get("failures", []) if f.startswith(f"{name}: ")],
                "data_docs_page": result.get("data_docs_page"),
                "data_docs_url": docs_url(folder / DATA_DOCS, result.get("data_docs_page")),
                "json_path": str(path),
            }
    return dict(sorted(tables.items()))
