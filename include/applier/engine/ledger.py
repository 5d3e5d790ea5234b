"""The run ledger: which cycles each keyed Applier run applied, so a backfill can replay them.

A run given a *run key* (Airflow passes one per DAG run) records every cycle it
commits, with the checkpoint before and after it. Running the same key again
once its record is finished replays exactly those cycles
(:mod:`applier.engine.replay`); a record left running or failed (a crash, a
retry) is continued by a normal run under the same key.

Layout, in ``<work_dir>/ledger/``, per run key: a header ``<safe key>.json``,
replaced atomically like the checkpoint (write, fsync, rename) when an attempt
begins and ends, and its cycles, one JSON line each appended as they commit
(:mod:`applier.engine.ledger_cycles`), in ``<safe key>.cycles.jsonl``; table
definitions are stored once in ``definitions/``. Recording a cycle appends one
line, whatever the run's length. The safe key is the key with every character
outside ``[A-Za-z0-9_-]`` replaced by ``_`` (at most 64 of them), ``-``, and 12
hex digits of the key's SHA-256, so no two keys share a file and no key leaves
the folder. The header::

    {
      "run_key": "scheduled__2026-11-21T10:00:00+00:00",
      "status": "finished",          # running | finished | failed (the last attempt)
      "mode": "apply",               # apply | replay (the last attempt)
      "started_at": "2026-11-21T10:00:03.120000+00:00",   # the first attempt, UTC
      "finished_at": "2026-11-21T10:01:10.004000+00:00",  # the last attempt; null while running
      "attempts": 1,                 # attempts under this key (retries, replays)
      "error": null,                 # the failed attempt's message
      "pruned_pairs": [1, 2],        # pairs intermediate retention deleted after this run
      "cycles_file": "<safe key>.cycles.jsonl"
    }

Records written before (one file holding ``cycles`` and ``definitions``) are
still read, and take this layout when their key runs again.

Intermediate retention (:func:`prune_intermediate`) lives here too: what it may
delete follows from the ledger. Records are read once per run (retention, a
replay, the refusal of a restored target), never per cycle, and their cycles
are streamed from their files.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from applier.engine.checkpoint import Checkpoint, write_atomically
from applier.engine.ledger_cycles import CycleLog, CycleTally, Definitions
from applier.engine.ledger_cycles import LedgerCycle as LedgerCycle
from applier.engine.ledger_cycles import TableOutcome as TableOutcome
from applier.errors import StateFileError, UsageError
from applier.intermediate.pairs import pair_name

RunStatus = Literal["running", "finished", "failed"]
RunMode = Literal["apply", "replay"]
Clock = Callable[[], dt.datetime]

CYCLES_SUFFIX = ".cycles.jsonl"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MAX_KEY = 250


# What to do with a damaged ledger file: the ledger serves replays, not the positions.
LEDGER_REMEDY = (
    "restore it from a backup, or move it aside: the run key then starts a new record, and a backfill "
    "can no longer replay that run's cycles"
)


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
class RunRecord:
    """The ledger's record of one run key (see the module docstring for the files).

    ``cycles`` is, for a record read from the ledger, its :class:`CycleLog`
    (read from the file when walked); a record built in memory holds a list.
    """

    run_key: str
    status: RunStatus
    mode: RunMode
    started_at: str
    finished_at: str | None = None
    error: str | None = None
    cycles: Sequence[LedgerCycle] = field(default_factory=list)
    attempts: int = 1
    pruned_pairs: list[int] = field(default_factory=list)

    @property
    def replays(self) -> bool:
        """Whether running this key again replays it: finished, or a replay already began."""
        return self.status == "finished" or self.mode == "replay"

    @property
    def pair_range(self) -> tuple[int, int] | None:
        """The first and last pair its cycles took; None without cycles."""
        low = high = None
        for cycle in self.cycles:
            if cycle.seqs:
                low = min(cycle.seqs) if low is None else min(low, *cycle.seqs)
                high = max(cycle.seqs) if high is None else max(high, *cycle.seqs)
        return (low, high) if low is not None and high is not None else None

    def to_json(self) -> dict[str, Any]:
        """The header: every field but the cycles, and the name of the cycles' file."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "cycles"}
        data["pruned_pairs"] = list(self.pruned_pairs)
        return {**data, "cycles_file": safe_file_name(self.run_key).removesuffix(".json") + CYCLES_SUFFIX}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> RunRecord:
        """A record from its header, or from a whole record of the one-file layout (with its cycles)."""
        header = {k: v for k, v in data.items() if k not in ("cycles", "definitions", "cycles_file")}
        definitions = data.get("definitions", {})
        cycles = [LedgerCycle.from_line(c, definitions) for c in data.get("cycles", [])]
        return RunRecord(**header, cycles=cycles)


