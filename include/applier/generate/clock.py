"""Simulated source time, so the same seed always writes the same timestamps."""

from __future__ import annotations

import datetime as dt

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# The stream starts on a Monday morning; any fixed moment would do.
START = dt.datetime(2026, 1, 5, 8, 0, 0, 123457, tzinfo=dt.UTC)


class SimClock:
    """Microseconds since the Unix epoch, moved forward only by the generator.

    Args:
        start: the moment the stream starts.
    """

    def __init__(self, start: dt.datetime = START) -> None:
        self.now_us = (start - EPOCH) // dt.timedelta(microseconds=1)

    def advance(self, micros: int) -> None:
        """Move the clock forward by ``micros`` (at least one microsecond)."""
        self.now_us += max(1, micros)

    def now(self) -> dt.datetime:
        """The current simulated moment as an aware UTC datetime."""
        return EPOCH + dt.timedelta(microseconds=self.now_us)
