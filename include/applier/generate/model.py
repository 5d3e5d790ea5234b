"""A small model of the source database the generated stream comes from.

It holds the committed rows of every table and each open transaction's private
changes, and enforces what a real database would: a row changed by an open
transaction is locked until that transaction ends; a truncate owns its whole
table; a rolled-back transaction leaves nothing behind. The generator asks the
model what may be done before it writes a change, so every change it writes is
one the source could have logged.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from applier.generate.values import Row
from applier.intermediate.schema import TableDef

Key = tuple[Any, ...]
K = TypeVar("K", bound=Hashable)


class KeyPool(Generic[K]):
    """A set with O(1) add, remove and uniform random pick, iterated in a fixed order.

    Plain sets of strings iterate in a per-process order; this keeps the
    generator deterministic for a seed.
    """

    def __init__(self) -> None:
        self._items: list[K] = []
        self._index: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item: object) -> bool:
        return item in self._index

    def add(self, item: K) -> None:
        """Add ``item`` unless present."""
        if item not in self._index:
            self._index[item] = len(self._items)
            self._items.append(item)

    def discard(self, item: K) -> None:
        """Remove ``item`` if present (the last item takes its slot)."""
        at = self._index.pop(item, None)
        if at is None:
            return
        last = self._items.pop()
        if at < len(self._items):
            self._items[at] = last
            self._index[last] = at

    def pick(self, rng: random.Random) -> K | None:
        """A uniformly chosen item, or None when empty."""
        # random() scaled is several times cheaper than randrange() and just as deterministic.
        return self._items[int(rng.random() * len(self._items))] if self._items else None

    def items(self) -> list[K]:
        """The items, in the pool's current order."""
        return list(self._items)


class PkTable:
    """Committed rows of a table with a primary key, by key tuple.

    Args:
        definition: the table's current definition.
    """

    def __init__(self, definition: TableDef) -> None:
        self.definition = definition
        self.key_columns = definition.primary_key
        self.rows: dict[Key, Row] = {}
        self.pool: KeyPool[Key] = KeyPool()

    def key_of(self, row: Row) -> Key:
        """The key tuple of ``row``."""
        return tuple(row[c] for c in self.key_columns)

    def key_image(self, row: Row) -> Row:
        """Just the key columns of ``row``, as a key-only before-image."""
        return {c: row[c] for c in self.key_columns}

    def put(self, key: Key, row: Row | None) -> None:
        """Store ``row`` under ``key``, or remove the key when ``row`` is None."""
        if row is None:
            if self.rows.pop(key, None) is not None:
                self.pool.discard(key)
        else:
            if key not in self.rows:
                self.pool.add(key)
            self.rows[key] = row

    def clear(self) -> None:
        """Empty the table (a committed truncate)."""
        self.rows.clear()
        self.pool = KeyPool()


class BagTable:
    """Committed rows of a table without a primary key: a multiset of row values.

    Copies of one value are interchangeable, so the table keeps a count per
    value and how many of them open transactions have already deleted.

    Args:
        definition: the table's definition.
    """

    def __init__(self, definition: TableDef) -> None:
        self.definition = definition
        self.columns = definition.column_names
        self.counts: dict[Key, int] = {}
        self.samples: dict[Key, Row] = {}
        self.reserved: dict[Key, int] = {}
        self.pool: KeyPool[Key] = KeyPool()

    def value_of(self, row: Row) -> Key:
        """The value tuple identifying ``row``'s copies."""
        return tuple(row[c] for c in self.columns)

    def available(self, value: Key) -> int:
        """Committed copies of ``value`` no open transaction has deleted."""
        return self.counts.get(value, 0) - self.reserved.get(value, 0)

    def add(self, row: Row) -> None:
        """One more committed copy of ``row``."""
        value = self.value_of(row)
        self.counts[value] = self.counts.get(value, 0) + 1
        self.samples.setdefault(value, row)
        self.pool.add(value)

    def remove_one(self, value: Key) -> None:
        """One committed copy of ``value`` fewer."""
        left = self.counts[value] - 1
        if left:
            self.counts[value] = left
        else:
            del self.counts[value], self.samples[value]
            self.pool.discard(value)


@dataclass(eq=False)
class Txn:
    """One source transaction and its private, uncommitted changes.

    Attributes:
        xid: the transaction id written to the stream.
        overlay: ``(table, key) -> row`` (None = deleted) for keys it locked.
        bag_inserts: rows it inserted into tables without a key.
        bag_deletes: values whose copies it deleted (reserved until it ends).
        truncated: tables it truncated.
        tables: tables it changed (in first-touch order).
        rows: row changes written so far.
        begun: whether its ``begin`` is written (it is written just before its first row).
        pairs: sequence numbers of the pairs holding its rows.
    """

    xid: str
    overlay: dict[tuple[str, Key], Row | None] = field(default_factory=dict)
    bag_inserts: list[tuple[str, Row]] = field(default_factory=list)
    bag_deletes: list[tuple[str, Key]] = field(default_factory=list)
    truncated: dict[str, None] = field(default_factory=dict)
    tables: dict[str, None] = field(default_factory=dict)
    rows: int = 0
    begun: bool = False
    pairs: set[int] = field(default_factory=set)
