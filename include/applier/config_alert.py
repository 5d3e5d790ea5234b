"""``alert.*``: when the Applier counts as too far behind the source (the apply DAG's lag check alerts on it).

A section of its own so that :mod:`applier.config` only lists its keys and
builds it. The lag compared is the age of the oldest unapplied commit
(:mod:`applier.lag_alert` says why), so the threshold is how long a committed
source change may wait before it reaches the target.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from applier import config_values as cv

MAX_LAG_SECONDS = "alert.max_lag_seconds"


@dataclass(frozen=True)
class AlertConfig:
    """``alert.*``: when the lag check alerts.

    ``max_lag_seconds``: the age (seconds) of the oldest unapplied commit above
    which the apply DAG's ``check_lag`` task fails and calls its notifier;
    None: no alert (the check still measures and logs the lag every run). Off
    by default: the right value depends on the schedule and on what the
    target's readers can bear, and any built-in one would either page a
    healthy hourly schedule or stay silent on a five-minute one.
    """

    max_lag_seconds: float | None = None


# Seconds > 0, or None (no alert); 0 is refused, as it would alert on any unapplied commit.
max_lag_seconds = cv.positive_or_null("use a number of seconds > 0, or null for no lag alert")


# key -> (validator, default), as applier.config's table; every default is None: optional, not required.
ALERT_KEYS: dict[str, tuple[Callable[[str, Any], Any], Any]] = {MAX_LAG_SECONDS: (max_lag_seconds, None)}


def alert_config(values: Mapping[str, Any]) -> AlertConfig:
    """``alert.*`` from the validated values of :func:`applier.config.load_config`."""
    return AlertConfig(max_lag_seconds=values[MAX_LAG_SECONDS])
