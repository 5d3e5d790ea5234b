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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from applier.errors import StateFileError
from applier.intermediate.schema import TableDef, parse_table_def

T = TypeVar("T")
_COUNTERS = ("cycle_id", "applied_seq", "restart_seq")
_POSITIONS = ("applied_commit_lsn", "last_lsn")
_MAPPINGS = ("tables", "row_counts", "table_cycles")


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
        """The checkpoint ``data`` holds.

        Raises:
            ValueError: ``data`` is not a checkpoint (a field unknown, missing a
                type, or a table definition that does not parse).
        """
        problem = _checkpoint_problem(data)
        if problem:
            raise ValueError(problem)
        tables = {name: parse_table_def(name, raw) for name, raw in data.get("tables", {}).items()}
        return Checkpoint(**{**data, "tables": tables})


def _checkpoint_problem(data: Any) -> str | None:
    """What makes ``data`` no checkpoint, or None."""
    if not isinstance(data, dict):
        return f"it holds a JSON {type(data).__name__}, not an object"
    unknown = sorted(set(data) - {f.name for f in fields(Checkpoint)})
    if unknown:
        return f"unknown field(s) {', '.join(unknown)}"
    for name in _COUNTERS:
        if name in data and (type(data[name]) is not int or data[name] < 0):
            return f"{name} is {data[name]!r}, not a whole number >= 0"
    for name in _POSITIONS:
        if data.get(name) is not None and type(data[name]) is not int:
            return f"{name} is {data[name]!r}, not a whole number or null"
    for name in _MAPPINGS:
        if name in data and not isinstance(data[name], dict):
            return f"{name} is not a JSON object"
    return None


@dataclass(frozen=True)
class Intent:
    """The pairs cycle ``cycle_id`` takes, recorded before the target is touched.

    A cycle applied in parts (:mod:`applier.engine.units`) also records its
    progress, its transactions numbered in commit order: ``through``, how many
    are applied or passed (an error action let them by); ``part_end``, the end
    of the part under way (0: none). A re-run applies that same part first, so
    a target committing table by table sees the part it may half hold.

    ``changed`` carries the row-count changes of the transactions before
    ``through`` (per table: whether one truncated it, and the change in its
    row count), so that a re-run's checkpoint counts the rows the parts of an
    earlier run applied. ``passing``: the part under way is one refused
    transaction being passed, not applied; a target found holding it (its
    position past the part) gained no rows from it.
    """

    cycle_id: int
    seqs: list[int]
    through: int = 0
    part_end: int = 0
    changed: dict[str, tuple[bool, int]] = field(default_factory=dict)
    passing: bool = False

    @staticmethod
    def from_json(data: Any) -> Intent:
        """The intent ``data`` holds.

        Raises:
            ValueError: ``data`` is not ``{"cycle_id": n >= 1, "seqs": [pairs in order]}``,
                with ``through`` and ``part_end`` optional whole numbers, ``changed``
                an optional object of ``[truncated, row-count change]`` and ``passing``
                an optional boolean.
        """
        if not isinstance(data, dict) or not {"cycle_id", "seqs"} <= set(data) <= _INTENT_KEYS:
            raise ValueError(
                'it is not an object of "cycle_id" and "seqs" (and "through", "part_end", "changed", "passing")'
            )
        cycle_id, seqs = data["cycle_id"], data["seqs"]
        if type(cycle_id) is not int or cycle_id < 1:
            raise ValueError(f"cycle_id is {cycle_id!r}, not a whole number >= 1")
        ordered = isinstance(seqs, list) and all(type(x) is int and x >= 1 for x in seqs)
        if not ordered or not seqs or seqs != list(range(seqs[0], seqs[0] + len(seqs))):
            raise ValueError(f"seqs is {seqs!r}, not consecutive pair numbers")
        through, part_end = data.get("through", 0), data.get("part_end", 0)
        whole = type(through) is int and type(part_end) is int
        if not whole or through < 0 or not (part_end == 0 or part_end > through):
            raise ValueError(f"through {through!r} and part_end {part_end!r} are not a part's progress")
        changed, passing = data.get("changed", {}), data.get("passing", False)
        counts = isinstance(changed, dict) and all(
            isinstance(v, list) and len(v) == 2 and type(v[0]) is bool and type(v[1]) is int for v in changed.values()
        )
        if not counts:
            raise ValueError(f"changed is {changed!r}, not an object of [truncated, row-count change]")
        if type(passing) is not bool or (passing and not part_end):
            raise ValueError(f"passing is {passing!r} with part_end {part_end!r}: not a part being passed")
        return Intent(cycle_id, seqs, through, part_end, {t: (v[0], v[1]) for t, v in changed.items()}, passing)


_INTENT_KEYS = {"cycle_id", "seqs", "through", "part_end", "changed", "passing"}


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
        """The last committed checkpoint, or the starting one.

        Raises:
            StateFileError: the file cannot be read as a checkpoint (naming it and what to do).
        """
        loaded = _read_state(
            self.checkpoint_path,
            Checkpoint.from_json,
            "restore it from a backup, or move it aside: the next run then starts from the target's copy of "
            "the checkpoint, and refuses if the target keeps none",
        )
        return loaded if loaded is not None else Checkpoint()

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

    def replace(self, checkpoint: Checkpoint) -> Checkpoint:
        """Write ``checkpoint`` as it is, leaving the intent (a copy found newer, at the start of a run)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.checkpoint_path, checkpoint.to_json())
        return checkpoint

    def load_intent(self) -> Intent | None:
        """The intent of a cycle begun but not checkpointed, if any.

        Raises:
            StateFileError: the file cannot be read as an intent (naming it and what to do).
        """
        return _read_state(
            self.intent_path,
            Intent.from_json,
            "it names the pairs of the cycle after the checkpoint's, begun when a run stopped; restore it "
            "from a backup, or delete it only if no target table holds a cycle after the checkpoint's "
            "(applier status shows it): the next run then plans that cycle anew",
        )

    def drop_intent(self, cycle_id: int) -> None:
        """Forget the intent of cycle ``cycle_id`` if it recorded no progress: nothing of it reached the target."""
        intent = self.load_intent()
        if intent is not None and intent.cycle_id == cycle_id and (intent.through, intent.part_end) == (0, 0):
            self.intent_path.unlink(missing_ok=True)

    def save_intent(self, intent: Intent) -> None:
        """Record which pairs the next cycle takes, before the target is touched."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(self.intent_path, asdict(intent))


def _read_state(path: Path, parse: Callable[[Any], T], remedy: str) -> T | None:
    """The state file at ``path`` parsed (None when it is missing), or a StateFileError naming it and ``remedy``."""
    if not path.exists():
        return None
    try:
        return parse(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeError, ValueError) as e:
        raise StateFileError(path, _reason(e), remedy) from e


def _reason(error: Exception) -> str:
    """An error reading a state file, in a few words (no traceback, no file contents)."""
    if isinstance(error, json.JSONDecodeError):
        return f"not JSON: {error.msg} at line {error.lineno}, column {error.colno}"
    if isinstance(error, OSError):
        return error.strerror or type(error).__name__
    return str(error)
