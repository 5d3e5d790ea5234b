"""What ``applier status`` shows of the source and the extractor: retained WAL, extraction lag, held back.

Read from three places, each of which may be missing: the source's slot
(``pg_replication_slots``), the extractor's status file
(:mod:`applier.extract.status_file`) and the newest commit in the complete
pairs. A source that cannot be reached costs one line; the rest is shown.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

import psycopg

from applier.config import Config
from applier.engine.status import age
from applier.errors import ExtractError
from applier.extract import source
from applier.extract.flow import retained_wal_warning
from applier.extract.status_file import ExtractorStatus, read_status, size_text
from applier.intermediate.pairs import list_pairs

CONNECT_TIMEOUT_S = 5
NEWEST_COMMIT_PAIRS = 100  # pairs searched back for a commit (a large transaction's pairs have none)


@dataclass(frozen=True)
class SourceStatus:
    """The source side of ``applier status``.

    Attributes:
        slot: the replication slot (``source.slot``).
        wal: the slot's retained WAL and lag; None when the source could not be read.
        problem: why the source could not be read, in one line.
        extractor: the extractor's status file, None before its first run.
        newest_commit: the source time of the newest commit in the complete pairs (ISO 8601 UTC).
    """

    slot: str
    wal: source.SlotWal | None
    problem: str | None
    extractor: ExtractorStatus | None
    newest_commit: str | None


def newest_commit(directory: Path) -> str | None:
    """The ``ts`` of the newest commit event in the last complete pairs of ``directory``, or None."""
    if not directory.is_dir():
        return None
    seqs = sorted(int(p.name[:12]) for p in directory.glob("[0-9]*.trn") if p.name[:12].isdigit())
    if not seqs:
        return None
    pairs = list_pairs(directory, seqs[0]).pairs
    for pair in reversed(pairs[-NEWEST_COMMIT_PAIRS:]):
        lines = pair.trn_path.read_text(encoding="utf-8").splitlines()[1:]
        for line in reversed(lines):
            event = json.loads(line)
            if event.get("record") == "commit":
                return str(event["ts"])
    return None


def read_source_status(config: Config) -> SourceStatus | None:
    """The slot's figures, the extractor's status file and the newest commit; None without ``source.*``."""
    src = config.source
    if not (src.url and src.slot):
        return None
    wal, problem = None, None
    try:
        conn = source.connect(src.url, autocommit=True, timeout_s=CONNECT_TIMEOUT_S)
        try:
            wal = source.slot_wal(conn, src.slot)
        finally:
            conn.close()
    except ExtractError as e:
        problem = str(e)
    except psycopg.Error as e:
        problem = f"the source cannot be read: {str(e).strip().splitlines()[0]}"
    directory = config.intermediate_dir
    extractor = read_status(directory) if directory.is_dir() else None
    return SourceStatus(src.slot, wal, problem, extractor, newest_commit(directory))


def _seconds_since(moment: str, now: dt.datetime) -> int:
    return max(0, int((now - dt.datetime.fromisoformat(moment.replace("Z", "+00:00"))).total_seconds()))


def _lag_line(s: SourceStatus, now: dt.datetime) -> str:
    in_bytes = f"{size_text(s.wal.lag_bytes)} of WAL" if s.wal else "WAL unknown"
    caught_up = s.extractor.caught_up_at if s.extractor else None
    if caught_up:
        seconds = f"{_seconds_since(caught_up, now)} s (every commit before {caught_up[:19]}Z is in a pair)"
    elif s.newest_commit:
        seconds = f"{_seconds_since(s.newest_commit, now)} s (the newest commit in a pair)"
    else:
        seconds = "unknown (nothing extracted yet)"
    newest = f"; newest extracted commit {age(s.newest_commit)}" if s.newest_commit else ""
    return f"extraction lag: {in_bytes}, {seconds}{newest}"


def _extractor_line(e: ExtractorStatus | None) -> str:
    if e is None:
        return "extractor: no status yet (applier extract has not run on this intermediate folder)"
    marks = (
        f"extract.max_backlog_mb: {size_text(e.max_backlog_bytes)}; resumes at or below "
        f"{size_text(e.resume_backlog_bytes)}"
        if e.max_backlog_bytes
        else "extract.max_backlog_mb: 0, no limit"
    )
    state = "not held back"
    if e.held_back and e.held_since:
        state = f"HELD BACK since {e.held_since[:19]}Z ({age(e.held_since)})"
    return f"extractor: {state}; backlog {size_text(e.backlog_bytes)} ({marks}); as of {age(e.updated_at)}"


def source_status_lines(config: Config, now: dt.datetime | None = None) -> list[str]:
    """The lines ``applier status`` prints for the source and the extractor (none without ``source.*``)."""
    s = read_source_status(config)
    if s is None:
        return []
    now = now or dt.datetime.now(dt.UTC)
    if s.wal is None:
        head = f"source: unreachable: {s.problem}"
    else:
        wal = s.wal.retained_bytes
        retained = "unknown (the slot lost its WAL)" if wal is None else size_text(wal)
        head = f"source: slot {s.slot} retains {retained} of WAL (wal_status {s.wal.wal_status})"
    lines = [head, _lag_line(s, now), _extractor_line(s.extractor)]
    warning = retained_wal_warning(s.slot, s.wal.retained_bytes if s.wal else None, config.extract.warn_retained_wal_mb)
    if warning:
        lines.append(f"warning: {warning}")
    return lines + _subscription_lines(config)


def _subscription_lines(config: Config) -> list[str]:
    """One line per subscription: its mode, state (off the Applier's checkpoint), rows copied, error."""
    from applier.engine.checkpoint import CheckpointStore
    from applier.extract.subscriptions import Registry, applier_state

    subs = Registry(config.intermediate_dir).load()
    if not subs:
        return []
    applied = CheckpointStore(config.work_dir).load().applied_commit_lsn or 0
    lines = [f"subscriptions: {len(subs)}"]
    for sub in subs.values():
        flag = ", recovering" if sub.recovering else ""
        error = f": {sub.error}" if sub.error else ""
        lines.append(
            f"  {sub.table} ({sub.mode}): {applier_state(sub, applied)}{flag}, {sub.copied_rows} rows copied{error}"
        )
    return lines
