"""The run ledger: which cycles each keyed Applier run applied, so a backfill can replay them.

A run given a *run key* (Airflow passes one per DAG run) records every cycle it
commits, with the checkpoint before and after it. Running the same key again
once its record is finished replays exactly those cycles
(:mod:`applier.engine.replay`); a record left running or failed (a crash, a
retry) is continued by a normal run under the same key.

Layout: one JSON file per run key, ``<work_dir>/ledger/<safe key>.json``,
replaced atomically like the checkpoint (write, fsync, rename). The safe key is
the key with every character outside ``[A-Za-z0-9_-]`` replaced by ``_`` (at
most 64 of them), ``-``, and 12 hex digits of the key's SHA-256, so no two keys
share a file and no key leaves the folder::

    {
      "run_key": "scheduled__2026-11-21T10:00:00+00:00",
      "status": "finished",          # running | finished | failed (the last attempt)
      "mode": "apply",               # apply | replay (the last attempt)
      "started_at": "2026-11-21T10:00:03.120000+00:00",   # the first attempt, UTC
      "finished_at": "2026-11-21T10:01:10.004000+00:00",  # the last attempt; null while running
      "attempts": 1,                 # attempts under this key (retries, replays)
      "error": null,                 # the failed attempt's message
      "pruned_pairs": [1, 2],        # pairs intermediate retention deleted after this run
      "definitions": {"<digest>": {"shop.orders": {"columns": [...], "primary_key": ["id"]}}},
      "cycles": [
        {"cycle_id": 4, "seqs": [7, 8], "committed_at": "2026-11-21T10:00:41.5+00:00",
         "before": {"cycle_id": 3, "applied_seq": 6, "applied_commit_lsn": 918, "restart_seq": 5,
                    "last_lsn": 940, "committed_at": "...", "row_counts": {...},
                    "table_cycles": {"shop.orders": 3}, "tables": "<digest>"},
         "after": {... the checkpoint written after the cycle ...},
         "net_rows": {"shop.orders": {"I": 3, "U": 1}},
         "tables": {"shop.orders": "applied"}}    # applied | skipped | reapplied | verified
      ]
    }

``before`` and ``after`` are whole checkpoints (:meth:`Checkpoint.to_json`)
except their table definitions, which rarely change: those are stored once in
``definitions`` under a digest of their JSON, and named by it. In memory
(:class:`LedgerCycle`) they are whole checkpoint dicts.

Intermediate retention (:func:`prune_intermediate`) lives here too: what it may
delete follows from the ledger.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from applier.engine.checkpoint import Checkpoint, write_atomically
from applier.engine.report import CycleReport
from applier.errors import TargetError, UsageError
from applier.intermediate.pairs import pair_name

RunStatus = Literal["running", "finished", "failed"]
RunMode = Literal["apply", "replay"]
TableOutcome = Literal["applied", "skipped", "reapplied", "verified"]
Clock = Callable[[], dt.datetime]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_KEY = 250


def utc_now() -> dt.datetime:
    """The default clock: now, in UTC."""
    return dt.datetime.now(dt.UTC)


def check_run_key(run_key: str) -> str:
    """``run_key`` if it can name a run: not blank, printable, at most 250 characters.

    Raises:
        UsageError: naming the key and what is allowed.
    """
    if not run_key.strip() or len(run_key) > _MAX_KEY or not run_key.isprintable():
        raise UsageError(f"run key {run_key!r} is not allowed; use 1 to {_MAX_KEY} printable characters")
    return run_key


def safe_file_name(run_key: str) -> str:
    """The ledger file name of ``run_key`` (see the module docstring)."""
    digest = hashlib.sha256(run_key.encode("utf-8")).hexdigest()[:12]
    return f"{_UNSAFE.sub('_', run_key)[:64]}-{digest}.json"


@dataclass
class LedgerCycle:
    """One committed cycle of a run, as recorded.

    Attributes:
        cycle_id: the cycle.
        seqs: the pairs it took.
        before: the checkpoint before it (``Checkpoint.to_json()``).
        after: the checkpoint it wrote.
        committed_at: when it was committed (ISO 8601, UTC).
        net_rows: table -> {operation: net rows}.
        tables: table -> what happened to it: ``applied`` or ``skipped`` (the
            table already held the cycle) by a run, ``reapplied`` or
            ``verified`` by the last replay.
    """

    cycle_id: int
    seqs: list[int]
    before: dict[str, Any]
    after: dict[str, Any]
    committed_at: str
    net_rows: dict[str, dict[str, int]] = field(default_factory=dict)
    tables: dict[str, TableOutcome] = field(default_factory=dict)

    @staticmethod
    def of(before: Checkpoint, after: Checkpoint, report: CycleReport) -> LedgerCycle:
        """The record of a cycle just committed (``after`` stamped with its commit time)."""
        skipped = set(report.skipped_tables)
        return LedgerCycle(
            cycle_id=after.cycle_id,
            seqs=list(report.seqs),
            before=before.to_json(),
            after=after.to_json(),
            committed_at=_stamp(after),
            net_rows={t: dict(ops) for t, ops in report.net_rows.items()},
            tables={t: "skipped" if t in skipped else "applied" for t in sorted(report.net_rows)},
        )

    def committed(self) -> dt.datetime:
        """``committed_at`` as a moment."""
        return dt.datetime.fromisoformat(self.committed_at)

    def before_checkpoint(self) -> Checkpoint:
        """The checkpoint a restart before this cycle would have loaded."""
        return Checkpoint.from_json(self.before)

    def replay_window(self) -> list[int]:
        """Every pair a replay of this cycle reads: the restart window before it, then its own."""
        window = range(int(self.before["restart_seq"]), int(self.before["applied_seq"]) + 1)
        return sorted({*window, *self.seqs})


@dataclass
class RunRecord:
    """The ledger's record of one run key (see the module docstring for the JSON)."""

    run_key: str
    status: RunStatus
    mode: RunMode
    started_at: str
    finished_at: str | None = None
    error: str | None = None
    cycles: list[LedgerCycle] = field(default_factory=list)
    attempts: int = 1
    pruned_pairs: list[int] = field(default_factory=list)

    @property
    def replays(self) -> bool:
        """Whether running this key again replays it: finished, or a replay already began."""
        return self.status == "finished" or self.mode == "replay"

    @property
    def pair_range(self) -> tuple[int, int] | None:
        """The first and last pair its cycles took; None without cycles."""
        seqs = [s for c in self.cycles for s in c.seqs]
        return (min(seqs), max(seqs)) if seqs else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        definitions: dict[str, Any] = {}
        for cycle in data["cycles"]:
            for side in ("before", "after"):
                tables = cycle[side].get("tables", {})
                digest = hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()[:16]
                definitions[digest] = tables
                cycle[side]["tables"] = digest
        data["definitions"] = definitions
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> RunRecord:
        definitions = data.get("definitions", {})

        def loaded(position: Mapping[str, Any]) -> dict[str, Any]:
            return {**position, "tables": definitions[position["tables"]]}

        cycles = [
            LedgerCycle(**{**c, "before": loaded(c["before"]), "after": loaded(c["after"])}) for c in data["cycles"]
        ]
        fields = {k: v for k, v in data.items() if k not in ("cycles", "definitions")}
        return RunRecord(**fields, cycles=cycles)


