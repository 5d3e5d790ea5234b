"""Retrying a cycle's apply after a transient target error (a lock timeout, a lost connection, a deadlock).

A target applies a cycle exactly once whatever happened to an earlier
attempt (PostgreSQL rolls the whole cycle back; Delta tables that committed it
skip it), so the same apply can simply be made again. Each wait is twice the
one before; each is logged with the error, so an operator sees why the run is
waiting. A permanent error, or the last transient one, stops the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from applier.config import ApplyConfig
from applier.errors import TargetError

log = logging.getLogger("applier")

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a transient target error is retried.

    Attributes:
        retries: attempts after the first (0: none).
        delay_s: the first wait; each later wait doubles it.
        sleep: how to wait (tests pass their own).
    """

    retries: int = 0
    delay_s: float = 0.0
    sleep: Callable[[float], None] = time.sleep

    @staticmethod
    def of(apply: ApplyConfig) -> RetryPolicy:
        """The policy of ``apply.transient_retries`` and ``apply.transient_retry_delay_s``."""
        return RetryPolicy(apply.transient_retries, apply.transient_retry_delay_s)

    def run(self, attempt: Callable[[], T], what: str) -> T:
        """``attempt()``, made again after each transient TargetError while retries are left.

        Args:
            attempt: the apply; it must be safe to make again after it failed.
            what: what is being applied, for the log (``cycle 7``).

        Raises:
            TargetError: a permanent error at once, or the last transient one
                (saying how many retries it took).
        """
        for retry in range(self.retries + 1):
            try:
                return attempt()
            except TargetError as e:
                if not e.transient:
                    raise
                if retry == self.retries:
                    if not self.retries:
                        raise
                    raise TargetError(f"{e} (still failing after {self.retries} retries)", transient=True) from e
                wait = self.delay_s * 2**retry
                log.warning(
                    "%s: transient target error, retry %d of %d in %g s: %s", what, retry + 1, self.retries, wait, e
                )
                self.sleep(wait)
        raise AssertionError("unreachable")  # the loop returns or raises


NO_RETRY = RetryPolicy()
"""A transient error stops the run at once."""