class RunLedger:
    """The run records of one configuration, in ``<work_dir>/ledger/``.

    Args:
        work_dir: ``<output_dir>/<configuration_name>``.
    """

    def __init__(self, work_dir: Path) -> None:
        self.directory = work_dir / "ledger"
        self.definitions = Definitions(self.directory / "definitions")

    def path(self, run_key: str) -> Path:
        """The header file of ``run_key``'s record."""
        return self.directory / safe_file_name(run_key)

    def cycle_log(self, run_key: str) -> CycleLog:
        """The cycles of ``run_key``'s record, in ``<safe key>.cycles.jsonl``."""
        return CycleLog(self.path(run_key).with_suffix(CYCLES_SUFFIX), self.definitions)

    def get(self, run_key: str) -> RunRecord | None:
        """The record of ``run_key``, or None.

        Raises:
            StateFileError: the record's file cannot be read (naming it).
        """
        path = self.path(run_key)
        return self._read(path) if path.exists() else None

    def records(self, written_after: dt.datetime | None = None) -> list[RunRecord]:
        """The records, in the order the runs first started (their cycles are read when walked).

        Args:
            written_after: only records whose files were written after this
                moment (the others hold no cycle committed after it); None: all.
        """
        paths = sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []
        if written_after is not None:
            paths = [p for p in paths if _written(p) > written_after]
        return sorted((self._read(p) for p in paths), key=lambda r: (r.started_at, r.run_key))

    def save(self, record: RunRecord) -> None:
        """Write ``record`` atomically: its header, and its cycles unless they are read from its file.

        The cycles are written before the header, so a crash in between leaves
        a record of the one-file layout still read whole from its header.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        log = self.cycle_log(record.run_key)
        if not (isinstance(record.cycles, CycleLog) and record.cycles.path == log.path):
            log.replace(record.cycles)
        write_atomically(self.path(record.run_key), record.to_json())

    def begin(self, run_key: str, mode: RunMode, now: dt.datetime) -> RunRecord:
        """Start an attempt under ``run_key``: a new record, or the existing one continued.

        Args:
            run_key: the run's key.
            mode: what this attempt does.
            now: the attempt's start.

        Returns:
            The record, saved with status ``running``, its cycles read from its file.
        """
        check_run_key(run_key)
        record = self.get(run_key)
        if record is None:
            record = RunRecord(run_key=run_key, status="running", mode=mode, started_at=now.isoformat(), attempts=0)
        record.status, record.mode, record.error, record.finished_at = "running", mode, None, None
        record.attempts += 1
        self.save(record)
        record.cycles = self.cycle_log(run_key)
        return record

    def end(self, record: RunRecord, now: dt.datetime, error: BaseException | None = None) -> None:
        """Close the attempt: ``finished``, or ``failed`` with the error's message."""
        record.status = "finished" if error is None else "failed"
        record.error = None if error is None else f"{type(error).__name__}: {error}"
        record.finished_at = now.isoformat()
        self.save(record)

    def set_outcomes(self, record: RunRecord, plans: Iterable[Mapping[str, TableOutcome]]) -> CycleTally:
        """Replace the table outcomes of ``record``'s cycles with ``plans`` (a replay's), in one rewrite.

        Returns:
            The tally of the cycles as now recorded.

        Raises:
            ValueError: ``plans`` are not one per cycle.
        """
        tally = CycleTally()

        def updated() -> Iterable[LedgerCycle]:
            for cycle, plan in zip(record.cycles, plans, strict=True):
                cycle.tables = dict(plan)
                tally.append(cycle)
                yield cycle

        self.cycle_log(record.run_key).replace(updated())
        record.cycles = self.cycle_log(record.run_key)
        return tally

    def keys_holding(self, first_cycle: int, last_cycle: int) -> list[str]:
        """The run keys, in start order, whose cycles include one of ``first_cycle..last_cycle``."""
        return [r.run_key for r in self.records() if any(first_cycle <= c.cycle_id <= last_cycle for c in r.cycles)]

    def _read(self, path: Path) -> RunRecord:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            record = RunRecord.from_json(data)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise StateFileError(path, f"a run ledger record that cannot be read: {e}", LEDGER_REMEDY) from e
        if "cycles" not in data:  # the one-file layout holds its cycles; this one reads them from their file
            record.cycles = self.cycle_log(record.run_key)
        return record


class RunJournal:
    """One keyed run's record, to which each cycle is appended as it is committed.

    Holds no cycle in memory: recording a cycle appends one line to the
    record's cycles file.

    Args:
        ledger: where the record is kept.
        record: the run's record (from :meth:`RunLedger.begin`).
    """

    def __init__(self, ledger: RunLedger, record: RunRecord) -> None:
        self.ledger = ledger
        self.record = record
        self.log = ledger.cycle_log(record.run_key)

    def forget_after(self, cycle_id: int) -> None:
        """Drop recorded cycles past the checkpoint: a crash came before their checkpoint, they run again.

        Cycles are appended in order, so only the last one is looked at unless
        the file must be rewritten (at most once, at a run's start); a line
        whose append a crash cut short is dropped too.
        """
        last = self.log.last(1)
        if self.log.torn() or (last and last[0].cycle_id > cycle_id):
            self.log.replace(c for c in self.log if c.cycle_id <= cycle_id)

    def add(self, cycle: LedgerCycle) -> int:
        """Record a cycle, durably, before its checkpoint is written.

        Returns:
            The bytes appended to the record's cycles file.
        """
        return self.log.append(cycle)


def _written(path: Path) -> dt.datetime:
    """When a record was last written: its header or its cycles file, whichever is newer."""
    cycles = path.with_suffix(CYCLES_SUFFIX)
    mtime = max(path.stat().st_mtime, cycles.stat().st_mtime if cycles.exists() else 0.0)
    return dt.datetime.fromtimestamp(mtime, dt.UTC)


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

    Never the newest pair: a writer resuming (``applier extract``) reads its
    position from it. A pair is written before the cycle that takes it commits, so a pair written
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
    # The newest pair stays: a writer resuming (applier extract) reads its position from it.
    limit = min(checkpoint.restart_seq, checkpoint.applied_seq + 1, max(present, default=0))
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