class RunLedger:
    """The run records of one configuration, in ``<work_dir>/ledger/``.

    Args:
        work_dir: ``<output_dir>/<configuration_name>``.
    """

    def __init__(self, work_dir: Path) -> None:
        self.directory = work_dir / "ledger"

    def path(self, run_key: str) -> Path:
        """The file of ``run_key``'s record."""
        return self.directory / safe_file_name(run_key)

    def get(self, run_key: str) -> RunRecord | None:
        """The record of ``run_key``, or None.

        Raises:
            TargetError: the record's file cannot be read (naming it).
        """
        path = self.path(run_key)
        return _read(path) if path.exists() else None

    def records(self, written_after: dt.datetime | None = None) -> list[RunRecord]:
        """The records, in the order the runs first started.

        Args:
            written_after: only records whose file was written after this moment
                (the others hold no cycle committed after it); None: all.
        """
        paths = sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []
        if written_after is not None:
            paths = [p for p in paths if dt.datetime.fromtimestamp(p.stat().st_mtime, dt.UTC) > written_after]
        return sorted((_read(p) for p in paths), key=lambda r: (r.started_at, r.run_key))

    def save(self, record: RunRecord) -> None:
        """Write ``record`` atomically."""
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path(record.run_key), record.to_json())

    def begin(self, run_key: str, mode: RunMode, now: dt.datetime) -> RunRecord:
        """Start an attempt under ``run_key``: a new record, or the existing one continued.

        Args:
            run_key: the run's key.
            mode: what this attempt does.
            now: the attempt's start.

        Returns:
            The record, saved with status ``running``.
        """
        check_run_key(run_key)
        record = self.get(run_key)
        if record is None:
            record = RunRecord(run_key=run_key, status="running", mode=mode, started_at=now.isoformat(), attempts=0)
        record.status, record.mode, record.error, record.finished_at = "running", mode, None, None
        record.attempts += 1
        self.save(record)
        return record

    def end(self, record: RunRecord, now: dt.datetime, error: BaseException | None = None) -> None:
        """Close the attempt: ``finished``, or ``failed`` with the error's message."""
        record.status = "finished" if error is None else "failed"
        record.error = None if error is None else f"{type(error).__name__}: {error}"
        record.finished_at = now.isoformat()
        self.save(record)

    def keys_holding(self, first_cycle: int, last_cycle: int) -> list[str]:
        """The run keys, in start order, whose cycles include one of ``first_cycle..last_cycle``."""
        return [r.run_key for r in self.records() if any(first_cycle <= c.cycle_id <= last_cycle for c in r.cycles)]


