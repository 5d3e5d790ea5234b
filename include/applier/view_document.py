"""What the Applier view in the Airflow UI shows, as one JSON-able object, read from a configuration's files.

It is :func:`applier.status_document.status_document` (what ``applier status
--json`` prints), the last cycles of ``cycles.jsonl`` with their figures, and
the last validation of each target table (from the ``validation.json`` files
under ``<work_dir>/validation/``). No Spark, no Airflow: the plugin
(``applier_airflow.view``) only resolves the configuration and serves this.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from applier.config import Config
from applier.engine.jsonlines import last_lines
from applier.status_document import cycle_figures, status_document

RESULTS_FILE = "validation.json"  # as applier.validate writes it, read here without importing GX
DATA_DOCS = "data_docs"  # the Data Docs site beside the results folders, as applier.validate builds it
DEFAULT_CYCLES = 20
MAX_CYCLES = 500


def view_document(
    config: Config, *, cycles: int = DEFAULT_CYCLES, now: dt.datetime | None = None, source: bool = True
) -> dict[str, Any]:
    """Where the Applier of ``config`` stands, its last ``cycles`` cycles and each table's last validation.

    Args:
        config: the configuration.
        cycles: how many of the last cycles to list, oldest first (1 to :data:`MAX_CYCLES`).
        now: the moment ages and lags are measured at (default: now, UTC).
        source: read the source's slot too (as ``applier status`` does).

    Raises:
        ValueError: ``cycles`` is out of range, or a line of ``cycles.jsonl`` is not JSON.
        StateFileError: the checkpoint or the intent is damaged.
    """
    if not 1 <= cycles <= MAX_CYCLES:
        raise ValueError(f"cycles: {cycles} is not between 1 and {MAX_CYCLES}")
    return {
        "status": status_document(config, now=now, source=source),
        "cycles": recent_cycles(config.work_dir / "cycles.jsonl", cycles),
        "validation": last_validation_per_table(config.work_dir / "validation"),
    }


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
