"""The last run's outcome and the last error, in ``<work_dir>/last_run.json``, for ``applier status``.

Every run that takes the run lock records here how it ended: with or without
a run key (the run ledger keeps keyed runs only), and whatever stopped it. The
last error is carried over by the runs that succeed after it, so ``applier
status`` can show it and say whether a later run succeeded. An error that
names a pair (a refused intermediate file) or a transaction (stopped by its
error action) records which, so status can show what blocks. The file is
informational: a damaged one is shown as such and overwritten by the next run.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

from applier.engine.checkpoint import write_atomically
from applier.errors import ApplierError, IntermediateFileError, TargetError, TransactionStoppedError

LAST_RUN_FILE = "last_run.json"
log = logging.getLogger("applier")


def error_facts(error: BaseException, at: dt.datetime) -> dict[str, Any]:
    """An error as ``last_run.json`` and ``applier status --json`` hold it.

    Keys: ``at`` (ISO 8601 UTC), ``exit_code``, ``kind`` (the exception's
    class), ``message`` (one line), ``pair`` (``{"seq", "file", "code"}`` for a
    refused pair, else null), ``transaction`` (``{"xid", "table"}`` for one
    stopped by its error action, else null) and ``table`` (a target error's).
    """
    pair = transaction = None
    if isinstance(error, IntermediateFileError):
        pair = {"seq": error.seq, "file": str(error.path), "code": error.code}
    if isinstance(error, TransactionStoppedError):
        transaction = {"xid": error.xid, "table": error.table}
    return {
        "at": at.isoformat(),
        "exit_code": error.exit_code if isinstance(error, ApplierError) else 1,
        "kind": type(error).__name__,
        "message": " ".join(str(error).split()) or type(error).__name__,
        "pair": pair,
        "transaction": transaction,
        "table": error.table if isinstance(error, TargetError) else None,
    }


def record_run(
    work_dir: Path,
    *,
    run_key: str | None,
    started_at: dt.datetime,
    finished_at: dt.datetime,
    cycles: int,
    error: BaseException | None,
) -> None:
    """Write the run's outcome, carrying the last error over a run that succeeded.

    Never raises: a file that cannot be written costs a warning, not the run's own outcome.
    """
    this_error = error_facts(error, finished_at) if error is not None else None
    previous = read_last_run(work_dir) or {}
    data = {
        "run_key": run_key,
        "started_at": started_at.isoformat(),
        "finished_at": finished_at.isoformat(),
        "outcome": "failed" if error is not None else "finished",
        "cycles": cycles,
        "error": this_error,
        "last_error": this_error or previous.get("last_error"),
    }
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(work_dir / LAST_RUN_FILE, data)
    except OSError as e:
        log.warning("could not record the run's outcome in %s: %s", work_dir / LAST_RUN_FILE, e)


def read_last_run(work_dir: Path) -> dict[str, Any] | None:
    """What the last run recorded; None before the first; ``{"unreadable": why}`` for a damaged file."""
    path = work_dir / LAST_RUN_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return {"unreadable": f"{path}: {e}"}
    return data if isinstance(data, dict) else {"unreadable": f"{path}: not a JSON object"}
