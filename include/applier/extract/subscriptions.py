"""The subscriptions of an intermediate folder: tables added to running replication, and their states.

A subscription is added by ``applier subscribe`` (state ``defined``) and moved
on by the extractor, which materializes it (see :mod:`applier.extract.materialize`):

- ``defined``: recorded, not started;
- ``materializing``: its position is fixed against the slot and its copy is
  being written into pairs;
- ``activating``: the copy is in complete pairs, the table's changes after the
  switch-over follow it; the Applier has not applied the switch-over yet;
- ``active``: the Applier applied the switch-over (the table is replicated;
  an incremental copy may be partial, a nonatomic one is still autocorrected);
- ``valid``: the Applier applied the whole copy, past its end;
- ``dropped``: its changes are left out after the drop's position (and, with
  ``--purge``, its target rows are truncated there).

``active`` and ``valid`` are not stored: they are read off the Applier's
checkpoint (:func:`applier_state`), so the extractor and the Applier never
write one file. ``recovering`` is set when an attempt failed (its copy was cut
by a crash, a lock wait ran out, the table could not be read): a crash is
recovered on its own by the next run, an error waits for ``applier
subscriptions --resume``.

The registry is one JSON file in the intermediate folder, ``.subscriptions.json``
(a dot name: pair readers ignore it), rewritten whole under a lock file and
renamed into place, so a reader never sees half of it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from applier.errors import UsageError

REGISTRY = ".subscriptions.json"
LOCK = ".subscriptions.lock"
MODES = ("atomic", "incremental", "nonatomic")
STORED_STATES = ("defined", "materializing", "activating", "dropped")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Subscription:
    """One table's subscription, as stored.

    Attributes:
        table: ``schema.table``.
        mode: ``atomic``, ``incremental`` or ``nonatomic``.
        state: one of :data:`STORED_STATES`.
        recovering: an attempt failed; see ``error``.
        error: why the last attempt failed (None after a crash: recovered on its own).
        attempt: the attempt whose markers are live (each attempt has new markers).
        start_position: source commit position after which the table's changes are extracted.
        activation_lsn: the lsn of the switch-over's commit in the pairs (the Applier is active past it).
        valid_lsn: the lsn of the copy's last commit in the pairs (the Applier is valid past it).
        copied_rows: rows of the copy in complete pairs.
        after_key: nonatomic: the key (as text) after which the next chunk starts.
        drop: ``keep`` or ``purge`` once a drop is asked for.
        drop_position: source commit position after which a dropped table's changes are left out.
        chunk_rows: rows per chunk for this table (None: ``materialize.chunk_rows``).
    """

    table: str
    mode: str
    state: str = "defined"
    recovering: bool = False
    error: str | None = None
    attempt: str | None = None
    start_position: int | None = None
    activation_lsn: int | None = None
    valid_lsn: int | None = None
    copied_rows: int = 0
    after_key: list[str | None] | None = None
    drop: str | None = None
    drop_position: int | None = None
    chunk_rows: int | None = None
    updated_at: str = field(default_factory=_now)


class Registry:
    """The subscriptions of one intermediate folder (``<intermediate_dir>/.subscriptions.json``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / REGISTRY

    def load(self) -> dict[str, Subscription]:
        """Every subscription, by table (none when the folder has no registry)."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        return {name: Subscription(**entry) for name, entry in raw.items()}

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / LOCK, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _save(self, subs: dict[str, Subscription]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = json.dumps({name: dataclasses.asdict(s) for name, s in sorted(subs.items())}, indent=1)
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def update(self, change: Callable[[dict[str, Subscription]], Any]) -> Any:
        """Read, change in place and write the registry under its lock; returns what ``change`` returns."""
        with self._locked():
            subs = self.load()
            result = change(subs)
            self._save(subs)
            return result

    def change(self, table: str, **values: Any) -> None:
        """Set fields of one subscription (gone already: nothing happens)."""

        def apply(subs: dict[str, Subscription]) -> None:
            if table in subs:
                subs[table] = dataclasses.replace(subs[table], **values, updated_at=_now())

        self.update(apply)

    def add(self, table: str, mode: str, chunk_rows: int | None = None) -> Subscription:
        """Record a new subscription (``defined``).

        Raises:
            UsageError: the mode is unknown, or the table has a subscription already.
        """
        if mode not in MODES:
            raise UsageError(f"--mode {mode}: choose one of {', '.join(MODES)}")

        def apply(subs: dict[str, Subscription]) -> Subscription:
            if table in subs and subs[table].state != "dropped":
                raise UsageError(
                    f"table {table} has a subscription already ({subs[table].state}); "
                    "drop it first (applier subscriptions --drop)"
                )
            subs[table] = Subscription(table, mode, chunk_rows=chunk_rows)
            return subs[table]

        result: Subscription = self.update(apply)
        return result

    def ask(self, table: str, *, drop: str | None = None, resume: bool = False) -> Subscription:
        """Ask the extractor to drop (``keep`` or ``purge`` the target's rows) or resume a subscription.

        Raises:
            UsageError: the table has no subscription.
        """

        def apply(subs: dict[str, Subscription]) -> Subscription:
            if table not in subs:
                raise UsageError(f"table {table} has no subscription (applier subscriptions lists them)")
            sub = subs[table]
            if drop is not None:
                sub = dataclasses.replace(sub, drop=drop, updated_at=_now())
            if resume:
                sub = dataclasses.replace(sub, error=None, updated_at=_now())
            subs[table] = sub
            return sub

        result: Subscription = self.update(apply)
        return result


def applier_state(sub: Subscription, applied_commit_lsn: int) -> str:
    """The state as a person reads it: the stored one, or ``active``/``valid`` off the Applier's position."""
    if sub.state != "activating":
        return sub.state
    if sub.valid_lsn is not None and applied_commit_lsn >= sub.valid_lsn:
        return "valid"
    if sub.activation_lsn is not None and applied_commit_lsn >= sub.activation_lsn:
        return "active"
    return "activating"
