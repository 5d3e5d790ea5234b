"""``applier status``: where an Applier stands, read from its files without Spark.

Open transactions are found the way a restart finds them: by re-reading the
pairs from the checkpoint's ``restart_seq``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from applier.config import Config
from applier.engine.buffers import row_bytes
from applier.engine.checkpoint import Checkpoint, CheckpointStore
from applier.engine.jsonlines import last_lines
from applier.engine.ledger_cycles import RECENT_CYCLES
from applier.engine.reading import open_rows, reread_window
from applier.engine.report import collision_counts, last_report, set_aside_counts
from applier.intermediate.pairs import list_pairs


@dataclass
class OpenTxnStatus:
    xid: str
    rows: int
    bytes: int
    began_seq: int
    began_at: str | None
    spilled: bool


@dataclass
class Status:
    checkpoint: Checkpoint
    backlog_pairs: int
    backlog_bytes: int
    gap: str | None
    open_transactions: list[OpenTxnStatus] = field(default_factory=list)
    spill_files: list[tuple[str, int]] = field(default_factory=list)
    last_cycle: dict[str, Any] | None = None
    recent_cycles: int = 0
    set_aside: dict[str, int] = field(default_factory=dict)
    collisions: dict[str, dict[str, int]] = field(default_factory=dict)


def _open_transactions(config: Config, checkpoint: Checkpoint) -> list[OpenTxnStatus]:
    """The transactions a restart would rebuild, sized by the buffers' own byte rule."""
    validator, reread = reread_window(config.intermediate_dir, checkpoint)
    open_xids = validator.state.open_xids
    rows: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for _, batch in open_rows(reread, set(open_xids)):
        sums = (
            pa.table({"xid": batch["xid"], "bytes": row_bytes(batch)})
            .group_by("xid")
            .aggregate([("bytes", "count"), ("bytes", "sum")])
        )
        for xid, count, size in zip(*(sums[c].to_pylist() for c in ("xid", "bytes_count", "bytes_sum")), strict=True):
            rows[xid] += count
            sizes[xid] += size
    # What a transaction of this size does by its own rule (the queue may spool more when full).
    limit = min(config.apply.buffer_size_for_split_records, config.queue_memory_bytes // 2)
    return [
        OpenTxnStatus(x, rows[x], sizes[x], s, reread.begun_at.get(x), sizes[x] > limit)
        for x, s in sorted(open_xids.items())
    ]


@dataclass(frozen=True)
class Backlog:
    """The complete pairs after the checkpoint's applied pair, up to a gap: what the Applier has still to apply."""

    pairs: int
    bytes: int
    gap: str | None


def unapplied_backlog(config: Config, checkpoint: Checkpoint | None = None) -> Backlog:
    """The unapplied backlog after ``checkpoint`` (default: the checkpoint file's).

    What ``applier status`` shows, and what holds ``applier extract`` back
    (``extract.max_backlog_mb``).

    Raises:
        StateFileError: the checkpoint file is damaged.
    """
    applied = (checkpoint or CheckpointStore(config.work_dir).load()).applied_seq
    listing = list_pairs(config.intermediate_dir, applied + 1)
    gap = listing.gap_error()
    return Backlog(len(listing.pairs), sum(p.size for p in listing.pairs), gap.detail if gap else None)


def read_status(config: Config) -> Status:
    """Read the checkpoint, backlog, open transactions, spill files, last cycle and what recent cycles set aside."""
    checkpoint = CheckpointStore(config.work_dir).load()
    recent = last_lines(config.work_dir / "cycles.jsonl", RECENT_CYCLES)
    backlog = unapplied_backlog(config, checkpoint)
    spills = sorted(config.spill_dir.glob("*.spill")) if config.spill_dir.exists() else []
    return Status(
        checkpoint=checkpoint,
        backlog_pairs=backlog.pairs,
        backlog_bytes=backlog.bytes,
        gap=backlog.gap,
        open_transactions=_open_transactions(config, checkpoint) if checkpoint.applied_seq else [],
        spill_files=[(p.name, p.stat().st_size) for p in spills],
        last_cycle=last_report(config.work_dir / "cycles.jsonl"),
        recent_cycles=len(recent),
        set_aside=set_aside_counts(recent),
        collisions=collision_counts(recent),
    )


def age(moment: str | None) -> str:
    """How long ago an ISO 8601 moment was, for people ("never" for None)."""
    if not moment:
        return "never"
    then = dt.datetime.fromisoformat(moment.replace("Z", "+00:00"))
    seconds = int((dt.datetime.now(dt.UTC) - then).total_seconds())
    days, rest = divmod(max(seconds, 0), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h ago"
    if hours:
        return f"{hours}h {minutes}m ago"
    return f"{minutes}m {secs}s ago" if minutes else f"{secs}s ago"
