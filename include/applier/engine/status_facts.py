"""The facts ``applier status`` adds to the positions: source times of commits, the run under way, the last error.

All of them are read from ``.trn`` files and the Applier's own small files,
never from ``.dat`` files, Spark or the target, so status answers in moments.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from applier.engine.ledger import RunLedger
from applier.engine.runlock import running_holder
from applier.errors import StateFileError
from applier.intermediate.pairs import PairRef, list_pairs

# Pairs searched for a commit (a large transaction's pairs hold none): back from
# the applied pair for its commit's time, forward through the backlog for the oldest.
COMMIT_SEARCH_PAIRS = 1000


def _commits(trn: Path) -> list[tuple[int, str]]:
    """``(lsn, ts)`` of the commit events of a ``.trn`` file, in order; none for a file that cannot be read."""
    found: list[tuple[int, str]] = []
    try:
        lines = trn.read_text(encoding="utf-8").splitlines()[1:]
    except (OSError, UnicodeError):
        return []
    for line in lines:
        if '"commit"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("record") == "commit" and isinstance(event.get("lsn"), int):
            found.append((event["lsn"], str(event.get("ts"))))
    return found


def applied_commit_time(directory: Path, applied_seq: int, applied_commit_lsn: int | None) -> str | None:
    """The source time (``ts``) of the last applied commit: the commit event at ``applied_commit_lsn``.

    Searched back from pair ``applied_seq``; None when nothing is applied, or
    its pair is gone (intermediate retention) or beyond the search.
    """
    if not applied_seq or applied_commit_lsn is None or not directory.is_dir():
        return None
    first = max(1, applied_seq - COMMIT_SEARCH_PAIRS + 1)
    for ref in reversed(list_pairs(directory, first).pairs):
        if ref.seq > applied_seq:
            continue
        for lsn, ts in reversed(_commits(ref.trn_path)):
            if lsn == applied_commit_lsn:
                return ts
            if lsn < applied_commit_lsn:
                return None  # commits are in lsn order: it is not here
    return None


def oldest_unapplied_commit(backlog: Iterable[PairRef]) -> tuple[int, str] | None:
    """The pair (``seq``) and source time of the backlog's first commit event (None: no unapplied commit)."""
    for number, ref in enumerate(backlog):
        if number >= COMMIT_SEARCH_PAIRS:
            return None
        commits = _commits(ref.trn_path)
        if commits:
            return ref.seq, commits[0][1]
    return None


def run_in_progress(work_dir: Path) -> dict[str, Any] | None:
    """The run holding the configuration's run lock: ``{"host", "pid", "started_at", "run_key"}``, or None."""
    holder = running_holder(work_dir)
    if holder is None:
        return None
    return {"host": holder.host, "pid": holder.pid, "started_at": holder.started_at, "run_key": holder.run_key}


def ledger_last_error(work_dir: Path) -> dict[str, Any] | None:
    """The error of the run ledger's latest failed record, for folders whose runs predate ``last_run.json``."""
    try:
        failed = [r for r in RunLedger(work_dir).records() if r.status == "failed" and r.error]
    except (StateFileError, OSError, ValueError):  # a damaged record: status shows the rest (applier runs names it)
        return None
    if not failed:
        return None
    last = max(failed, key=lambda r: r.finished_at or r.started_at)
    return {
        "at": last.finished_at,
        "exit_code": None,
        "kind": None,
        "message": last.error,
        "pair": None,
        "transaction": None,
        "table": None,
        "run_key": last.run_key,
    }
