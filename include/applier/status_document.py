"""Every fact ``applier status`` shows, as one JSON-able object: ``--json`` prints it, the text and
``--prometheus`` outputs are drawn from it (:mod:`applier.status_output`), so all three say the same.

The fields are documented in the README ("applier status --json"). Everything
is read from the configuration's files (checkpoint, intent, run lock,
``last_run.json``, ``cycles.jsonl``, spill files) and the ``.trn`` files of
the intermediate folder, plus, with ``source.*``, the source's slot.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from applier.config import Config
from applier.engine.checkpoint import CheckpointStore
from applier.engine.last_run import read_last_run
from applier.engine.report import changes_before
from applier.engine.status import Status, read_status
from applier.engine.status_facts import (
    applied_commit_time,
    ledger_last_error,
    oldest_unapplied_commit,
    run_in_progress,
)
from applier.intermediate.pairs import list_pairs
from applier.preflight import refused_pairs

PHASES = ("read", "buffer", "spark", "tables", "checkpoint")  # a cycle's phases, in the order they run


def status_document(config: Config, *, now: dt.datetime | None = None, source: bool = True) -> dict[str, Any]:
    """Where the Applier of ``config`` stands, as one object (see the README for each field).

    Args:
        config: the configuration.
        now: the moment ages and lags are measured at (default: now, UTC).
        source: read the source's slot too (with ``source.*``; a connection, up to 5 s when unreachable).

    Raises:
        StateFileError: the checkpoint or the intent is damaged.
    """
    now = now or dt.datetime.now(dt.UTC)
    s = read_status(config)
    cp = s.checkpoint
    listing = list_pairs(config.intermediate_dir, cp.applied_seq + 1)
    refused = [
        {"seq": e.seq, "file": str(e.path), "code": e.code, "detail": e.detail} for e in refused_pairs(listing.pairs)
    ]
    gap = listing.gap_error()
    last_run = read_last_run(config.work_dir)
    running = run_in_progress(config.work_dir)
    last_error = (last_run or {}).get("last_error") or ledger_last_error(config.work_dir)
    applied_ts = applied_commit_time(config.intermediate_dir, cp.applied_seq, cp.applied_commit_lsn)
    oldest_seq, oldest_ts = oldest_unapplied_commit(listing.pairs) or (None, None)
    intent = CheckpointStore(config.work_dir).load_intent()
    return {
        "configuration": config.configuration_name,
        "generated_at": now.isoformat(),
        "checkpoint": {
            "cycle_id": cp.cycle_id,
            "applied_seq": cp.applied_seq,
            "applied_commit_lsn": cp.applied_commit_lsn,
            "restart_seq": cp.restart_seq,
            "committed_at": cp.committed_at,
        },
        "lag": {
            "seconds": _seconds_since(applied_ts, now),
            "last_applied_commit_ts": applied_ts,
            "oldest_unapplied_commit_ts": oldest_ts,
            "oldest_unapplied_seq": oldest_seq,
            "oldest_unapplied_seconds": _seconds_since(oldest_ts, now),
        },
        "backlog": {
            "pairs": s.backlog_pairs,
            "bytes": s.backlog_bytes,
            "gap": {"seq": gap.seq, "detail": gap.detail} if gap else None,
            "refused_pairs": refused,
        },
        "blocked_by": _blocked_by(refused, gap.seq if gap else None, gap.detail if gap else None, last_run, running),
        "run_in_progress": running,
        "cycle_under_way": (
            {"cycle_id": intent.cycle_id, "seqs": intent.seqs, "through": intent.through, "part_end": intent.part_end}
            if intent is not None and intent.cycle_id == cp.cycle_id + 1
            else None
        ),
        "last_run": _last_run(last_run),
        "last_error": last_error,
        "open_transactions": [dataclasses.asdict(t) for t in s.open_transactions],
        "spill_files": [{"name": name, "bytes": size} for name, size in s.spill_files],
        "queue": _queue(config, s),
        "last_cycle": cycle_figures(s.last_cycle),
        "totals": {"cycles": cp.cycle_id, "changes": changes_before(config.work_dir / "cycles.jsonl")},
        "recent_cycles": s.recent_cycles,
        "set_aside": s.set_aside,
        "collisions": s.collisions,
        "subscriptions": _subscriptions(config, cp.applied_commit_lsn or 0),
        "source": _source(config) if source else None,
    }


def _seconds_since(moment: str | None, now: dt.datetime) -> float | None:
    if not moment:
        return None
    then = dt.datetime.fromisoformat(moment.replace("Z", "+00:00"))
    return round(max(0.0, (now - then).total_seconds()), 3)


def _blocked_by(
    refused: list[dict[str, Any]],
    gap_seq: int | None,
    gap_detail: str | None,
    last_run: dict[str, Any] | None,
    running: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """What stops the Applier: the backlog's first refused pair, a gap, or what the last run failed on.

    A refused pair or a gap blocks whatever runs next. A failed last run
    blocks on the pair or the transaction its error names, until a run
    gets past it (not while a run is under way).
    """
    if refused:
        return {"kind": "pair", **refused[0]}
    if gap_seq is not None:
        return {"kind": "gap", "seq": gap_seq, "detail": gap_detail}
    error = (last_run or {}).get("error")
    if running is not None or not isinstance(error, dict):
        return None
    if error.get("pair"):
        return {"kind": "pair", **error["pair"], "detail": error.get("message")}
    if error.get("transaction"):
        return {"kind": "transaction", **error["transaction"], "detail": error.get("message")}
    return None


def _last_run(last_run: dict[str, Any] | None) -> dict[str, Any] | None:
    if last_run is None or "unreadable" in last_run:
        return last_run
    keys = ("run_key", "started_at", "finished_at", "outcome", "cycles")
    return {k: last_run.get(k) for k in keys}


def _queue(config: Config, s: Status) -> dict[str, Any]:
    """The queue budget, and the last cycle's figures: memory held at its end, its peak, what it spooled."""
    queue = (s.last_cycle or {}).get("queue") or {}
    return {
        "budget_bytes": config.queue_memory_bytes,
        "memory_bytes": queue.get("memory_bytes", {}),
        "peak_bytes": queue.get("peak_bytes"),
        "spooled_bytes": queue.get("spooled_bytes", {}),
        "spooled_buffers": len(queue.get("spooled", [])),
        "open_transaction_bytes": sum(t.bytes for t in s.open_transactions),
    }


