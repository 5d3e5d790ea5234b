"""Where the Applier stands: the checkpoint and the intent of the cycle in progress.

The checkpoint records the positions of spec section 5 after a committed
cycle. The intent records which pairs a cycle takes *before* the target is
touched, so that a run restarted after a crash mid-cycle re-runs exactly
that cycle: tables already carrying the cycle skip it, the others apply it.
Both are JSON files replaced atomically (write, fsync, rename).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from applier.intermediate.schema import TableDef, parse_table_def


@dataclass(frozen=True)
class Checkpoint:
    """The position after the last committed cycle (cycle 0: nothing applied yet).

    Attributes:
        cycle_id: the last committed cycle.
        applied_seq: the last pair applied.
        applied_commit_lsn: the commit lsn of the last transaction applied.
        restart_seq: where to re-read from to rebuild open transactions.
        last_lsn: the largest lsn of pair ``applied_seq`` (continuity check).
        tables: the table definitions seen so far.
        row_counts: rows each target table holds by the engine's count.
        committed_at: when the cycle was committed (UTC text).
        table_cycles: for each table a cycle touched, the cycle its target
            state holds (the target's ``committed_cycle`` after that cycle); a
            table found holding less at the next start was restored. Absent
            from checkpoints written before it existed (read as empty).
    """

    cycle_id: int = 0
    applied_seq: int = 0
    applied_commit_lsn: int | None = None
    restart_seq: int = 1
    last_lsn: int | None = None
    tables: dict[str, TableDef] = field(default_factory=dict)
    row_counts: dict[str, int] = field(default_factory=dict)
    committed_at: str | None = None
    table_cycles: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # Field by field, not ``asdict``: that deep-copies every table definition only to replace them.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["tables"] = {name: t.to_json() for name, t in self.tables.items()}
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> Checkpoint:
        tables = {name: parse_table_def(name, raw) for name, raw in data.get("tables", {}).items()}
        return Checkpoint(**{**data, "tables": tables})


@dataclass(frozen=True)
class Intent:
    """The pairs cycle ``cycle_id`` takes, recorded before the target is touched."""

    cycle_id: int
    seqs: list[int]


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` as JSON: a temporary file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class CheckpointStore:
    """The checkpoint and intent files in ``<output_dir>/<configuration_name>/``."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.checkpoint_path = work_dir / "checkpoint.json"
        self.intent_path = work_dir / "intent.json"

    def load(self) -> Checkpoint:
        """The last committed checkpoint, or the starting one."""
        if not self.checkpoint_path.exists():
            return Checkpoint()
        return Checkpoint.from_json(json.loads(self.checkpoint_path.read_text(encoding="utf-8")))

    def save(self, checkpoint: Checkpoint) -> Checkpoint:
        """Record ``checkpoint`` (stamped with the time unless it carries one) and clear the intent it fulfils."""
        stamped = (
            checkpoint
            if checkpoint.committed_at
            else replace(checkpoint, committed_at=dt.datetime.now(dt.UTC).isoformat())
        )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.checkpoint_path, stamped.to_json())
        self.intent_path.unlink(missing_ok=True)
        return stamped

    def load_intent(self) -> Intent | None:
        """The intent of a cycle begun but not checkpointed, if any."""
        if not self.intent_path.exists():
            return None
        return Intent(**json.loads(self.intent_path.read_text(encoding="utf-8")))

    def save_intent(self, intent: Intent) -> None:
        """Record which pairs the next cycle takes, before the target is touched."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.intent_path, asdict(intent))
