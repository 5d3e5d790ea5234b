"""Flow control of ``applier extract``: the Applier's unapplied backlog holds the extractor back.

Informix ER blocks a sender whose target's receive queue is full; here the
queue is the intermediate folder and the sender the extractor. The backlog is
what ``applier status`` shows, measured by the same function
(:func:`applier.engine.status.unapplied_backlog`): the bytes of the complete
pairs after the Applier's checkpoint.

- Above ``extract.max_backlog_mb`` the extractor is **held back**: a batch
  stops decoding right after the pair that crossed the limit is in place (what
  the writer already holds past it, at most one message's rows, is written
  into one more pair when the run ends), and no batch starts while held back.
  ``--follow`` keeps polling and neither peeks nor writes; a bounded batch
  ends early and its summary says so.
- It is **released** once the backlog is at or below the low-water mark
  (``extract.resume_backlog_mb``, half the limit by default). Both are logged
  once, with the figures. The state is kept in the status file
  (:mod:`applier.extract.status_file`), so scheduled batches keep the same
  hysteresis as ``--follow``: a batch after a held-back one starts only below
  the low-water mark.

While held back the slot does not advance, so the source keeps its WAL: the
backlog moves from the intermediate folder to the source's ``pg_wal``. A
warning is logged once the WAL the slot retains passes
``extract.warn_retained_wal_mb`` (``applier status`` gives the same warning).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Generator, Iterator
from typing import Protocol

import psycopg

from applier.config import Config
from applier.engine.checkpoint import Checkpoint, CheckpointStore
from applier.engine.status import unapplied_backlog
from applier.extract import source
from applier.extract.status_file import (
    STATUS_EVERY_SECONDS,
    ExtractorStatus,
    moment_text,
    read_status,
    size_text,
    utc_now,
    write_status,
)
from applier.intermediate.pairs import MIB

log = logging.getLogger(__name__)


class RunSummary(Protocol):
    """What flow control adds to a run's summary (``applier.extract.run.ExtractSummary``)."""

    held_back: bool
    confirmed_lsn: int


def retained_wal_warning(slot: str, retained_bytes: int | None, threshold_mb: float) -> str | None:
    """The warning for a slot retaining more WAL than ``extract.warn_retained_wal_mb``; None below it (or at 0)."""
    if not threshold_mb or retained_bytes is None or retained_bytes <= threshold_mb * MIB:
        return None
    return (
        f"slot {slot} retains {size_text(retained_bytes)} of WAL on the source, above "
        f"extract.warn_retained_wal_mb ({size_text(int(threshold_mb * MIB))}): the source keeps its WAL until "
        "extraction confirms the slot past it; if the extractor is held back, apply the backlog, else run "
        "applier extract"
    )