def cycle_figures(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """One cycle report of ``cycles.jsonl`` as status shows it: phases in order, total seconds, changes/s."""
    if not report:
        return None
    seconds = report.get("seconds", {})
    ordered = {p: seconds[p] for p in PHASES if p in seconds} | {p: v for p, v in seconds.items() if p not in PHASES}
    total = round(sum(ordered.values()), 3)
    rows = report.get("rows_read", 0)
    return {
        "cycle_id": report["cycle_id"],
        "seqs": report["seqs"],
        "bytes": report.get("bytes", 0),
        "rows_read": rows,
        "committed": report.get("committed", 0),
        "rolled_back": report.get("rolled_back", 0),
        "open": report.get("open", 0),
        "seconds": ordered,
        "total_seconds": total,
        "changes_per_second": round(rows / total, 1) if total else None,
        "driver_peak_rss_mib": report.get("driver_peak_rss_mib"),
        "started_at": report.get("started_at") or None,  # reports before these times were kept have none
        "ended_at": report.get("ended_at") or None,
    }


def _subscriptions(config: Config, applied_commit_lsn: int) -> list[dict[str, Any]]:
    """The subscriptions of the intermediate folder, each with its state as a person reads it."""
    from applier.extract.subscriptions import Registry, applier_state

    if not config.intermediate_dir.is_dir():
        return []
    return [
        {
            "table": sub.table,
            "mode": sub.mode,
            "state": applier_state(sub, applied_commit_lsn),
            "recovering": sub.recovering,
            "copied_rows": sub.copied_rows,
            "error": sub.error,
        }
        for sub in Registry(config.intermediate_dir).load().values()
    ]


def _source(config: Config) -> dict[str, Any] | None:
    """The source's slot and the extractor's state (None without ``source.*``)."""
    from applier.extract.monitor import read_source_status

    s = read_source_status(config)
    if s is None:
        return None
    return {
        "slot": s.slot,
        "retained_wal_bytes": s.wal.retained_bytes if s.wal else None,
        "lag_bytes": s.wal.lag_bytes if s.wal else None,
        "wal_status": s.wal.wal_status if s.wal else None,
        "problem": s.problem,
        "held_back": s.extractor.held_back if s.extractor else None,
        "caught_up_at": s.extractor.caught_up_at if s.extractor else None,
        "newest_commit_ts": s.newest_commit,
    }
