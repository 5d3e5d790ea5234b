"""The source database the generator simulates: committed state, locks and table gates.

Rules it enforces, as a database with row locks would:

- a key changed by an open transaction is locked until it ends; no other
  transaction changes it meanwhile;
- a table can be *gated* for a truncate or a schema change: from then on no
  transaction starts changing it, and once every transaction that already
  did has ended, one transaction (or the DDL) owns it alone;
- copies of a value in a table without a key are deleted at most as many
  times as they exist, counting deletes of open transactions;
- committing applies a transaction's changes; rolling back drops them.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from applier.generate.model import BagTable, Key, PkTable, Txn
from applier.generate.values import Row
from applier.intermediate.schema import TableDef

DRAINING = ""  # gate owner while the table waits for its current users to end


class ConflictError(RuntimeError):
    """The generator tried a change the simulated database forbids (a generator bug)."""


class Database:
    """Committed tables plus the locks of open transactions.

    Args:
        definitions: the tables, with and without primary keys.
    """

    def __init__(self, definitions: Iterable[TableDef]) -> None:
        self.pk: dict[str, PkTable] = {}
        self.bags: dict[str, BagTable] = {}
        for definition in definitions:
            if definition.primary_key:
                self.pk[definition.name] = PkTable(definition)
            else:
                self.bags[definition.name] = BagTable(definition)
        self.locks: dict[tuple[str, Key], str] = {}
        self.touchers: dict[str, dict[str, None]] = {name: {} for name in [*self.pk, *self.bags]}
        self.gates: dict[str, str] = {}
        self._ids: dict[str, int] = {}
        self._next_line: dict[int, int] = {}

    def next_id(self, table: str) -> int:
        """A fresh id for ``table``, never handed out again (like a sequence, even on rollback)."""
        value = self._ids.get(table, 0) + 1
        self._ids[table] = value
        return value

    def next_line_no(self, order_id: int) -> int:
        """A line number never used before in order ``order_id``."""
        value = self._next_line.get(order_id, 0) + 1
        self._next_line[order_id] = value
        return value

    def lines_used(self, order_id: int) -> int:
        """The highest line number handed out in order ``order_id`` (0 when none)."""
        return self._next_line.get(order_id, 0)

    def may_touch(self, txn: Txn, table: str) -> bool:
        """Whether ``txn`` may change ``table`` now (gates let only current users on)."""
        gate = self.gates.get(table)
        if gate is None:
            return True
        return gate == txn.xid or (gate == DRAINING and txn.xid in self.touchers[table])

    def gate(self, table: str) -> None:
        """Stop new transactions from changing ``table`` (a truncate or DDL is waiting)."""
        self.gates.setdefault(table, DRAINING)

    def idle(self, table: str) -> bool:
        """Whether no open transaction has changed ``table``."""
        return not self.touchers[table]

    def visible(self, txn: Txn, table: str, key: Key) -> Row | None:
        """The row under ``key`` as ``txn`` sees it (its own changes first), or None."""
        lock = (table, key)
        if lock in txn.overlay:
            return txn.overlay[lock]
        if table in txn.truncated:
            return None
        return self.pk[table].rows.get(key)

    def free_for(self, txn: Txn, table: str, key: Key) -> bool:
        """Whether no other open transaction holds the lock on ``key``."""
        holder = self.locks.get((table, key))
        return holder is None or holder == txn.xid

    def pick(self, txn: Txn, rng: random.Random, table: str, tries: int = 8) -> tuple[Key, Row] | None:
        """A random committed row ``txn`` may change (visible, not locked by others), or None."""
        if not self.may_touch(txn, table):
            return None
        pool = self.pk[table].pool
        for _ in range(tries):
            key = pool.pick(rng)
            if key is None:
                return None
            if self.free_for(txn, table, key):
                row = self.visible(txn, table, key)
                if row is not None:
                    return key, row
        return None

    def stage(self, txn: Txn, table: str, key: Key, row: Row | None) -> None:
        """Lock ``key`` for ``txn`` and record its new row (None = deleted)."""
        holder = self.locks.setdefault((table, key), txn.xid)
        if holder != txn.xid:
            raise ConflictError(f"{table} {key} is locked by {holder}, not {txn.xid}")
        txn.overlay[(table, key)] = row
        self._touch(txn, table)

    def stage_truncate(self, txn: Txn, table: str) -> None:
        """Record that ``txn`` empties ``table``; it must own the table's gate."""
        if self.gates.get(table) != txn.xid or any(x != txn.xid for x in self.touchers[table]):
            raise ConflictError(f"{txn.xid} truncates {table} without owning it")
        for name, key in list(txn.overlay):
            if name == table:
                txn.overlay[(name, key)] = None
        txn.truncated[table] = None
        self._touch(txn, table)

    def pick_value(self, txn: Txn, rng: random.Random, table: str, copies: int = 1, tries: int = 8) -> Key | None:
        """A value of the keyless ``table`` with at least ``copies`` undeleted copies, or None."""
        if not self.may_touch(txn, table):
            return None
        bag = self.bags[table]
        for _ in range(tries):
            value = bag.pool.pick(rng)
            if value is None:
                return None
            if bag.available(value) >= copies:
                return value
        return next((v for v in bag.pool.items() if bag.available(v) >= copies), None) if copies > 1 else None

    def stage_value_delete(self, txn: Txn, table: str, value: Key) -> None:
        """Reserve one committed copy of ``value`` as deleted by ``txn``."""
        bag = self.bags[table]
        if bag.available(value) < 1:
            raise ConflictError(f"{txn.xid} deletes a copy of a {table} row that has none left")
        bag.reserved[value] = bag.reserved.get(value, 0) + 1
        txn.bag_deletes.append((table, value))
        self._touch(txn, table)

    def stage_value_insert(self, txn: Txn, table: str, row: Row) -> None:
        """Record one more copy of ``row`` inserted by ``txn`` into the keyless ``table``."""
        txn.bag_inserts.append((table, row))
        self._touch(txn, table)

    def _touch(self, txn: Txn, table: str) -> None:
        if table not in txn.tables:
            if not self.may_touch(txn, table):
                raise ConflictError(f"{txn.xid} changes the gated table {table}")
            txn.tables[table] = None
            self.touchers[table][txn.xid] = None

    def commit(self, txn: Txn) -> None:
        """Apply ``txn``'s changes to the committed state and release its locks."""
        for table in txn.truncated:
            self.pk[table].clear()
        for (table, key), row in txn.overlay.items():
            self.pk[table].put(key, row)
        for table, value in txn.bag_deletes:
            self.bags[table].remove_one(value)
        for table, row in txn.bag_inserts:
            self.bags[table].add(row)
        self._release(txn)

    def rollback(self, txn: Txn) -> None:
        """Drop ``txn``'s changes and release its locks."""
        self._release(txn)

    def _release(self, txn: Txn) -> None:
        for lock in txn.overlay:
            del self.locks[lock]
        for table, value in txn.bag_deletes:
            reserved = self.bags[table].reserved
            reserved[value] -= 1
            if not reserved[value]:
                del reserved[value]
        for table in txn.tables:
            del self.touchers[table][txn.xid]
        for table in [t for t, owner in self.gates.items() if owner == txn.xid]:
            del self.gates[table]

    def evolve(self, definition: TableDef, fill: Row) -> None:
        """Switch a keyed table to ``definition``, giving committed rows the ``fill`` values.

        Args:
            definition: the table with its added columns.
            fill: the value of each added column in existing rows (null).
        """
        table = self.pk[definition.name]
        if not self.idle(definition.name):
            raise ConflictError(f"schema change of {definition.name} while transactions use it")
        table.definition = definition
        table.rows = {key: {**row, **fill} for key, row in table.rows.items()}
