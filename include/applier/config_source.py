"""``source.*``, ``extract.*``, ``materialize.*``: the sections only ``applier extract`` and ``subscribe`` read.

Sections of their own so that :mod:`applier.config` only lists their keys and
builds them; validators come from :mod:`applier.config_values`, as there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from applier import config_values as cv
from applier.errors import ConfigError
from applier.intermediate.pairs import MIB

MAX_CHUNK_ROWS = 1_000_000  # a nonatomic chunk is held in the extractor's memory between its watermarks


@dataclass(frozen=True)
class SourceConfig:
    """``source.*``: the PostgreSQL database ``applier extract`` reads.

    ``url``: a libpq connection string of a role with the REPLICATION right.
    ``slot``, ``publication``: the logical replication slot (pgoutput) and
    publication (``applier extract --setup`` creates both). ``include``: the
    ``schema.table`` names to extract (empty: every published table; --setup
    publishes these, or all tables); ``exclude``: names left out.
    """

    url: str | None = None
    slot: str | None = None
    publication: str | None = None
    include: frozenset[str] = frozenset()
    exclude: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ExtractConfig:
    """``extract.*``: how ``applier extract`` cuts pairs.

    ``max_pair_mb``: the size (MiB) at which a pair closes, within a large
    transaction too. ``max_pair_seconds``: the age at which a pair closes at
    the next commit, so that a quiet source still delivers.

    Flow control (:mod:`applier.extract.flow`): extraction is held back while
    the unapplied backlog exceeds ``max_backlog_mb`` (0: no limit) and resumes
    below ``resume_backlog_mb`` (None: half of it). ``warn_retained_wal_mb``:
    the WAL the slot retains on the source above which the extractor and
    ``applier status`` warn (0: never).
    """

    max_pair_mb: float = 64.0
    max_pair_seconds: float = 60.0
    max_backlog_mb: float = 1024.0
    resume_backlog_mb: float | None = None
    warn_retained_wal_mb: float = 4096.0

    @property
    def resume_backlog_bytes(self) -> int:
        """The low-water mark in bytes: ``resume_backlog_mb``, else half of ``max_backlog_mb``."""
        marks = self.max_backlog_mb / 2 if self.resume_backlog_mb is None else self.resume_backlog_mb
        return int(marks * MIB)


@dataclass(frozen=True)
class MaterializeConfig:
    """``materialize.*``: how the extractor copies a newly subscribed table.

    ``chunk_rows``: rows per chunk, each its own source transaction
    (incremental and nonatomic modes). ``lock_timeout_s``: how long the
    atomic and incremental modes wait for the brief ``SHARE`` lock that fixes
    the copy's position; then the subscription is ``recovering``.
    """

    chunk_rows: int = 100_000
    lock_timeout_s: float = 30.0


# key -> (validator, default), as applier.config's table.
SOURCE_KEYS: dict[str, tuple[Callable[[str, Any], Any], Any]] = {
    "source.url": (cv.text, None),
    "source.slot": (cv.slot_name, None),
    "source.publication": (cv.slot_name, None),
    "source.include": (cv.table_names, frozenset()),
    "source.exclude": (cv.table_names, frozenset()),
    "extract.max_pair_mb": (cv.positive_number, 64.0),
    "extract.max_pair_seconds": (cv.seconds("a pair closes at the next commit once this old"), 60.0),
    "materialize.chunk_rows": (cv.int_range(1, MAX_CHUNK_ROWS, "rows per chunk of a copy"), 100_000),
    "materialize.lock_timeout_s": (cv.seconds("the wait for the lock that fixes a copy's position"), 30.0),
    "extract.max_backlog_mb": (cv.megabytes("unapplied backlog that holds extraction back; 0 means no limit"), 1024.0),
    "extract.resume_backlog_mb": (cv.megabytes_or_null("half of extract.max_backlog_mb"), None),
    "extract.warn_retained_wal_mb": (cv.megabytes("WAL the slot retains before a warning; 0 means never"), 4096.0),
}
# None is their default, not "required": applier extract requires the source's, and says so.
SOURCE_OPTIONAL_KEYS = ("extract.resume_backlog_mb", "source.url", "source.slot", "source.publication")


def source_config(values: Mapping[str, Any]) -> SourceConfig:
    """``source.*`` from the validated values of :func:`applier.config.load_config`."""
    return SourceConfig(
        url=values["source.url"],
        slot=values["source.slot"],
        publication=values["source.publication"],
        include=values["source.include"],
        exclude=values["source.exclude"],
    )


def materialize_config(values: Mapping[str, Any]) -> MaterializeConfig:
    """``materialize.*`` from the validated values."""
    return MaterializeConfig(
        chunk_rows=values["materialize.chunk_rows"], lock_timeout_s=values["materialize.lock_timeout_s"]
    )


def extract_config(values: Mapping[str, Any]) -> ExtractConfig:
    """``extract.*``, with the low-water mark checked against the limit it resumes under."""
    limit, resume = values["extract.max_backlog_mb"], values["extract.resume_backlog_mb"]
    if limit and resume is not None and resume > limit:
        raise ConfigError(
            "extract.resume_backlog_mb", resume, f"use a number of MiB at most extract.max_backlog_mb ({limit:g})"
        )
    return ExtractConfig(
        max_pair_mb=values["extract.max_pair_mb"],
        max_pair_seconds=values["extract.max_pair_seconds"],
        max_backlog_mb=limit,
        resume_backlog_mb=resume,
        warn_retained_wal_mb=values["extract.warn_retained_wal_mb"],
    )
