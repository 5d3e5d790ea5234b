"""One queue-memory budget for everything the Applier holds in memory (Informix ER's ``CDR_QUEUEMEM``).

Three kinds of holdings share the budget ``apply.queue_memory_mb``:

- ``transactions``: rows of open transactions (:mod:`applier.engine.buffers`);
- ``tables``: compiled net changes of tables waiting for their turn to be
  applied (a Delta commit or a PostgreSQL load connection;
  :mod:`applier.engine.compiled`);
- ``compiled``: the net changes of the tables being applied right now.

As in ER's receive queue, a holder spools a buffer to disk on its own rules (a
transaction above half the queue memory, or above
``apply.buffer_size_for_split_records``), and when the total reaches the budget
the largest buffers spool first, whatever their kind, until the total is under
it. Rows being applied (``compiled``) cannot spool; they count all the same.

The queue keeps the figures of each cycle for the cycle report: the budget,
the peak held, what is held at the end by kind, and what spooled.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

KINDS = ("transactions", "tables", "compiled")


class Spooler(Protocol):
    """A holder of buffers that can move a buffer from memory to a spill file."""

    def spool_candidates(self) -> Iterable[tuple[int, str]]:
        """``(bytes in memory, name)`` of each buffer that could spool."""
        ...

    def spool(self, name: str) -> None:
        """Move the buffer ``name`` to its spill file; it must release its bytes from the queue."""
        ...


@dataclass
class Spooled:
    """A buffer that spooled: its kind, name (xid or table), spill file and bytes moved out of memory."""

    kind: str
    name: str
    file: str
    bytes: int


@dataclass
class _CycleFigures:
    peak: int = 0
    spooled_bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    spooled: list[Spooled] = field(default_factory=list)


class MemoryQueue:
    """The budget, what each kind holds, and who can spool.

    Not thread-safe for spooling: the driver's main thread adds to the buffers;
    target threads only charge and release ``compiled`` bytes (a lock guards the counters).

    Args:
        budget: bytes the Applier may hold in memory (``Config.queue_memory_bytes``).
    """

    def __init__(self, budget: int) -> None:
        if budget < 1:
            raise ValueError(f"the queue memory budget must be at least 1 byte, got {budget}")
        self.budget = budget
        self._held = dict.fromkeys(KINDS, 0)
        self._spoolers: list[Spooler] = []
        self._cycle = _CycleFigures()
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes held in memory now, every kind."""
        return sum(self._held.values())

    def held_by_kind(self) -> dict[str, int]:
        return dict(self._held)

    def register(self, spooler: Spooler) -> None:
        """Let ``spooler``'s buffers be spooled when the budget is reached."""
        self._spoolers.append(spooler)

    def unregister(self, spooler: Spooler) -> None:
        # By identity: a spooler may be a Mapping, whose == would compare (and so read) every table it holds.
        self._spoolers = [s for s in self._spoolers if s is not spooler]

    def charge(self, kind: str, nbytes: int) -> None:
        """Count ``nbytes`` more held of ``kind`` (call :meth:`make_room` after adding).

        The peak counts what is held once room is made: a batch being added
        above the budget spools at once and is not held.
        """
        with self._lock:
            self._held[kind] += nbytes
            if self.held <= self.budget or kind == "compiled":
                self._cycle.peak = max(self._cycle.peak, self.held)

    def release(self, kind: str, nbytes: int) -> None:
        """Count ``nbytes`` of ``kind`` no longer held."""
        with self._lock:
            self._held[kind] -= nbytes

    def note_spooled(self, kind: str, name: str, file: str, nbytes: int) -> None:
        """Record that a buffer of ``kind`` moved ``nbytes`` from memory to ``file``."""
        self._cycle.spooled_bytes[kind] += nbytes
        self._cycle.spooled.append(Spooled(kind, name, file, nbytes))

    def make_room(self) -> None:
        """Spool the largest buffers, of any spooler, until the total is within the budget."""
        if self.held <= self.budget:
            return
        candidates = sorted(
            ((size, i, name) for i, s in enumerate(self._spoolers) for size, name in s.spool_candidates() if size > 0),
            reverse=True,
        )
        for _, i, name in candidates:
            if self.held <= self.budget:
                break
            self._spoolers[i].spool(name)
        self._cycle.peak = max(self._cycle.peak, self.held)

    def cycle_figures(self, *, reset: bool = False) -> dict[str, Any]:
        """The figures since the last reset, for a cycle's report (``queue`` in ``cycles.jsonl``).

        Args:
            reset: start the next cycle's figures (its peak from what is held
                now); what happens between two cycles (the restart's rebuild)
                counts in the next one.
        """
        figures = {
            "budget_bytes": self.budget,
            "peak_bytes": self._cycle.peak,
            "memory_bytes": self.held_by_kind(),
            "spooled_bytes": dict(self._cycle.spooled_bytes),
            "spooled": [vars(s) for s in self._cycle.spooled],
        }
        if reset:
            self._cycle = _CycleFigures(peak=self.held)
        return figures
