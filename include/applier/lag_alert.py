"""Whether the Applier is further behind the source than ``alert.max_lag_seconds`` allows: one line, one payload.

The lag compared is the age of the **oldest unapplied commit**: how long the
oldest source change that reached a pair has waited without reaching the
target. That is what "behind" means whatever the cause (a refused pair, a
failing target, a run too slow for the arrivals, no run at all), and it is 0
while nothing waits. The time since the last applied commit is not compared:
with an idle source it grows by the hour although nothing is waiting, and an
alert on it would page every quiet night. It is reported alongside.

The figures are ``applier status``'s own (:func:`applier.status_document.status_document`),
so the alert, ``status --json`` and the Applier view say the same. What the
pairs cannot show is not measured here: a stalled extractor delivers no pair,
so nothing waits in the intermediate folder; ``applier status`` with
``source.*`` (the slot's lag in bytes) and the extract DAG's failures tell that.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

from applier.config import Config
from applier.config_alert import MAX_LAG_SECONDS
from applier.status_document import status_document
from applier.status_output import human_seconds


@dataclass(frozen=True)
class LagCheck:
    """One measurement of the lag against the threshold.

    Attributes:
        configuration: the configuration's name.
        checked_at: when it was measured (ISO 8601 UTC).
        lag_seconds: the age of the oldest unapplied commit; 0 when none waits.
        max_lag_seconds: the threshold (``alert.max_lag_seconds``); None: no alert.
        oldest_unapplied_seq: the pair holding the oldest unapplied commit, or None.
        oldest_unapplied_commit_ts: that commit's source time, or None.
        last_applied_commit_ts: the source time of the last applied commit, or None.
        last_applied_seconds: now minus that time (grows with an idle source too), or None.
        backlog_pairs: complete pairs waiting after the applied one.
        backlog_bytes: their size.
        blocked_by: what stops the Applier, as ``applier status --json`` gives it, or None.
    """

    configuration: str
    checked_at: str
    lag_seconds: float
    max_lag_seconds: float | None
    oldest_unapplied_seq: int | None
    oldest_unapplied_commit_ts: str | None
    last_applied_commit_ts: str | None
    last_applied_seconds: float | None
    backlog_pairs: int
    backlog_bytes: int
    blocked_by: dict[str, Any] | None

    @property
    def over(self) -> bool:
        """The lag passed the threshold (never without one)."""
        return self.max_lag_seconds is not None and self.lag_seconds > self.max_lag_seconds

    def line(self) -> str:
        """The check in one line: the alert's message when :attr:`over`, else what the task log says."""
        if self.max_lag_seconds is None:
            rule = f"{MAX_LAG_SECONDS} not set (no alert)"
        else:
            rule = f"{'over' if self.over else 'within'} {MAX_LAG_SECONDS} {_number(self.max_lag_seconds)} s"
        name = f"configuration {self.configuration}"
        if self.oldest_unapplied_commit_ts is None:
            return f"{name}: lag 0 s, no unapplied commit ({self.backlog_pairs} pairs waiting); {rule}"
        where = f"pair {self.oldest_unapplied_seq}, source time {self.oldest_unapplied_commit_ts}"
        age = f"{_number(self.lag_seconds)} s ({human_seconds(self.lag_seconds)})"
        return (
            f"{'lag alert: ' if self.over else ''}{name}: oldest unapplied commit ({where}) is {age} old, {rule}; "
            f"{self.backlog_pairs} pairs waiting{_blocked(self.blocked_by)}"
        )

    def payload(self) -> dict[str, Any]:
        """The facts as one JSON-able object, with ``text`` (the line) first and ``alert``: ``replication_lag``."""
        return {"text": self.line(), "alert": "replication_lag", "over": self.over, **dataclasses.asdict(self)}


def _number(seconds: float) -> str:
    """``900``, ``1.5``, ``2734891.2``: one decimal at most, never an exponent."""
    return f"{seconds:.1f}".removesuffix(".0")


def _blocked(blocked: dict[str, Any] | None) -> str:
    if not blocked:
        return ""
    what = f"transaction {blocked.get('xid')}" if blocked.get("kind") == "transaction" else f"pair {blocked.get('seq')}"
    if blocked.get("kind") == "gap":
        what = f"a gap at pair {blocked.get('seq')}"
    detail = " ".join(str(blocked.get("detail") or "").split())  # the line stays one line
    return f"; blocked by {what}" + (f": {detail}" if detail else "")


def check_lag(config: Config, *, now: dt.datetime | None = None) -> LagCheck:
    """Measure the lag of ``config`` (as ``applier status`` does) against ``alert.max_lag_seconds``.

    Reads the configuration's files and the ``.trn`` files only (no Spark, no
    target, no source), in about a second.

    Args:
        config: the configuration.
        now: the moment the lag is measured at (default: now, UTC).

    Raises:
        StateFileError: the checkpoint or the intent is damaged.
    """
    doc = status_document(config, now=now, source=False)
    lag = doc["lag"]
    return LagCheck(
        configuration=doc["configuration"],
        checked_at=doc["generated_at"],
        lag_seconds=lag["oldest_unapplied_seconds"] or 0.0,
        max_lag_seconds=config.alert.max_lag_seconds,
        oldest_unapplied_seq=lag["oldest_unapplied_seq"],
        oldest_unapplied_commit_ts=lag["oldest_unapplied_commit_ts"],
        last_applied_commit_ts=lag["last_applied_commit_ts"],
        last_applied_seconds=lag["seconds"],
        backlog_pairs=doc["backlog"]["pairs"],
        backlog_bytes=doc["backlog"]["bytes"],
        blocked_by=doc["blocked_by"],
    )
