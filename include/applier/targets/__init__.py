"""Targets: where net changes land, behind one small interface.

Everything that differs between targets sits behind :class:`Target`; the
engine never asks which target it is talking to. :func:`open_target` is the one
place that turns the configuration into a target; what differs per target type
before there is a target (settings, opening, reading for validation, asset
URIs, connections) is its dialect's (:mod:`applier.targets.dialects`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from applier.errors import TargetError

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.config import Config
    from applier.engine.changes import TableChanges
    from applier.intermediate.schema import TableDef


@dataclass(frozen=True)
class Part:
    """A unit of a cycle smaller than the cycle: its committed transactions ``[start, end)`` of ``total``.

    Transactions are numbered in commit order. A target that applied a part
    holds the cycle *through* ``end``; a re-run skips a part whose ``end`` the
    target already holds, so a cycle applied group by group (after a failing
    group was split, :mod:`applier.engine.units`) stays exactly-once. The
    part with ``end == total`` completes the cycle.
    """

    start: int
    end: int
    total: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end <= self.total:
            raise ValueError(f"a part is 0 <= start < end <= total, not {self.start}, {self.end}, {self.total}")

    @property
    def final(self) -> bool:
        """Whether applying this part completes the cycle."""
        return self.end == self.total


def holds_part(cycle: int, through: int | None, cycle_id: int, part: Part | None) -> bool:
    """Whether a target holding ``cycle`` holds ``part`` of cycle ``cycle_id``.

    ``through``: how many of ``cycle``'s transactions it holds (None: all of
    them); ``part`` None is the whole cycle.

    Raises:
        TargetError: the target holds a part of the cycle and the whole cycle
            is being applied to it: the engine lost track of the cycle's parts.
    """
    if cycle != cycle_id:
        return cycle > cycle_id
    if through is None:
        return True
    if part is None:
        raise TargetError(
            f"cycle {cycle_id} is applied whole, but the target holds only its first {through} transactions; "
            "the intent file that recorded its parts is missing"
        )
    return through >= part.end


LOGGED_ACTIONS = frozenset({"log", "retry_log"})
"""The error actions that keep a refused transaction in the target's exceptions store."""


@dataclass(frozen=True)
class PassedTransaction:
    """A source transaction the target refused, which its error action lets by (it is not applied).

    Attributes:
        cycle_id: the cycle it committed in.
        xid: the transaction; ``commit_lsn`` its commit, ``pair_seq`` the pair holding that commit.
        error_class: the refusal's class (:data:`~applier.errors.ERROR_CLASSES`).
        code: the target's code for it (a SQLSTATE), when known.
        table: the table that refused it, when known.
        message: the target's error.
        action: the error action that let it by (``log`` and ``retry_log`` keep it in the exceptions store).
        changes: its rows as the pairs hold them (``lsn, xid, table, op, before, after``), when it is kept.
    """

    cycle_id: int
    xid: str
    commit_lsn: int
    pair_seq: int
    error_class: str
    code: str | None
    table: str | None
    message: str
    action: str
    changes: pa.Table | None = None

    @property
    def logged(self) -> bool:
        """Whether it goes to the exceptions store."""
        return self.action in LOGGED_ACTIONS


@dataclass
class CycleLoad:
    """What applying one cycle to a target did, for the cycle report.

    Attributes:
        skipped_tables: tables that already held the cycle (a re-run after a crash).
        batches: the tables loaded together, batch by batch (targets with load connections).
        spill_created: table spill files written while waiting for a load connection
            (``{"file": name, "bytes": size}``).
        spill_removed: the same files, removed once the cycle committed.
        table_seconds: per table, seconds per step.
        seconds: seconds per step of the whole cycle.
        held: per table, the cycle its state holds after the apply, where the
            target knows it without reading again (the engine asks
            ``committed_cycles`` for the others).
        collisions: per table, the collisions counted per kind
            (:mod:`~applier.targets.collisions`).
        statements: a transaction applied in log order: per table, its statements per op.
    """

    skipped_tables: list[str] = field(default_factory=list)
    batches: list[list[str]] = field(default_factory=list)
    spill_created: list[dict[str, Any]] = field(default_factory=list)
    spill_removed: list[dict[str, Any]] = field(default_factory=list)
    table_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    collisions: dict[str, dict[str, int]] = field(default_factory=dict)
    statements: dict[str, dict[str, int]] = field(default_factory=dict)


