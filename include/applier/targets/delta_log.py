"""Which applier cycle a Delta table's *current state* holds, read from its commit history.

Every applier data commit carries two commit-info keys,
``applier.configuration`` (the app id) and ``applier.cycle``, next to its app
transaction ``(app_id, cycle)``. The app transaction alone cannot answer the
question once a table was restored: ``DeltaTable.restore(v)`` writes a
``RESTORE`` commit holding only file actions, and the app transactions of the
undone commits stay in the log, so ``transaction_version`` still reports the
newest cycle (measured, delta-rs 1.6.6: see ``docs/notes/engine-spike.md``).

So the history is walked from the newest commit, following the state:

- a commit tagged by this app id: its state holds that cycle, the answer;
- a resubmission of an exception (tagged ``applier.resubmitted``, see below):
  it applies a set-aside transaction as of now and moves no cycle, so the
  walk goes on at the version before it;
- a ``RESTORE`` to version ``r`` (or to a moment, the newest version at or
  before it): the state is version ``r``'s, so the walk goes on at ``r``;
- a commit that changes no row (added columns, OPTIMIZE, VACUUM, table
  properties): the walk goes on at the version before it;
- any other commit (the table's creation, a write from before commits were
  tagged, a foreign writer): the app transaction as of that version answers.

The common case costs one log entry: the newest commit is the applier's. A
table folder replaced by a backup copy needs nothing special: its log ends
where the copy was taken.

A resubmission (``applier exceptions resubmit ID``,
:mod:`applier.targets.delta_resubmit`) commits each table it changes with the
keys ``applier.configuration`` and ``applier.resubmitted`` (the exception id)
and the app transaction ``(<app id>.exception.<id>, 1)``, and no cycle.
Whether a table's state holds that resubmission is read the same way: along
the state's path (following RESTOREs), a commit carrying the exception id;
where the path leaves the log that is still kept (old entries cleaned up), the
app transaction answers.

Everything but :func:`held_position` and :func:`resubmission_held` is pure:
history entries (``DeltaTable.history()`` dicts) in, an answer out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CONFIGURATION_KEY = "applier.configuration"
CYCLE_KEY = "applier.cycle"
# On a commit of a part of a cycle (not its last): how many of the cycle's transactions the table holds.
THROUGH_KEY = "applier.through"
# On a resubmission's commit: the id of the exception it applies (it carries no cycle).
RESUBMITTED_KEY = "applier.resubmitted"
# Operations (delta-rs and Delta Spark names) that change no row: walked past.
NO_ROW_CHANGE = frozenset(
    {
        "ADD COLUMN",
        "ADD COLUMNS",
        "CHANGE COLUMN",
        "SET TBLPROPERTIES",
        "UNSET TBLPROPERTIES",
        "ADD CONSTRAINT",
        "DROP CONSTRAINT",
        "ADD FEATURE",
        "UPGRADE PROTOCOL",
        "UPDATE FIELD METADATA",
        "UPDATE TABLE METADATA",
        "OPTIMIZE",
        "VACUUM START",
        "VACUUM END",
    }
)


def commit_tags(app_id: str, cycle_id: int, through: int | None = None) -> dict[str, str]:
    """The commit-info keys of an applier commit of cycle ``cycle_id`` (of its transactions up to ``through``)."""
    tags = {CONFIGURATION_KEY: app_id, CYCLE_KEY: str(cycle_id)}
    if through is not None:
        tags[THROUGH_KEY] = str(through)
    return tags


def resubmission_tags(app_id: str, ident: int) -> dict[str, str]:
    """The commit-info keys of a commit that resubmits exception ``ident``."""
    return {CONFIGURATION_KEY: app_id, RESUBMITTED_KEY: str(ident)}


def resubmission_app(app_id: str, ident: int) -> str:
    """The app id of the app transaction (version 1) a resubmission of exception ``ident`` commits with."""
    return f"{app_id}.exception.{ident}"


def tagged_resubmission(entry: Mapping[str, Any], app_id: str) -> int | None:
    """The exception a resubmission commit of ``app_id`` applies, or None for any other commit."""
    if entry.get(CONFIGURATION_KEY) != app_id or RESUBMITTED_KEY not in entry:
        return None
    return int(entry[RESUBMITTED_KEY])


def tagged_through(entry: Mapping[str, Any]) -> int | None:
    """How many of its cycle's transactions an applier commit holds; None: all of them."""
    through = entry.get(THROUGH_KEY)
    return None if through is None else int(through)


@dataclass(frozen=True)
class PathAnswer:
    """The result of a walk along the current state's history.

    Attributes:
        cycle: the cycle of the tagged commit the path reached; None when it
            reached another commit that changes rows, or the log's start.
        state_version: where the path stopped; when ``cycle`` is None, the app
            transaction as of this version is the answer.
        needs_older: the path goes below the oldest entry given, and older
            entries exist: walk again with more history.
    """

    cycle: int | None
    state_version: int
    needs_older: bool = False


def tagged_cycle(entry: Mapping[str, Any], app_id: str) -> int | None:
    """The cycle an applier commit of ``app_id`` carries, or None for any other commit."""
    if entry.get(CONFIGURATION_KEY) != app_id or CYCLE_KEY not in entry:
        return None
    return int(entry[CYCLE_KEY])