class RunJournal:
    """One keyed run's record, saved to the ledger as each cycle is committed.

    Args:
        ledger: where the record is saved.
        record: the run's record (from :meth:`RunLedger.begin`).
    """

    def __init__(self, ledger: RunLedger, record: RunRecord) -> None:
        self.ledger = ledger
        self.record = record

    def forget_after(self, cycle_id: int) -> None:
        """Drop recorded cycles past the checkpoint: a crash came before their checkpoint, they run again."""
        kept = [c for c in self.record.cycles if c.cycle_id <= cycle_id]
        if len(kept) != len(self.record.cycles):
            self.record.cycles = kept
            self.ledger.save(self.record)

    def add(self, cycle: LedgerCycle) -> None:
        """Record a cycle, durably, before its checkpoint is written."""
        self.record.cycles.append(cycle)
        self.ledger.save(self.record)


def _stamp(checkpoint: Checkpoint) -> str:
    if not checkpoint.committed_at:
        raise ValueError(f"cycle {checkpoint.cycle_id}: the checkpoint to record carries no commit time")
    return checkpoint.committed_at


def _read(path: Path) -> RunRecord:
    try:
        return RunRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TargetError(f"run ledger record {path} cannot be read: {e}") from e


# Intermediate retention.


def protected_pairs(records: Iterable[RunRecord], cutoff: dt.datetime) -> set[int]:
    """The pairs a replay may still need: those (restart windows included) of cycles committed after ``cutoff``."""
    return {seq for r in records for c in r.cycles if c.committed() > cutoff for seq in c.replay_window()}


def prunable_pairs(
    present: Mapping[int, dt.datetime],
    checkpoint: Checkpoint,
    records: Iterable[RunRecord],
    cutoff: dt.datetime,
) -> list[int]:
    """The pairs retention deletes: applied, before ``restart_seq``, written and applied before ``cutoff``.

    A pair is written before the cycle that takes it commits, so a pair written
    after ``cutoff`` belongs to no cycle committed before it (runs without a
    run key record no cycle; their pairs go by this rule alone).

    Args:
        present: seq -> when the pair's files were written, for the pairs on disk.
        checkpoint: the Applier's position; nothing from ``restart_seq`` on is
            touched (a restart, or the cycle of an intent, needs it).
        records: the ledger's records (those written after ``cutoff`` suffice).
        cutoff: the pairs of cycles committed after it, restart windows
            included, are kept for a replay.

    Returns:
        The sequence numbers, ascending.
    """
    protected = protected_pairs(records, cutoff)
    limit = min(checkpoint.restart_seq, checkpoint.applied_seq + 1)
    return sorted(seq for seq, written in present.items() if seq < limit and written <= cutoff and seq not in protected)


def prune_intermediate(
    directory: Path, checkpoint: Checkpoint, records: Iterable[RunRecord], keep_hours: float, now: dt.datetime
) -> list[int]:
    """Delete the pairs :func:`prunable_pairs` allows (``.trn`` first, so none looks complete half-deleted).

    Args:
        directory: the intermediate directory.
        checkpoint: the Applier's position.
        records: the ledger's records written in the last ``keep_hours``, or more.
        keep_hours: ``apply.intermediate_retention_hours``.
        now: the clock's time.

    Returns:
        The deleted pairs' sequence numbers.
    """
    present: dict[int, dt.datetime] = {}
    for path in directory.glob("[0-9]*.*") if directory.is_dir() else []:
        stem, _, suffix = path.name.partition(".")
        if suffix in ("dat", "trn") and len(stem) == 12 and stem.isdigit():
            written = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
            present[int(stem)] = max(written, present.get(int(stem), written))
    pruned = prunable_pairs(present, checkpoint, records, now - dt.timedelta(hours=keep_hours))
    for seq in pruned:
        for suffix in ("trn", "dat"):
            (directory / f"{pair_name(seq)}.{suffix}").unlink(missing_ok=True)
    return pruned


def describe_seqs(seqs: Iterable[int]) -> str:
    """``1..4, 7`` for people."""
    ranges: list[list[int]] = []
    for seq in sorted(seqs):
        if ranges and seq == ranges[-1][1] + 1:
            ranges[-1][1] = seq
        else:
            ranges.append([seq, seq])
    return ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in ranges) or "none"
