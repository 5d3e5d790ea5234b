"""The extractor's status file, ``<intermediate_dir>/.extract.status.json``: what ``applier status`` reads of it.

``applier extract`` replaces it atomically (temporary name, fsync, rename)
when it is held back or released, at the end of each run, and every
:data:`STATUS_EVERY_SECONDS` while it follows the source. Its name starts with
a dot, so readers of the folder's pairs ignore it, like ``.extract.lock``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from applier.engine.checkpoint import write_atomically

log = logging.getLogger(__name__)
STATUS_FILE = ".extract.status.json"
STATUS_EVERY_SECONDS = 10.0


@dataclass(frozen=True)
class ExtractorStatus:
    """The extractor's flow-control state and how far it has caught up, as it last wrote them.

    Attributes:
        held_back: the unapplied backlog holds extraction back.
        held_since: when it was held back (ISO 8601 UTC), None when it is not.
        backlog_bytes: the unapplied backlog at the last measurement.
        max_backlog_bytes: ``extract.max_backlog_mb`` in bytes (0: no limit).
        resume_backlog_bytes: the low-water mark in bytes.
        caught_up_at: the moment whose WAL end the slot is confirmed at: every
            transaction committed before it is in a complete pair. None before
            a batch first reached the WAL end.
        confirmed_lsn: the slot's confirmed position the extractor last set or read.
        updated_at: when the file was written.
    """

    held_back: bool
    held_since: str | None
    backlog_bytes: int
    max_backlog_bytes: int
    resume_backlog_bytes: int
    caught_up_at: str | None
    confirmed_lsn: int
    updated_at: str


def size_text(size: int) -> str:
    """A size in bytes for people: KiB below a MiB, MiB below a GiB, else GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size / 1024:.1f} KiB"


def utc_now() -> str:
    """The current moment as ISO 8601 UTC text."""
    return dt.datetime.now(dt.UTC).isoformat()


def moment_text(epoch_seconds: float) -> str:
    """A ``time.time()`` value as ISO 8601 UTC text."""
    return dt.datetime.fromtimestamp(epoch_seconds, dt.UTC).isoformat()


def write_status(directory: Path, status: ExtractorStatus) -> None:
    """Replace the status file in ``directory`` with ``status``."""
    write_atomically(directory / STATUS_FILE, asdict(status))


def read_status(directory: Path) -> ExtractorStatus | None:
    """The status file in ``directory``; None when there is none or it cannot be read (logged).

    The file is advisory: a damaged one is replaced by the extractor's next
    write, so it stops neither the extractor nor ``applier status``.
    """
    path = directory / STATUS_FILE
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
        return ExtractorStatus(**{f.name: data[f.name] for f in fields(ExtractorStatus)})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:
        log.warning("%s cannot be read (%s); it is written again at the next extraction", path, e)
        return None
