"""The cycles of a run-ledger record, as stored: one JSON line per cycle, table definitions once.

A record's cycles live in ``<ledger>/<safe key>.cycles.jsonl`` beside its header
file (:mod:`applier.engine.ledger`). A run appends one line per committed cycle,
so what a cycle costs to record does not depend on how many came before it,
and nothing holds a run's cycles in memory: :class:`CycleLog` reads them from
the file each time they are walked. A line is a :class:`LedgerCycle` whose
``before`` and ``after`` checkpoints name their table definitions by digest::

    {"cycle_id": 4, "seqs": [7, 8], "committed_at": "2026-11-21T10:00:41.5+00:00",
     "before": {"cycle_id": 3, "applied_seq": 6, ..., "tables": "<digest>"},
     "after": {..., "tables": "<digest>"},
     "net_rows": {"shop.orders": {"I": 3, "U": 1}}, "tables": {"shop.orders": "applied"}}

The definitions (every table's columns and key, large with hundreds of tables,
and rarely changing) are stored once per distinct content in
``<ledger>/definitions/<digest>.json``, the digest being the first 16 hex
digits of the SHA-256 of their JSON with sorted keys.
"""

from __future__ import annotations

import collections
import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, overload

from applier.engine.checkpoint import Checkpoint, write_atomically
from applier.engine.jsonlines import append_line, count_lines, is_torn, last_lines, read_lines, replace_lines
from applier.engine.report import CycleReport, set_aside_counts
from applier.errors import StateFileError

TableOutcome = Literal["applied", "skipped", "reapplied", "verified"]

# How many recent cycles a run's summary keeps (and how many definitions a reader caches).
RECENT_CYCLES = 100
_CACHED_DEFINITIONS = 8


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
        set_aside: error action -> transactions it let by in the cycle (``log``, ``warn``, ...).
    """

    cycle_id: int
    seqs: list[int]
    before: dict[str, Any]
    after: dict[str, Any]
    committed_at: str
    net_rows: dict[str, dict[str, int]] = field(default_factory=dict)
    tables: dict[str, TableOutcome] = field(default_factory=dict)
    set_aside: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def of(before: Checkpoint, after: Checkpoint, report: CycleReport) -> LedgerCycle:
        """The record of a cycle just committed (``after`` stamped with its commit time)."""
        if not after.committed_at:
            raise ValueError(f"cycle {after.cycle_id}: the checkpoint to record carries no commit time")
        skipped = set(report.skipped_tables)
        return LedgerCycle(
            cycle_id=after.cycle_id,
            seqs=list(report.seqs),
            before=before.to_json(),
            after=after.to_json(),
            committed_at=after.committed_at,
            net_rows={t: dict(ops) for t, ops in report.net_rows.items()},
            tables={t: "skipped" if t in skipped else "applied" for t in sorted(report.net_rows)},
            set_aside=set_aside_counts([{"exceptions": report.exceptions}]),
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

    def to_line(self, definitions: Definitions) -> dict[str, Any]:
        """The stored form: the definitions of ``before`` and ``after`` put in ``definitions``, named by digest."""
        # Shallow copies: a deep copy of hundreds of table definitions per cycle costs more than the rest.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        for side in ("before", "after"):
            data[side] = {**data[side], "tables": definitions.put(data[side].get("tables", {}))}
        return data

    @staticmethod
    def from_line(data: Mapping[str, Any], definitions: Mapping[str, Any] | Definitions) -> LedgerCycle:
        """A cycle from its stored form, its definitions looked up by digest."""

        def loaded(position: Mapping[str, Any]) -> dict[str, Any]:
            return {**position, "tables": definitions[position["tables"]]}

        return LedgerCycle(**{**data, "before": loaded(data["before"]), "after": loaded(data["after"])})


def definitions_digest(tables: Mapping[str, Any]) -> str:
    """The name of a set of table definitions: 16 hex digits of the SHA-256 of their sorted JSON."""
    return hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()[:16]


class Definitions:
    """Table definitions stored once each, named by their digest: ``<directory>/<digest>.json``.

    Args:
        directory: ``<ledger>/definitions``.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._stored: set[str] = set()  # digests known to be on disk (one per schema version)
        self._last: tuple[Mapping[str, Any], str] | None = None
        self._cache: dict[str, Any] = {}

    def put(self, tables: Mapping[str, Any]) -> str:
        """Store ``tables`` unless stored already; return their digest.

        The definitions of consecutive cycles are usually equal, so they are
        compared with the last ones before being hashed.
        """
        if self._last is not None and self._last[0] == tables:
            return self._last[1]
        digest = definitions_digest(tables)
        if digest not in self._stored:
            path = self.directory / f"{digest}.json"
            if not path.exists():
                self.directory.mkdir(parents=True, exist_ok=True)
                write_atomically(path, dict(tables))
            self._stored.add(digest)
        self._last = (tables, digest)
        return digest

    def __getitem__(self, digest: str) -> Any:
        """The definitions named ``digest``.

        Raises:
            KeyError: none are stored under that name.
        """
        if digest not in self._cache:
            path = self.directory / f"{digest}.json"
            if not path.is_file():
                raise KeyError(f"table definitions {digest} ({path} is missing)")
            if len(self._cache) >= _CACHED_DEFINITIONS:
                self._cache.clear()
            self._cache[digest] = json.loads(path.read_text(encoding="utf-8"))
        return self._cache[digest]