class FlowControl:
    """One extraction run's flow control: the backlog measured, held back or released, the status file written.

    Args:
        config: the configuration (``extract.*``, ``intermediate_dir``, the Applier's ``work_dir``).
        conn: the run's autocommit connection to the source (for the slot's retained WAL).
        slot: the replication slot.
        clock: wall-clock seconds (``time.time``).
    """

    def __init__(
        self,
        config: Config,
        conn: psycopg.Connection[tuple[object, ...]],
        slot: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config, self.conn, self.slot, self.clock = config, conn, slot, clock
        self.max_bytes = int(config.extract.max_backlog_mb * MIB)
        self.resume_bytes = config.extract.resume_backlog_bytes
        last = read_status(config.intermediate_dir)
        # Held back by an earlier run: released only at or below the low-water mark, as in --follow.
        self.held = bool(self.max_bytes and last is not None and last.held_back)
        self.held_since = last.held_since if self.held and last is not None else None
        self.caught_up_at = last.caught_up_at if last is not None else None
        self.backlog = last.backlog_bytes if last is not None else 0
        self.confirmed = last.confirmed_lsn if last is not None else 0
        self._bound: tuple[int, float] | None = None  # the WAL end a batch aims at, and when it was read
        self._warned = False
        self._written = -math.inf
        self._store = CheckpointStore(config.work_dir)
        self._checkpoint_stamp: tuple[tuple[int, int, int] | None, Checkpoint] | None = None

    @property
    def figures(self) -> str:
        """The backlog and both marks, for log lines."""
        return (
            f"the unapplied backlog is {size_text(self.backlog)} (extract.max_backlog_mb: {size_text(self.max_bytes)}; "
            f"extraction resumes at or below {size_text(self.resume_bytes)})"
        )

    def admits(self, state: source.SlotState) -> bool:
        """Before each batch (each poll in ``--follow``): measure, warn, and say whether the batch may run."""
        now = self.clock()
        self._bound = (state.wal_end, now)
        self.confirmed = max(self.confirmed, state.confirmed_flush)
        if state.confirmed_flush >= state.wal_end:
            self.caught_up_at = moment_text(now)
        self._check_retained_wal()
        self.measure()
        if now - self._written >= STATUS_EVERY_SECONDS:
            self.write()
        return not self.held

    def measure(self) -> None:
        """Measure the backlog: hold back above the limit, release at or below the low-water mark."""
        if not self.max_bytes:
            return
        self.backlog = unapplied_backlog(self.config, self._checkpoint()).bytes
        if not self.held and self.backlog > self.max_bytes:
            self.held, self.held_since = True, utc_now()
            log.warning("applier extract: held back: %s", self.figures)
            self.write()
        elif self.held and self.backlog <= self.resume_bytes:
            log.info("applier extract: resumed (held back since %s): %s", self.held_since, self.figures)
            self.held, self.held_since = False, None
            self.write()

    def _checkpoint(self) -> Checkpoint:
        """The Applier's checkpoint, parsed again only when its file was replaced (it is read once a poll)."""
        try:
            stat = self._store.checkpoint_path.stat()
            stamp: tuple[int, int, int] | None = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        except FileNotFoundError:
            stamp = None
        if self._checkpoint_stamp is None or stamp != self._checkpoint_stamp[0]:
            self._checkpoint_stamp = (stamp, self._store.load())
        return self._checkpoint_stamp[1]

    def until_held(self, messages: Generator[bytes, None, None]) -> Iterator[bytes]:
        """``messages`` until the run is held back, checked after each is handled; the rest are never read."""
        with contextlib.closing(messages):  # closing the peek ends its transaction at once
            for message in messages:
                yield message
                if self.held:
                    return

    def observing(self, advance: Callable[[int], None]) -> Callable[[int], None]:
        """``advance``, noting each position the slot is confirmed at.

        The slot confirmed at (or past) the WAL end a batch read at moment T
        means every transaction committed before T is in a complete pair: the
        extractor is caught up to T.
        """

        def advancing(position: int) -> None:
            advance(position)
            self.confirmed = max(self.confirmed, position)
            if self._bound is not None and position >= self._bound[0]:
                self.caught_up_at = moment_text(self._bound[1])

        return advancing

    def finish(self, summary: RunSummary) -> None:
        """At the end of a run: write the status file, and put whether it ended held back in its summary."""
        self.write()
        summary.held_back = self.held
        summary.confirmed_lsn = max(summary.confirmed_lsn, self.confirmed)  # a run held back from the start too

    def write(self) -> None:
        """Replace the status file with the state as it stands."""
        status = ExtractorStatus(
            held_back=self.held,
            held_since=self.held_since,
            backlog_bytes=self.backlog,
            max_backlog_bytes=self.max_bytes,
            resume_backlog_bytes=self.resume_bytes,
            caught_up_at=self.caught_up_at,
            confirmed_lsn=self.confirmed,
            updated_at=utc_now(),
        )
        write_status(self.config.intermediate_dir, status)
        self._written = self.clock()

    def _check_retained_wal(self) -> None:
        """Log the retained-WAL warning once each time the slot passes the threshold."""
        threshold = self.config.extract.warn_retained_wal_mb
        if not threshold:
            return
        warning = retained_wal_warning(self.slot, source.slot_wal(self.conn, self.slot).retained_bytes, threshold)
        if warning and not self._warned:
            log.warning("applier extract: %s", warning)
        self._warned = warning is not None
