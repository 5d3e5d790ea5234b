"""What a transaction script may do: look at the rows it can see and change them.

A :class:`Session` binds one open transaction to the simulated database and
the log. Every change is checked against the database's rules before it is
logged, so a script can only produce changes a real source could have made.
Scripts check ``may_touch`` and use ``pick``/``key_free`` to choose targets;
an illegal change raises :class:`ConflictError` (a bug in the script).
"""

from __future__ import annotations

import random

from applier.generate.database import ConflictError, Database
from applier.generate.model import Key, Txn
from applier.generate.stream import Stream
from applier.generate.tables import FULL_BEFORE_TABLES
from applier.generate.values import Row, RowFactory

COMMIT, ROLLBACK, LEAVE_OPEN = "commit", "rollback", "open"


class Session:
    """One transaction's handle on the database and the log.

    Args:
        db: the simulated database.
        stream: the log changes are written to.
        rows: builds row values.
        txn: the transaction this session runs.
        outcome: how the transaction ends: ``commit``, ``rollback`` or ``open`` (never ends).
    """

    def __init__(self, db: Database, stream: Stream, rows: RowFactory, txn: Txn, outcome: str) -> None:
        self.db = db
        self.stream = stream
        self.rows = rows
        self.rng: random.Random = rows.rng
        self.txn = txn
        self.outcome = outcome
        self.features: list[str] = []  # scenario features this transaction has carried out

    def may_touch(self, table: str) -> bool:
        """Whether this transaction may change ``table`` now."""
        return self.db.may_touch(self.txn, table)

    def pick(self, table: str) -> tuple[Key, Row] | None:
        """A random committed row of ``table`` this transaction may change, or None."""
        return self.db.pick(self.txn, self.rng, table)

    def sample_id(self, table: str) -> int | None:
        """The id of some committed row of ``table``, for a reference (reads take no locks)."""
        key = self.db.pk[table].pool.pick(self.rng)
        return None if key is None else int(key[0])

    def get(self, table: str, key: Key) -> Row | None:
        """The row under ``key`` as this transaction sees it, or None."""
        return self.db.visible(self.txn, table, key)

    def own(self, table: str, key: Key) -> Row:
        """The row under ``key`` that this transaction already changed and still sees."""
        row = self.txn.overlay.get((table, key))
        if row is None:
            raise ConflictError(f"{self.txn.xid} expects its own row {table} {key}, which it does not hold")
        return row

    def key_free(self, table: str, key: Key) -> bool:
        """Whether a row could be inserted under ``key`` (absent and unlocked)."""
        return self.db.free_for(self.txn, table, key) and self.db.visible(self.txn, table, key) is None

    def _before(self, table: str, row: Row) -> Row:
        return row if table in FULL_BEFORE_TABLES else self.db.pk[table].key_image(row)

    def insert(self, table: str, row: Row) -> bool:
        """Insert ``row`` into keyed ``table``; False (nothing logged) when not allowed."""
        key = self.db.pk[table].key_of(row)
        if not self.may_touch(table) or not self.key_free(table, key):
            return False
        self.db.stage(self.txn, table, key, row)
        self.stream.row(self.txn, table, "I", None, row)
        return True

    def update(self, table: str, key: Key, after: Row) -> None:
        """Replace the visible row under ``key`` by ``after``, which may carry another key."""
        before = self.get(table, key)
        if before is None or not self.db.free_for(self.txn, table, key):
            raise ConflictError(f"{self.txn.xid} updates {table} {key}, which it cannot see or lock")
        new_key = self.db.pk[table].key_of(after)
        if new_key != key:
            if not self.key_free(table, new_key):
                raise ConflictError(f"{self.txn.xid} moves {table} {key} onto taken key {new_key}")
            self.db.stage(self.txn, table, key, None)
        self.db.stage(self.txn, table, new_key, after)
        self.stream.row(self.txn, table, "U", self._before(table, before), after)

    def delete(self, table: str, key: Key) -> None:
        """Delete the visible row under ``key``."""
        before = self.get(table, key)
        if before is None or not self.db.free_for(self.txn, table, key):
            raise ConflictError(f"{self.txn.xid} deletes {table} {key}, which it cannot see or lock")
        self.db.stage(self.txn, table, key, None)
        self.stream.row(self.txn, table, "D", self._before(table, before), None)

    def truncate(self, table: str) -> None:
        """Empty ``table``; the transaction must own the table's gate."""
        self.db.stage_truncate(self.txn, table)
        self.stream.row(self.txn, table, "T", None, None)

    def pick_value(self, table: str, copies: int = 1) -> Key | None:
        """A value of keyless ``table`` with ``copies`` copies this transaction may delete, or None."""
        return self.db.pick_value(self.txn, self.rng, table, copies)

    def sample_row(self, table: str, value: Key) -> Row:
        """The full row of ``value`` in keyless ``table``."""
        return self.db.bags[table].samples[value]

    def insert_value(self, table: str, row: Row) -> bool:
        """Insert one copy of ``row`` into keyless ``table``; False when not allowed."""
        if not self.may_touch(table):
            return False
        self.db.stage_value_insert(self.txn, table, row)
        self.stream.row(self.txn, table, "I", None, row)
        return True

    def delete_value(self, table: str, value: Key) -> None:
        """Delete exactly one copy of ``value`` from keyless ``table``."""
        before = self.sample_row(table, value)
        self.db.stage_value_delete(self.txn, table, value)
        self.stream.row(self.txn, table, "D", before, None)

    def update_value(self, table: str, value: Key, after: Row) -> None:
        """Change exactly one copy of ``value`` in keyless ``table`` into ``after``."""
        before = self.sample_row(table, value)
        self.db.stage_value_delete(self.txn, table, value)
        self.db.stage_value_insert(self.txn, table, after)
        self.stream.row(self.txn, table, "U", before, after)
