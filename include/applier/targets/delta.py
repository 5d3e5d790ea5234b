"""The Delta Lake target, written with delta-rs (the ``deltalake`` package).

One Delta table per source table, at ``<root>/<schema>/<table>``.

Exactly once: a cycle's changes to a table land in ONE commit that carries the
app transaction ``(app_id, cycle_id)`` and the commit-info tags
``applier.configuration`` / ``applier.cycle``. Before writing, the cycle the
table's current state holds is read (:mod:`applier.targets.delta_log`: the
newest tagged commit along the state's history, following RESTORE commits) and
the cycle skipped when it is already at or past ``cycle_id``; delta-rs itself
accepts a repeated or even a lower version, so this check is the only guard.
The app transaction alone would over-report after ``DeltaTable.restore``, which
keeps the undone commits' app transactions in the log.

Schema commits: a table seen first with rows is created by its first data
commit (one commit, tagged like any other). A table seen first with no net
change is created empty, and nullable columns are added to an existing table,
in commits of their own without the app transaction: both are idempotent, so a
crash between them and the data commit only means the next attempt finds the
table already in shape.

No-op cycles: an empty change writes nothing, and delta-rs writes no commit for
a merge that changes no row, so ``committed_cycle`` is the last cycle that
*changed* the table and may be lower than the last cycle applied. That is safe:
re-applying an empty change is still empty. (The engine therefore records,
per table, what ``committed_cycle`` answers after each cycle, not the cycle.)

An operator's resubmission of a set-aside transaction commits outside any
cycle, tagged with the exception id instead, and is walked past when the held
cycle is read (:mod:`applier.targets.delta_resubmit`).

Every write is made on the table as opened at the start of that table's apply
(the same call), never on a snapshot kept from before: delta-rs writes against
the snapshot of the ``DeltaTable`` it is given, and an overwrite from a stale
snapshot keeps files added after it. The target assumes it is the only writer
of its tables.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Collection, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction

from applier.engine.changes import (
    TableChanges,
)
from applier.engine.checkpoint import write_atomically
from applier.engine.compiled import release
from applier.errors import ConfigError, TargetError
from applier.intermediate.schema import SchemaError, TableDef, check_table_name
from applier.targets import CycleLoad, Part, PassedTransaction, holds_part
from applier.targets.collisions import Collisions
from applier.targets.delta_check import constraints_of, refused_constraints, rows_to_check
from applier.targets.delta_compact import DEFAULT_MIN_FILES, compact, due
from applier.targets.delta_errors import open_table as _open
from applier.targets.delta_errors import target_errors as _target_errors
from applier.targets.delta_exceptions import append, delete, records, store_path
from applier.targets.delta_log import commit_tags, held_position
from applier.targets.delta_names import OWN_FOLDER, delta_misfit
from applier.targets.delta_resubmit import resubmit as resubmit_exception
from applier.targets.delta_schema import added_fields, check_shape, is_empty, prepared
from applier.targets.delta_tasks import CycleCommit, apply_beside_executors
from applier.targets.delta_write import apply_counted, apply_keyed
from applier.targets.executor_tasks import executor_threshold, executor_writes
from applier.targets.per_table import apply_tables

log = logging.getLogger(__name__)


class DeltaTarget:
    """Delta tables under one folder, written by one Applier configuration.

    Args:
        root: the folder holding ``<schema>/<table>`` Delta tables (``target.path``).
        app_id: the app id of the app transactions (the configuration name).
        threads: tables committed at once by :meth:`apply_cycle`.
        collisions: what a collision does: counted
            (:func:`~applier.targets.delta_write.merge_collisions`), never refused.
        executor_write_mb: a cycle whose tables' compiled changes weigh this
            many MiB or more together has them committed by Spark executor
            tasks once a session is given (:meth:`use_spark`,
            :func:`~applier.targets.executor_tasks.executor_threshold`; None:
            the default for the session's master, infinity: never).
        compact_min_files: a table holding this many small files after a
            cycle's commit is compacted (:mod:`~applier.targets.delta_compact`; 0: never).
    """

    def __init__(
        self,
        root: Path,
        app_id: str,
        *,
        threads: int = 4,
        collisions: Collisions | None = None,
        executor_write_mb: float | None = None,
        compact_min_files: int = DEFAULT_MIN_FILES,
    ) -> None:
        if collisions is not None and collisions.refuse:
            raise ConfigError(
                "errors.actions.collision",
                collisions.action,
                "the Delta target sees collisions in its MERGE's metrics, once the table committed: it counts "
                "them (warn or ignore) but cannot refuse them",
            )
        self.collisions = collisions or Collisions()
        self.root = Path(root).resolve()
        self.app_id = app_id
        self.threads = threads
        self.compact_min_files = compact_min_files
        self._checkpoint_copy = self.root / OWN_FOLDER / f"{app_id}.checkpoint.json"
        self.atomic_cycles = False  # each table commits on its own
        self.log_order = False  # no statements: a log-order transaction commits its net change
        self._constraints: dict[str, dict[str, str]] = {}  # CHECK constraints by table, as last read
        self._exceptions = store_path(self.root, app_id)
        self._executor_mb = executor_write_mb
        self._executor_bytes: int | None = None
        self._spark: Any = None

    def apply_cycle(
        self,
        cycle_id: int,
        changes: Mapping[str, TableChanges],
        position: Mapping[str, int],
        part: Part | None = None,
    ) -> CycleLoad:
        """Apply a cycle (or a part of it) table by table, ``threads`` tables at once (see :meth:`apply_one`).

        The rows of tables with CHECK constraints are checked first
        (:mod:`~applier.targets.delta_check`), so a refusal commits nothing.
        The position is not needed: each table's commit carries the cycle.

        Raises:
            TargetError: a table refused; ``nothing_applied`` when its
                constraints refused before any table committed.
        """
        self._check_first(cycle_id, changes)
        if self._spark is not None and self._executor_bytes is not None:
            writes = executor_writes(changes, self._executor_bytes, self._constraints)
            if writes:
                compacting = self.compact_min_files
                commit = CycleCommit(str(self.root), self.app_id, self.collisions, cycle_id, part, compacting)
                return apply_beside_executors(self, self._spark, commit, writes, changes)
        return apply_tables(self, self.threads, cycle_id, changes, part)

    def use_spark(self, spark: Any) -> None:
        """Commit large cycles on ``spark``'s executors from now on (:func:`~.executor_tasks.executor_threshold`)."""
        self._spark = spark
        self._executor_bytes = executor_threshold(self._executor_mb, spark, "Delta commit")

    def constraints(self, table: str) -> dict[str, str] | None:
        """The CHECK constraints of ``table`` as last read (None: not read)."""
        return self._constraints.get(table)

    def learn_constraints(self, table: str, constraints: Mapping[str, str]) -> None:
        """Keep the constraints another process read of ``table`` (an executor that committed it)."""
        self._constraints[table] = dict(constraints)

    def apply_log_order(self, cycle_id: int, part: Part, *args: Any) -> CycleLoad:
        """Not for Delta (``log_order`` is False): a Delta table takes commits, not statements."""
        raise TargetError(f"cycle {cycle_id}: the Delta target applies a transaction's net change, not its statements")

    def _check_first(self, cycle_id: int, changes: Mapping[str, TableChanges]) -> None:
        """Refuse the cycle before any commit when a table's rows break its CHECK constraints."""
        for name in sorted(changes):
            constraints = self._constraints.get(name)
            if not constraints:
                continue
            try:
                with _target_errors(name, "checking its constraints"):
                    refused = refused_constraints(rows_to_check(changes[name]), constraints)
            finally:
                release(changes, name)
            if refused:
                raise TargetError(
                    f"table {name}: applying cycle {cycle_id} failed: rows break CHECK constraint "
                    f"{', '.join(refused)}; nothing of the cycle was committed",
                    error_class="check",
                    table=name,
                    code="CHECK",
                    nothing_applied=True,
                )

    def pass_transaction(
        self, cycle_id: int, part: Part, position: Mapping[str, int], passed: PassedTransaction
    ) -> None:
        """Keep a logged transaction in the exceptions table, once (its commit carries the part's tags).

        Nothing else moves: the engine's intent records that the part is passed.
        """
        if not passed.logged:
            return
        path = self._exceptions
        with _target_errors(path.name, "keeping a refused transaction"):
            current = _open(path)
            done, through = (0, None) if current is None else self._held(path.name, path, current)
            if holds_part(done, through, cycle_id, part):
                return
            tags = commit_tags(self.app_id, cycle_id, None if part.final else part.end)
            append(path, self.app_id, passed, CommitProperties(custom_metadata=tags))

    def close(self) -> None:
        """Nothing to release: every read and write opens its Delta table afresh."""

    def exceptions(self, ident: int | None = None) -> list[dict[str, Any]]:
        """The transactions error actions set aside, oldest first (``ident``: that one, with ``changes_list``)."""
        with _target_errors(self._exceptions.name, "reading the exceptions"):
            return records(self._exceptions, ident)

    def delete_exceptions(self, ident: int | None = None, before: str | None = None) -> int:
        """Delete exception ``ident``, or those logged before the ISO moment ``before``; how many."""
        with _target_errors(self._exceptions.name, "deleting exceptions"):
            return delete(self._exceptions, ident, before)

    def resubmit(self, ident: int, changes: Mapping[str, TableChanges]) -> bool:
        """Apply exception ``ident``'s net ``changes`` once, table by table, then mark it (:mod:`.delta_resubmit`).

        Returns:
            False when it was resubmitted already: nothing is applied.

        Raises:
            TargetError: the target refused it again (before any commit when its
                CHECK constraints or columns refuse), or it is not in the store.
        """
        return resubmit_exception(self, ident, changes)

    def applied_through(self, cycle_id: int) -> int:
        """0: each table holds its own part of a cycle, so the engine's intent tells how far the cycle went."""
        return 0

    def table_path(self, table: str) -> Path:
        """The folder of ``table``'s Delta table.

        Args:
            table: ``schema.table``.

        Returns:
            ``<root>/<schema>/<table>``, resolved.

        Raises:
            TargetError: the name is not a safe ``schema.table``, or the folder
                resolves outside the root (through a symbolic link, say).
        """
        try:
            check_table_name(table)
        except SchemaError as e:
            raise TargetError(f"table {table!r}: {e}") from e
        schema_name, table_name = table.split(".", 1)
        path = (self.root / schema_name / table_name).resolve()
        if not path.is_relative_to(self.root) or path == self.root:
            raise TargetError(f"table {table}: its folder {path} is outside the target folder {self.root}")
        return path

    def committed_cycle(self, table: str) -> int:
        """The cycle ``table``'s current state holds (a restored table: the restored state's).

        Args:
            table: ``schema.table``.

        Returns:
            The cycle; 0 when the table is missing or this app never wrote it.

        Raises:
            TargetError: the table cannot be read, or its history cannot be followed.
        """
        path = self.table_path(table)
        with _target_errors(table, "reading the committed cycle"):
            current = _open(path)
            return 0 if current is None else self._held(table, path, current)[0]

    def highest_cycle(self, tables: Iterable[str]) -> int:
        """The newest cycle ``tables`` hold; with none named, every table under the root (a first start)."""
        names = list(tables) or [
            f"{p.parent.parent.name}.{p.parent.name}"
            for p in sorted(self.root.glob("*/*/_delta_log"))
            if not p.parent.name.startswith("_") and not p.parent.parent.name.startswith("_")
        ]
        return max(self.committed_cycles(names).values(), default=0)

    def check_tables(self, tables: Mapping[str, TableDef]) -> None:
        """Refuse a table whose columns do not start with its definition's (one log read per table).

        Columns the definition adds at its end may be missing (they are added
        when a cycle next touches the table), and nullable columns past the
        definition's may be there (a cycle under way added them).
        """
        for name in sorted(tables):
            with _target_errors(name, "checking its columns"):
                current = _open(self.table_path(name))
                if current is not None:
                    added_fields(current, tables[name], extra_nullable=True)
                    self._constraints[name] = constraints_of(current)

    def saved_checkpoint(self) -> dict[str, Any] | None:
        """The copy of the Applier's checkpoint kept under the root, in ``_applier/`` (no table can land there)."""
        path = self._checkpoint_copy
        try:
            data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
        except (OSError, ValueError) as e:
            raise TargetError(f"the checkpoint's copy {path} cannot be read ({e}); move it aside") from e
        return data if isinstance(data, dict) else None

    def save_checkpoint(self, state: Mapping[str, Any]) -> None:
        """Keep ``state`` (the checkpoint just written) as ``<root>/_applier/<configuration>.checkpoint.json``."""
        with _target_errors("_applier", "keeping a copy of the checkpoint"):
            self._checkpoint_copy.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self._checkpoint_copy, dict(state))

    def autocorrect(self, tables: frozenset[str]) -> None:
        self.collisions = dataclasses.replace(self.collisions, autocorrect=tables)

    def committed_cycles(self, tables: Iterable[str]) -> dict[str, int]:
        """:meth:`committed_cycle` of each table: every Delta table keeps its own log."""
        return {table: self.committed_cycle(table) for table in tables}

    def table_misfit(self, table: TableDef, known: Collection[str]) -> str | None:
        """Why ``table`` cannot be a Delta table under the root (:mod:`applier.targets.delta_names`)."""
        return delta_misfit(table.name, self.root)

    def run_lock(self) -> AbstractContextManager[None]:
        """No lock of its own: the work folder's run lock, which the engine holds, covers a Delta target."""
        return nullcontext()

    def _held(self, table: str, path: Path, current: DeltaTable) -> tuple[int, int | None]:
        """The cycle the table's state holds, and how many of its transactions (None: all of them).

        Raises:
            TargetError: a RESTORE commit of the table's history cannot be followed.
        """
        try:
            return held_position(current, self.app_id)
        except ValueError as e:
            raise TargetError(f"table {table}: cannot tell which cycle it holds: {e}") from e

    def apply(self, cycle_id: int, changes: TableChanges) -> bool:
        """:meth:`apply_one`, answering only whether the changes were applied (False: skipped)."""
        return self.apply_one(cycle_id, changes)[0]

    def apply_one(
        self, cycle_id: int, changes: TableChanges, part: Part | None = None
    ) -> tuple[bool, int, dict[str, int]]:
        """Apply one table's net changes of a cycle in one commit tagged with the cycle.

        A table seen first is created by that commit (or empty, when the
        change is); new nullable columns are added first, in a commit of their
        own. Does nothing when the table already holds ``cycle_id`` or a later
        cycle, or when the change is empty.

        Args:
            cycle_id: the cycle, 1 or more.
            changes: the table's net changes; ``counted`` is None exactly when
                the table has a primary key.
            part: the cycle's transactions the changes are the net of, when not
                all: the commit is tagged with ``part.end`` unless the part is
                the cycle's last, and is skipped when the table holds that end.

        Returns:
            Whether the changes were applied (False: the table already held
            the cycle); the cycle the table holds afterwards, as
            :meth:`committed_cycle` would read it: ``cycle_id`` after a
            commit, the cycle it held before when nothing was written; and
            the collisions counted, per kind.

        Raises:
            TargetError: delta-rs failed (naming the table), the table's columns
                do not match the definition, or a change deletes more copies of
                a row value than the table holds. Nothing of the cycle was committed.
            ValueError: ``cycle_id`` or the shape of ``changes`` is wrong (a bug of the caller).
        """
        if cycle_id < 1:
            raise ValueError(f"cycle_id must be 1 or more, not {cycle_id}")
        check_shape(changes)
        name = changes.table.name
        path = self.table_path(name)
        with _target_errors(name, f"applying cycle {cycle_id}"):
            current = _open(path)
            if current is not None:
                self._constraints[name] = constraints_of(current)
            done, through = (0, None) if current is None else self._held(name, path, current)
            if holds_part(done, through, cycle_id, part):
                log.info("table %s: cycle %d already committed (cycle %d on record); skipped", name, cycle_id, done)
                return False, done, {}
            empty = is_empty(changes)
            table = prepared(path, changes.table, current) if current is not None or empty else None
            if empty:
                return True, done, {}
            tags = commit_tags(self.app_id, cycle_id, None if part is None or part.final else part.end)
            props = CommitProperties(app_transactions=[Transaction(self.app_id, cycle_id)], custom_metadata=tags)
            found: dict[str, int] = {}

            def settle(met: dict[str, int]) -> None:
                found.update(self.collisions.settle(name, met))

            compacting = due(current, self.compact_min_files)
            (apply_keyed if changes.counted is None else apply_counted)(table, path, changes, props, settle)
            if compacting:
                compact(path, name)
            log.debug("table %s: cycle %d committed, net %s", name, cycle_id, changes.stats)
            return True, cycle_id, found

    def read_arrow(self, table: str) -> pa.Table | None:
        """Every row of ``table`` (``schema.table``), in no order; None when it is missing (TargetError: unreadable)."""
        path = self.table_path(table)
        with _target_errors(table, "reading"):
            current = _open(path)
            return None if current is None else current.to_pyarrow_table()

    def file_uris(self, table: str) -> list[str]:
        """The URIs of ``table``'s current Parquet files, for readers such as Spark; none when it is missing."""
        path = self.table_path(table)
        with _target_errors(table, "listing files"):
            current = _open(path)
            return [] if current is None else list(current.file_uris())