def _restore_target(
    version: int, entry: Mapping[str, Any], history: Mapping[int, Mapping[str, Any]], complete: bool
) -> int | None:
    """The version a RESTORE commit went back to; None when older history is needed to tell.

    Raises:
        ValueError: the commit names neither a version nor a moment, or one not before it.
    """
    params = entry.get("operationParameters") or {}
    if "version" in params:
        target = int(params["version"])
    elif "datetime" in params:
        moment = int(params["datetime"])
        older = [v for v, e in history.items() if v < version and int(e.get("timestamp", moment + 1)) <= moment]
        if not older:
            if not complete:
                return None
            raise ValueError(f"the RESTORE of version {version} went back to {moment} ms, before every version")
        target = max(older)
    else:
        raise ValueError(f"the RESTORE of version {version} names no version or moment: {dict(params)}")
    if not 0 <= target < version:
        raise ValueError(f"the RESTORE of version {version} names version {target}, which is not before it")
    return target


def cycle_on_path(history: Mapping[int, Mapping[str, Any]], version: int, app_id: str, *, complete: bool) -> PathAnswer:
    """Walk the state of ``version`` back through ``history`` to the newest tagged commit.

    Args:
        history: commit infos by version (any newest-first slice of the log).
        version: the table's current version.
        app_id: whose tags count.
        complete: ``history`` holds every entry the log still has.

    Returns:
        The answer; ``needs_older`` when the walk left the slice and more exists.

    Raises:
        ValueError: a RESTORE commit that cannot be followed.
    """
    v = last = version
    while v >= 0:
        entry = history.get(v)
        if entry is None:  # not in the slice, or removed by log clean-up: the path's oldest state answers
            return PathAnswer(None, last, needs_older=not complete)
        cycle = tagged_cycle(entry, app_id)
        if cycle is not None:
            return PathAnswer(cycle, v)
        last = v
        operation = entry.get("operation")
        if operation == "RESTORE":
            target = _restore_target(v, entry, history, complete)
            if target is None:
                return PathAnswer(None, v, needs_older=True)
            v = target
        elif operation in NO_ROW_CHANGE or tagged_resubmission(entry, app_id) is not None:
            v -= 1
        else:
            return PathAnswer(None, v)
    return PathAnswer(None, last)


def held_position(current: Any, app_id: str) -> tuple[int, int | None]:
    """The cycle a Delta table's state holds, and how many of its transactions (None: all of them).

    One log entry when the newest commit is the applier's; more of the log
    only while the walk needs it (a restore far back).

    Args:
        current: the table (a ``deltalake.DeltaTable``) as just opened.
        app_id: whose tags count.

    Raises:
        ValueError: a RESTORE commit of the history cannot be followed.
    """
    newest = current.history(1)
    cycle = tagged_cycle(newest[0], app_id) if newest else None
    if cycle is not None:
        return cycle, tagged_through(newest[0])
    limit = 16
    while True:
        entries = current.history(limit)
        by_version = {int(e["version"]): e for e in entries}
        answer = cycle_on_path(by_version, current.version(), app_id, complete=len(entries) < limit)
        if not answer.needs_older:
            break
        limit *= 8
    if answer.cycle is not None:
        return answer.cycle, tagged_through(by_version[answer.state_version])
    state = current
    if answer.state_version != current.version():
        state = type(current)(current.table_uri, version=answer.state_version)
    return state.transaction_version(app_id) or 0, None


def resubmission_on_path(
    history: Mapping[int, Mapping[str, Any]], version: int, app_id: str, ident: int
) -> bool | None:
    """Whether the state of ``version`` holds ``app_id``'s resubmission of exception ``ident``.

    Args:
        history: commit infos by version: every entry the log still has.
        version: the table's current version.

    Returns:
        True when a commit along the state's path carries the exception id,
        False when the path reaches the table's first version without one,
        None when it leaves the log that is kept (the app transaction answers).

    Raises:
        ValueError: a RESTORE commit that cannot be followed.
    """
    v = version
    while v >= 0:
        entry = history.get(v)
        if entry is None:
            return None
        if tagged_resubmission(entry, app_id) == ident:
            return True
        if entry.get("operation") == "RESTORE":
            target = _restore_target(v, entry, history, True)
            assert target is not None  # the history is complete
            v = target
        else:
            v -= 1
    return False


def resubmission_held(current: Any, app_id: str, ident: int) -> bool:
    """Whether a Delta table's state holds the resubmission of exception ``ident`` (one read of its whole log).

    A resubmission is an operator's command, rare and once per table, so the
    whole kept history is read rather than the newest entries only.

    Args:
        current: the table (a ``deltalake.DeltaTable``) as just opened.

    Raises:
        ValueError: a RESTORE commit of the history cannot be followed.
    """
    by_version = {int(e["version"]): e for e in current.history()}
    held = resubmission_on_path(by_version, current.version(), app_id, ident)
    if held is None:
        return current.transaction_version(resubmission_app(app_id, ident)) is not None
    return held
