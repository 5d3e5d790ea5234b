"""One realistic change at a time on the shaped tables, shared by the shaped runners.

A change is chosen the way an application would make it: inserts under fresh
keys, updates and deletes of rows the transaction can see and lock (now and
then its own rows again, now and then moving a row to a new key), and on
tables without a key, inserts (some duplicating an existing row) and updates
or deletes of exactly one copy of an existing value. A change that finds no
target falls back to an insert, as an application that finds nothing to do
elsewhere writes something new.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from applier.generate.clock import SimClock
from applier.generate.model import Key, Txn
from applier.generate.runner import RunState
from applier.generate.session import COMMIT, LEAVE_OPEN
from applier.generate.shapes.session import ShapeDatabase, ShapeSession
from applier.generate.shapes.tables import ShapedTable
from applier.generate.shapes.values import ShapedValues
from applier.generate.stream import Stream
from applier.generate.values import RowFactory

# Shares of the ops on a keyed table (the rest deletes) and on a keyless one.
KEYED_INSERT, KEYED_UPDATE = 0.40, 0.82
KEYLESS_INSERT, KEYLESS_UPDATE = 0.50, 0.75
KEY_MOVE_RATE = 0.015  # of updates of a keyed table
AGAIN_RATE = 0.08  # of updates and deletes: a row this transaction already changed
DUPLICATE_RATE = 0.06  # of keyless inserts: a copy of an existing row
DUPLICATE_DELETE_RATE = 0.2  # of keyless deletes: a value known to have several copies
LOAD_CHUNK = 500  # rows per initial-load transaction


@dataclass
class Mine:
    """What one transaction changed, so it can come back to its own rows.

    Attributes:
        keys: ``(table, key)`` of keyed rows it inserted or updated.
    """

    keys: list[tuple[ShapedTable, Key]] = field(default_factory=list)


class Shaped:
    """The shaped runners' shared state: the database, the log, values and the tables.

    Args:
        tables: the table set.
        stream: the log.
        rng: the run's single random source.
        clock: simulated time.
    """

    def __init__(self, tables: tuple[ShapedTable, ...], stream: Stream, rng: random.Random, clock: SimClock) -> None:
        self.tables = tables
        self.by_name = {t.name: t for t in tables}
        self.db = ShapeDatabase(t.definition for t in tables)
        self.stream = stream
        self.rng = rng
        self.values = ShapedValues(rng, clock)
        self.shop_rows = RowFactory(rng, clock)
        self.full_before = frozenset(t.name for t in tables if t.full_before)
        self.state = RunState()
        self.xid = 7_000 + rng.randrange(1_000)
        self.duplicates: dict[str, list[Key]] = {}  # per keyless table, values inserted more than once

    def session(self, outcome: str) -> ShapeSession:
        """Start a transaction that will end with ``outcome``."""
        self.xid += 1 if self.rng.random() < 0.9 else 2 + int(self.rng.random() * 8)
        self.state.started += 1
        return ShapeSession(self.db, self.stream, self.shop_rows, Txn(str(self.xid)), outcome, self.full_before)

    def finish(self, session: ShapeSession) -> None:
        """End ``session``'s transaction as planned (commit, roll back, or leave it open)."""
        txn = session.txn
        if session.outcome == LEAVE_OPEN:
            self.state.left_open += txn.begun
            self.feature("open_at_end")
        else:
            commit = session.outcome == COMMIT
            (self.db.commit if commit else self.db.rollback)(txn)
            self.stream.end(txn, commit=commit)
            if not commit:
                self.feature("rollback")
        self.state.finished += 1

    def load(self, todo: list[ShapedTable]) -> None:
        """The initial load: one new row per entry of ``todo``, :data:`LOAD_CHUNK` rows per committed transaction."""
        for at in range(0, len(todo), LOAD_CHUNK):
            session = self.session(COMMIT)
            for table in todo[at : at + LOAD_CHUNK]:
                self.insert(session, table)
            self.finish(session)
        self.feature("initial_load")

    def feature(self, name: str) -> None:
        """Note that the stream holds ``name`` (summary ``features``)."""
        self.state.features[name] = None

    def insert(self, s: ShapeSession, table: ShapedTable, mine: Mine | None = None) -> bool:
        """Insert a new row (keyed: under a fresh key; keyless: sometimes a copy of an existing row)."""
        if not table.keyed:
            value = s.pick_value(table.name) if self.rng.random() < DUPLICATE_RATE else None
            if value is not None:
                self.duplicates.setdefault(table.name, []).append(value)
                return s.insert_value(table.name, s.sample_row(table.name, value))
            return s.insert_value(table.name, self.values.row(table, {}))
        row = self.values.row(table, self.values.key(table, self.db.next_id(table.name)))
        if not s.insert(table.name, row):
            return False
        if mine is not None:
            mine.keys.append((table, self.db.pk[table.name].key_of(row)))
        return True

    def change(self, s: ShapeSession, table: ShapedTable, mine: Mine) -> bool:
        """Make one change to ``table`` in ``s``'s transaction; False when the table is closed to it."""
        if not s.may_touch(table.name):
            return False
        r = self.rng.random()
        if not table.keyed:
            done = r >= KEYLESS_INSERT and self._keyless_change(s, table, r < KEYLESS_UPDATE)
        elif r < KEYED_INSERT:
            done = False
        else:
            done = self._keyed_change(s, table, mine, r < KEYED_UPDATE)
        return done or self.insert(s, table, mine)

    def _own(self, s: ShapeSession, table: ShapedTable, mine: Mine) -> Key | None:
        if not mine.keys or self.rng.random() >= AGAIN_RATE:
            return None
        owner, key = mine.keys[int(self.rng.random() * len(mine.keys))]
        return key if owner is table and s.get(table.name, key) is not None else None

    def _keyed_change(self, s: ShapeSession, table: ShapedTable, mine: Mine, update: bool) -> bool:
        key = self._own(s, table, mine)
        picked = s.pick(table.name) if key is None else (key, s.own(table.name, key))
        if picked is None:
            return False
        key, before = picked
        if not update:
            s.delete(table.name, key)
            return True
        after = self.values.changed(table, before)
        if self.rng.random() < KEY_MOVE_RATE:
            after.update(self.values.key(table, self.db.next_id(table.name)))
            self.feature("key_move")
        s.update(table.name, key, after)
        mine.keys.append((table, self.db.pk[table.name].key_of(after)))
        return True

    def _keyless_change(self, s: ShapeSession, table: ShapedTable, update: bool) -> bool:
        value = None
        known = self.duplicates.get(table.name)
        if not update and known and self.rng.random() < DUPLICATE_DELETE_RATE:
            candidate = known[int(self.rng.random() * len(known))]
            if self.db.bags[table.name].available(candidate) >= 2:
                value = candidate
                self.feature("keyless_duplicate_delete")
        if value is None:
            value = s.pick_value(table.name)
        if value is None:
            return False
        if update:
            s.update_value(table.name, value, self.values.changed(table, s.sample_row(table.name, value)))
        else:
            s.delete_value(table.name, value)
        return True
