"""Resubmitting a set-aside transaction to the Delta target, exactly once, without a multi-table transaction.

PostgreSQL applies a resubmitted transaction and marks its record in one
database transaction. Delta commits each table on its own, and the record
lives in a Delta table of its own (:mod:`applier.targets.delta_exceptions`),
so the resubmission is a sequence of commits made safe to repeat:

1. The record is read again: a record already marked ``resubmitted_at`` ends
   the resubmission with nothing written (another command did it).
2. Each table the transaction changes is opened, and skipped when its state
   already holds this resubmission: an earlier attempt committed it and was
   interrupted before the mark (:func:`~applier.targets.delta_log.resubmission_held`
   reads the tag below along the state's history, following RESTOREs).
3. Every remaining table is checked before anything commits: its columns
   against the definition, and its rows against its CHECK constraints
   (:mod:`~applier.targets.delta_check`, delta-rs's own check on a scratch
   table). A refusal raises :class:`~applier.errors.TargetError` (exit 4)
   and changes nothing, so the operator fixes the cause and resubmits again.
4. Each remaining table is committed, in name order, in ONE commit tagged
   ``applier.configuration`` / ``applier.resubmitted=<id>`` with the app
   transaction ``(<configuration>.exception.<id>, 1)``, and no cycle: the
   engine's reading of which cycle a table holds walks past such commits
   (:mod:`~applier.targets.delta_log`), so the next run is undisturbed.
5. Only then is the record marked, in one commit of the exceptions table
   with the same tags. A later resubmission finds the mark and exits 2.

A crash (or a refusal the check cannot foresee) between two commits leaves the
record unmarked and some tables holding the tag: re-running the command
skips those tables and commits the others, so each table takes the
transaction once. The engine holds the configuration's run lock around the
whole (:mod:`applier.engine.resubmit`): no run and no other resubmission
writes the tables meanwhile, which keeps the target the only writer it
assumes. Like on PostgreSQL, the change lands as of now.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from deltalake import CommitProperties, DeltaTable, Transaction

from applier.engine.changes import TableChanges
from applier.engine.compiled import release
from applier.errors import TargetError
from applier.targets.collisions import describe
from applier.targets.delta_check import constraints_of, refused_constraints, rows_to_check
from applier.targets.delta_errors import open_table, target_errors
from applier.targets.delta_exceptions import mark, records, store_path
from applier.targets.delta_log import resubmission_app, resubmission_held, resubmission_tags
from applier.targets.delta_schema import added_fields, check_shape, is_empty, prepared
from applier.targets.delta_write import apply_counted, apply_keyed

if TYPE_CHECKING:
    from applier.targets.delta import DeltaTarget

log = logging.getLogger("applier.targets.delta")


def resubmit(target: DeltaTarget, ident: int, changes: Mapping[str, TableChanges]) -> bool:
    """Apply exception ``ident``'s net ``changes`` to the tables that do not hold them yet, then mark the record.

    Args:
        target: the Delta target (its root, app id and exceptions store).
        ident: the exception.
        changes: its net changes by table (a compiled cycle: each table is
            released once applied or skipped).

    Returns:
        False when the record was marked resubmitted already: nothing is written.

    Raises:
        TargetError: the record is missing, a table refused the changes
            (before any commit when the check foresaw it), or delta-rs failed.
    """
    store = store_path(target.root, target.app_id)
    with target_errors(store.name, "reading the exception"):
        found = records(store, ident)
    if not found:
        raise TargetError(f"exception {ident} is not in the exceptions store of {target.app_id}")
    if found[0]["resubmitted_at"] is not None:
        return False
    pending: dict[str, tuple[TableChanges, DeltaTable | None]] = {}
    try:
        for name in sorted(changes):
            table_changes = changes[name]
            held, current = _opened(target, ident, table_changes)
            if held:
                release(changes, name)
            else:
                pending[name] = (table_changes, current)
        _check(ident, pending)
        props = CommitProperties(
            app_transactions=[Transaction(resubmission_app(target.app_id, ident), 1)],
            custom_metadata=resubmission_tags(target.app_id, ident),
        )
        for table_changes, _ in pending.values():
            commit_table(target, ident, table_changes, props)
    finally:
        for name in pending:
            release(changes, name)
    with target_errors(store.name, "marking the exception resubmitted"):
        marked = mark(store, ident, CommitProperties(custom_metadata=resubmission_tags(target.app_id, ident)))
    if not marked:
        raise TargetError(
            f"exception {ident}: its record was deleted while it was resubmitted; its changes were applied"
        )
    return True


def _opened(target: DeltaTarget, ident: int, changes: TableChanges) -> tuple[bool, DeltaTable | None]:
    """Whether the table's state already holds the resubmission, and the table as opened (None: missing)."""
    check_shape(changes)
    name = changes.table.name
    with target_errors(name, f"resubmitting exception {ident}"):
        current = open_table(target.table_path(name))
        if current is None:
            return False, None
        try:
            held = resubmission_held(current, target.app_id, ident)
        except ValueError as e:
            raise TargetError(f"table {name}: cannot tell whether it holds exception {ident}: {e}") from e
        if held:
            log.info("table %s: exception %d already committed by an earlier resubmission; skipped", name, ident)
        return held, current


def _check(ident: int, pending: Mapping[str, tuple[TableChanges, DeltaTable | None]]) -> None:
    """Refuse the resubmission before any commit when a table's columns or CHECK constraints refuse it."""
    for name, (changes, current) in pending.items():
        if current is None:
            continue
        with target_errors(name, f"checking exception {ident}"):
            added_fields(current, changes.table)  # raises on columns that no longer match the definition
            refused = refused_constraints(rows_to_check(changes), constraints_of(current))
        if refused:
            raise TargetError(
                f"table {name}: resubmitting exception {ident} failed: rows break CHECK constraint "
                f"{', '.join(refused)}; nothing was committed",
                error_class="check",
                table=name,
                code="CHECK",
                nothing_applied=True,
            )


def commit_table(target: DeltaTarget, ident: int, changes: TableChanges, props: CommitProperties) -> None:
    """Write one table's share of the resubmission in one commit carrying ``props`` (nothing when it is empty).

    As in a cycle (:meth:`~applier.targets.delta.DeltaTarget.apply_one`): a
    missing table is created, new nullable columns are added first in a
    commit of their own (idempotent, so untagged).
    """
    name = changes.table.name
    path = target.table_path(name)
    with target_errors(name, f"resubmitting exception {ident}"):
        current = open_table(path)  # afresh: delta-rs writes against the snapshot it is given
        empty = is_empty(changes)
        table = prepared(path, changes.table, current) if current is not None or empty else None
        if empty:
            return

        def settle(met: dict[str, int]) -> None:
            if counted := target.collisions.settle(name, met):
                log.warning("table %s: exception %d: %s; applied as upserts", name, ident, describe(counted))

        (apply_keyed if changes.counted is None else apply_counted)(table, path, changes, props, settle)
        log.info("table %s: exception %d committed, net %s", name, ident, changes.stats)