class Target(Protocol):
    """Applies a cycle's net changes, exactly once, tagged with the cycle.

    How a cycle commits is the target's: the Delta target commits each table
    on its own (tagged, so a re-run skips tables that hold the cycle); the
    PostgreSQL target commits all tables and its checkpoint row at once.

    Attributes:
        atomic_cycles: whether a cycle's (or part's) commit is all or nothing
            across its tables: only then is a refused group split to find the
            failing transaction (:mod:`applier.engine.units`).
        log_order: whether it applies a transaction statement by statement
            (:meth:`apply_log_order`); a target that does not applies a
            log-order transaction's net change as a part of its own, which
            leaves the same rows (it cannot then tell an update that found no
            row from an insert).
    """

    atomic_cycles: bool
    log_order: bool

    def committed_cycle(self, table: str) -> int:
        """The cycle ``table``'s current state holds; 0 when it is missing or was never written.

        After the table was restored to an earlier state (a backup, a Delta
        RESTORE), the cycle of that state: restore detection and replays rely on it.
        """
        ...

    def autocorrect(self, tables: frozenset[str]) -> None:
        """From now on, ``tables``' collisions are a materialization's: neither counted nor refused."""
        ...

    def use_spark(self, spark: Any) -> None:
        """The run's Spark session, for a target that commits large cycles on executors (Delta); others ignore it."""
        ...

    def committed_cycles(self, tables: Iterable[str]) -> dict[str, int]:
        """:meth:`committed_cycle` of each of ``tables``, in as few reads as the target allows.

        The engine asks this after every cycle and before every run, so a
        target that keeps one position for all tables answers with one read.
        """
        ...

    def highest_cycle(self, tables: Iterable[str]) -> int:
        """The newest cycle any of ``tables`` holds; with none named, any table of the configuration.

        A run compares it with its checkpoint at start, so that a checkpoint
        that was lost or went back never makes it skip pairs.
        """
        ...

    def check_tables(self, tables: Mapping[str, TableDef]) -> None:
        """Refuse target tables changed so that applying to them could lose data (drift), at the start of a run.

        ``tables``: the definitions the checkpoint holds. A table missing from
        the target is no drift (it is created when next touched).

        Raises:
            TargetError: naming the table, the column, the expected and the found type.
        """
        ...

    def saved_checkpoint(self) -> dict[str, Any] | None:
        """The copy of the Applier's checkpoint the target keeps (:meth:`save_checkpoint`), or None."""
        ...

    def save_checkpoint(self, state: Mapping[str, Any]) -> None:
        """Keep a copy of the checkpoint just written, beside the data, where no source table can land.

        A run whose ``checkpoint.json`` is missing or older starts from this copy.
        """
        ...

    def apply_cycle(
        self,
        cycle_id: int,
        changes: Mapping[str, TableChanges],
        position: Mapping[str, int],
        part: Part | None = None,
    ) -> CycleLoad:
        """Apply every table's net changes of cycle ``cycle_id``; tables that hold it already are skipped.

        Args:
            cycle_id: the cycle, 1 or more.
            changes: each table's net changes.
            position: ``applied_seq``, ``applied_commit_lsn`` and ``restart_seq``
                after the cycle, for targets that keep their checkpoint with the data.
            part: the transactions of the cycle ``changes`` are the net of,
                when they are not all of them; tables that hold the cycle
                through ``part.end`` are skipped.

        Raises:
            TargetError: naming the table; what the target committed of the
                cycle is skipped when the cycle is re-run.
        """
        ...

    def apply_log_order(
        self,
        cycle_id: int,
        part: Part,
        position: Mapping[str, int],
        rows: pa.Table,
        tables: Mapping[str, TableDef],
    ) -> CycleLoad:
        """Apply the one transaction of ``part`` change by change, in source order, in one target transaction.

        Args:
            rows: its changes as the pairs hold them (``lsn, table, op, before, after``).
            tables: the definitions of the tables they change.

        Raises:
            TargetError: nothing of it was applied.
        """
        ...

    def pass_transaction(
        self, cycle_id: int, part: Part, position: Mapping[str, int], passed: PassedTransaction
    ) -> None:
        """Move the target's position past ``part``, one transaction its error action lets by, unapplied.

        A logged transaction (:attr:`PassedTransaction.logged`) is written to
        the target's exceptions store with every change, in the same target
        transaction as the position where the target has one; a re-run that
        finds the part held writes nothing again.
        """
        ...

    def exceptions(self, ident: int | None = None) -> list[dict[str, Any]]:
        """The transactions error actions set aside, oldest first (``ident``: that one, with ``changes_list``)."""
        ...

    def resubmit(self, ident: int, changes: Mapping[str, TableChanges]) -> bool:
        """Apply exception ``ident``'s net ``changes`` once and mark it resubmitted (False: it was already)."""
        ...

    def delete_exceptions(self, ident: int | None = None, before: str | None = None) -> int:
        """Delete exception ``ident``, or those logged before the ISO moment ``before``; returns how many."""
        ...

    def applied_through(self, cycle_id: int) -> int:
        """How many of cycle ``cycle_id``'s transactions the target holds as one position, in commit order.

        A target that commits all tables at once answers from its checkpoint
        (0 when it holds none of the cycle); a target that commits per table
        has no one answer and says 0: the engine's intent file then tells, and
        each table skips the parts it holds.
        """
        ...

    def read_arrow(self, table: str) -> pa.Table | None:
        """The table's current contents (status, validation, tests); None when it is missing."""
        ...

    def table_misfit(self, table: TableDef, known: Collection[str]) -> str | None:
        """Why ``table`` cannot land in this target as named beside the ``known`` tables; None when it can.

        The target's limits on names, the names of the Applier's own objects
        there, and two source tables landing in one target table. The engine
        asks before a pair that brings or changes the table is applied, and
        refuses the pair (exit 3) with the answer, so nothing of it is written.
        """
        ...

    def run_lock(self) -> AbstractContextManager[None]:
        """A lock the run holds on the target from before its first change to its end.

        The engine already holds the work folder's run lock
        (:mod:`applier.engine.runlock`); a target whose state lives elsewhere
        (a checkpoint row in a database two folders could share) adds its own.
        A target whose state is all in the folder returns ``contextlib.nullcontext()``.

        Raises:
            RunLockedError: another run holds it (on entering the returned context).
        """
        ...

    def close(self) -> None:
        """Release what the target holds open (connections); a later call opens them again.

        A long-lived process that opens a target per request (the Applier
        view in Airflow's API server) closes it after each; a target that
        holds nothing open does nothing.
        """
        ...


def open_target(config: Config) -> Target:
    """Build the configured target, by the dialect of its type (:mod:`applier.targets.dialects`).

    Args:
        config: the validated configuration; ``target.type`` picks the target,
            ``configuration_name`` tags its commits.

    Returns:
        The target, ready to use; tables are created on first sight.

    Raises:
        ConfigError: the target type is unknown or its settings are missing.
    """
    from applier.targets.dialects import dialect

    return dialect(config.target.type).open(config)
