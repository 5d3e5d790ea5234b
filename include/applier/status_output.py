"""``applier status`` for people (text) and for Prometheus (text exposition), drawn from one status document.

Pure: both take the object :func:`applier.status_document.status_document` builds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from applier.engine.status import age
from applier.intermediate.pairs import MIB

QUEUE_KINDS = ("transactions", "tables", "compiled")


def _mib(n: int | float | None) -> str:
    return f"{(n or 0) / MIB:.2f} MiB"


def human_seconds(s: float | None) -> str:
    """Seconds for people: ``0.42 s``, ``17.8 s``, ``3m 12s``, ``5h 3m``, ``2d 4h``."""
    if s is None:
        return "unknown"
    if s < 10:
        return f"{s:.2f} s"
    if s < 60:
        return f"{s:.1f} s"
    whole = int(s)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {secs}s"


def _pairs(seqs: list[int]) -> str:
    return f"{seqs[0]}..{seqs[-1]}" if seqs else "none"


def text_lines(doc: dict[str, Any]) -> list[str]:
    """The document as ``applier status`` prints it (the source's lines are the monitor's, added by the caller)."""
    cp = doc["checkpoint"]
    lines = [
        f"configuration {doc['configuration']}: cycle {cp['cycle_id']}, committed {age(cp['committed_at'])}",
        f"applied seq {cp['applied_seq']} (commit lsn {cp['applied_commit_lsn']}), restart seq {cp['restart_seq']}",
        _lag_line(doc["lag"]),
    ]
    backlog = doc["backlog"]
    gap = backlog["gap"]
    lines.append(
        f"backlog: {backlog['pairs']} pairs, {backlog['bytes'] / MIB:.2f} MiB"
        + (f"; stops at a gap: {gap['detail']}" if gap else "")
    )
    for refused in backlog["refused_pairs"]:
        lines.append(f"  REFUSED pair {refused['seq']}: {refused['file']}: {refused['detail']} [{refused['code']}]")
    lines += _activity_lines(doc)
    lines.append(f"open transactions: {len(doc['open_transactions'])}")
    for t in doc["open_transactions"]:
        where = "spilled" if t["spilled"] else "in memory"
        lines.append(
            f"  {t['xid']}: {t['rows']} rows, {t['bytes']} bytes, began in pair {t['began_seq']} "
            f"{age(t['began_at'])}, {where}"
        )
    lines.append(f"spill files: {len(doc['spill_files'])}")
    lines += [f"  {f['name']}: {f['bytes']} bytes" for f in doc["spill_files"]]
    lines.append(f"queue memory: {doc['queue']['budget_bytes'] / MIB:.1f} MiB")
    lines += _last_cycle_lines(doc)
    return lines


def _lag_line(lag: dict[str, Any]) -> str:
    if lag["last_applied_commit_ts"] is None:
        applied = "lag: unknown (no applied commit found in the pairs)"
    else:
        applied = (
            f"lag: {human_seconds(lag['seconds'])} behind the source "
            f"(last applied commit {lag['last_applied_commit_ts']})"
        )
    if lag["oldest_unapplied_commit_ts"] is None:
        return f"{applied}; no unapplied commit"
    return (
        f"{applied}; oldest unapplied commit {human_seconds(lag['oldest_unapplied_seconds'])} old "
        f"({lag['oldest_unapplied_commit_ts']})"
    )


def _activity_lines(doc: dict[str, Any]) -> list[str]:
    """What blocks, the run under way and its cycle, the last run and the last error."""
    lines = []
    blocked = doc["blocked_by"]
    if blocked is not None:
        what = (
            f"transaction {blocked['xid']}"
            if blocked["kind"] == "transaction"
            else f"{blocked['kind']} {blocked['seq']}"
        )
        lines.append(f"BLOCKED by {what}: {blocked.get('detail')}")
    running = doc["run_in_progress"]
    if running is not None:
        key = f", run key {running['run_key']}" if running["run_key"] else ""
        lines.append(
            f"run in progress: host {running['host']}, pid {running['pid']}, started {running['started_at']}{key}"
        )
    else:
        lines.append("run in progress: none")
    under_way = doc["cycle_under_way"]
    if under_way is not None:
        lines.append(
            f"cycle {under_way['cycle_id']} under way: pairs {_pairs(under_way['seqs'])}, "
            f"{under_way['through']} transactions applied or passed"
        )
    last_run = doc["last_run"]
    if last_run is not None and "unreadable" in last_run:
        lines.append(f"last run: unreadable ({last_run['unreadable']})")
    elif last_run is not None:
        key = f" (run key {last_run['run_key']})" if last_run["run_key"] else ""
        lines.append(
            f"last run{key}: {last_run['outcome']} {age(last_run['finished_at'])}, {last_run['cycles']} cycles"
        )
    error = doc["last_error"]
    if error is not None:
        code = f", exit code {error['exit_code']}" if error.get("exit_code") is not None else ""
        lines.append(f"last error ({age(error['at'])}{code}): {error['message']}")
    return lines


def _last_cycle_lines(doc: dict[str, Any]) -> list[str]:
    from applier.summary import collisions_line, set_aside_line

    lines = [
        f"{set_aside_line(doc['set_aside'])} (the last {doc['recent_cycles']} cycles)",
        f"{collisions_line(doc['collisions'])} (the last {doc['recent_cycles']} cycles)",
    ]
    c = doc["last_cycle"]
    if c is None:
        return lines
    rate = f" ({c['changes_per_second']:.0f} changes/s)" if c["changes_per_second"] is not None else ""
    phases = ", ".join(f"{name} {human_seconds(s)}" for name, s in c["seconds"].items())
    ended = f"; ended {c['ended_at'][:19].replace('T', ' ')} UTC" if c.get("ended_at") else ""
    lines.append(
        f"last cycle: {c['cycle_id']} pairs {_pairs(c['seqs'])} ({_mib(c['bytes'])}): {c['rows_read']} changes "
        f"in {human_seconds(c['total_seconds'])}{rate}; {phases}{ended}"
    )
    q = doc["queue"]
    if q["peak_bytes"] is not None:

        def by_kind(figures: dict[str, int]) -> str:
            return ", ".join(f"{kind} {figures.get(kind, 0) / MIB:.2f}" for kind in QUEUE_KINDS)

        lines.append(
            f"  in memory at its end (MiB): {by_kind(q['memory_bytes'])}; peak {q['peak_bytes'] / MIB:.2f} "
            f"of {q['budget_bytes'] / MIB:.2f}"
        )
        lines.append(f"  spooled during it (MiB): {by_kind(q['spooled_bytes'])}; {q['spooled_buffers']} buffers")
    return lines


def prometheus_text(doc: dict[str, Any]) -> str:
    """The document's figures in Prometheus' text exposition format (0.0.4), each labelled with the configuration."""
    return "".join(f"{line}\n" for line in _metric_lines(doc))


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float | int | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "NaN"
    return repr(float(value)) if isinstance(value, float) else str(int(value))


class _Metrics:
    """Metric families written in order: HELP and TYPE once, then their samples."""

    def __init__(self, configuration: str) -> None:
        self.base = f'configuration="{_label(configuration)}"'
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], Any]]) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            extra = "".join(f',{k}="{_label(v)}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{self.base}{extra}}} {_number(value)}")

    def one(self, name: str, kind: str, help_text: str, value: Any) -> None:
        self.family(name, kind, help_text, [({}, value)])


def _metric_lines(doc: dict[str, Any]) -> Iterator[str]:
    m = _Metrics(doc["configuration"])
    lag, backlog, queue, cycle = doc["lag"], doc["backlog"], doc["queue"], doc["last_cycle"]
    m.one("applier_lag_seconds", "gauge", "Now minus the source time of the last applied commit.", lag["seconds"])
    m.one(
        "applier_oldest_unapplied_commit_age_seconds",
        "gauge",
        "Now minus the source time of the oldest unapplied commit (0 when none).",
        lag["oldest_unapplied_seconds"] or 0,
    )
    m.one("applier_cycles_total", "counter", "Apply cycles committed.", doc["totals"]["cycles"])
    m.one("applier_changes_total", "counter", "Row changes read by the committed cycles.", doc["totals"]["changes"])
    m.one(
        "applier_last_cycle_changes_per_second",
        "gauge",
        "Row changes per second of the last cycle.",
        cycle["changes_per_second"] if cycle else None,
    )
    m.family(
        "applier_last_cycle_phase_seconds",
        "gauge",
        "Seconds of each phase of the last cycle.",
        [({"phase": p}, s) for p, s in (cycle["seconds"] if cycle else {}).items()],
    )
    m.one("applier_backlog_pairs", "gauge", "Complete pairs not applied yet.", backlog["pairs"])
    m.one("applier_backlog_bytes", "gauge", "Bytes of the pairs not applied yet.", backlog["bytes"])
    m.one(
        "applier_refused_pairs",
        "gauge",
        "Backlog pairs whose header or size is refused.",
        len(backlog["refused_pairs"]),
    )
    m.one(
        "applier_blocked",
        "gauge",
        "1 when a refused pair, a gap or a stopped transaction blocks.",
        int(bool(doc["blocked_by"])),
    )
    m.one("applier_run_in_progress", "gauge", "1 while a run holds the run lock.", int(bool(doc["run_in_progress"])))
    m.one("applier_open_transactions", "gauge", "Transactions begun and not ended.", len(doc["open_transactions"]))
    m.one(
        "applier_open_transaction_bytes", "gauge", "Bytes the open transactions hold.", queue["open_transaction_bytes"]
    )
    m.one("applier_queue_budget_bytes", "gauge", "The queue-memory budget.", queue["budget_bytes"])
    m.family(
        "applier_queue_memory_bytes",
        "gauge",
        "Queue memory in use at the end of the last cycle, by kind.",
        [({"kind": k}, queue["memory_bytes"].get(k, 0)) for k in QUEUE_KINDS],
    )
    m.one("applier_queue_peak_bytes", "gauge", "Peak queue memory of the last cycle.", queue["peak_bytes"] or 0)
    m.family(
        "applier_queue_spooled_bytes",
        "gauge",
        "Bytes spooled to disk during the last cycle, by kind.",
        [({"kind": k}, queue["spooled_bytes"].get(k, 0)) for k in QUEUE_KINDS],
    )
    m.one("applier_spill_files", "gauge", "Spill files on disk.", len(doc["spill_files"]))
    m.family(
        "applier_exceptions_set_aside",
        "gauge",
        f"Transactions error actions set aside in the last {doc['recent_cycles']} cycles, by action.",
        [({"action": a}, n) for a, n in doc["set_aside"].items()],
    )
    states: dict[str, int] = {}
    for sub in doc["subscriptions"]:
        states[sub["state"]] = states.get(sub["state"], 0) + 1
    m.family(
        "applier_subscriptions",
        "gauge",
        "Subscriptions by state.",
        [({"state": s}, n) for s, n in sorted(states.items())],
    )
    source = doc["source"]
    if source is not None:
        m.one(
            "applier_source_retained_wal_bytes",
            "gauge",
            "WAL the source keeps for the slot.",
            source["retained_wal_bytes"],
        )
        m.one("applier_source_lag_bytes", "gauge", "WAL not extracted yet.", source["lag_bytes"])
        m.one(
            "applier_extract_held_back",
            "gauge",
            "1 while the backlog holds extraction back.",
            int(bool(source["held_back"])),
        )
    return iter(m.lines)