LEDGER_CYCLES_REMEDY = (
    "restore it from a backup, or move it and its record aside: the run key then starts a new record, "
    "and a backfill can no longer replay that run's cycles"
)


class CycleLog(Sequence[LedgerCycle]):
    """A record's cycles in their file, read from it whenever they are walked.

    Walking, ``len`` and indexing read the file (from its end for :meth:`last`);
    nothing is kept in memory between walks.

    Args:
        path: ``<ledger>/<safe key>.cycles.jsonl``.
        definitions: where the checkpoints' table definitions are stored.
    """

    def __init__(self, path: Path, definitions: Definitions) -> None:
        self.path = path
        self.definitions = definitions

    def __iter__(self) -> Iterator[LedgerCycle]:
        try:
            for data in read_lines(self.path):
                yield LedgerCycle.from_line(data, self.definitions)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StateFileError(self.path, f"run ledger cycles that cannot be read: {e}", LEDGER_CYCLES_REMEDY) from e

    def __len__(self) -> int:
        return count_lines(self.path)

    @overload
    def __getitem__(self, index: int) -> LedgerCycle: ...

    @overload
    def __getitem__(self, index: slice) -> list[LedgerCycle]: ...

    def __getitem__(self, index: int | slice) -> LedgerCycle | list[LedgerCycle]:
        if isinstance(index, slice):
            return list(self)[index]
        wanted = index + len(self) if index < 0 else index
        for position, cycle in enumerate(self):
            if position == wanted:
                return cycle
        raise IndexError(f"cycle index {index} out of range")

    def last(self, n: int) -> list[LedgerCycle]:
        """The last ``n`` cycles, oldest first, read from the end of the file."""
        try:
            return [LedgerCycle.from_line(data, self.definitions) for data in last_lines(self.path, n)]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StateFileError(self.path, f"run ledger cycles that cannot be read: {e}", LEDGER_CYCLES_REMEDY) from e

    def torn(self) -> bool:
        """Whether the file ends with a cycle whose append was cut short (a crash)."""
        return is_torn(self.path)

    def append(self, cycle: LedgerCycle) -> int:
        """Record ``cycle`` durably at the end; return the bytes appended (definitions aside)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return append_line(self.path, cycle.to_line(self.definitions))

    def replace(self, cycles: Iterable[LedgerCycle]) -> None:
        """Replace every recorded cycle with ``cycles`` (which may be read from this log), atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_lines(self.path, (cycle.to_line(self.definitions) for cycle in cycles))


class CycleTally:
    """The last :data:`RECENT_CYCLES` cycles of many, their count and their table outcomes.

    What a run's summary keeps of its cycles: bounded however long the run.
    """

    def __init__(self, keep: int = RECENT_CYCLES) -> None:
        self.recent: collections.deque[LedgerCycle] = collections.deque(maxlen=keep)
        self.count = 0
        self.outcomes: collections.Counter[str] = collections.Counter()

    def append(self, cycle: LedgerCycle) -> None:
        """Count ``cycle`` and keep it among the recent ones."""
        self.recent.append(cycle)
        self.count += 1
        self.outcomes.update(cycle.tables.values())

    @staticmethod
    def of(cycles: Iterable[LedgerCycle], keep: int = RECENT_CYCLES) -> CycleTally:
        """The tally of ``cycles``, walked once."""
        tally = CycleTally(keep)
        for cycle in cycles:
            tally.append(cycle)
        return tally
