"""A seeded set of many tables: names, columns of every spec type, key shapes, hotness.

A table of ``n`` columns has its key columns first, then one column of each
spec type it does not hold yet (as far as ``n`` allows), then columns drawn
from a mix weighted towards strings, decimals and integers, as real tables
are. A tenth of the tables have no primary key; some have a two-column key;
the rest a single ``bigint``, ``int`` or ``string`` key. Some keyed tables log
whole before-images (PostgreSQL's ``REPLICA IDENTITY FULL``), the others only
the key. Each table gets a weight from a Zipf-like law over a shuffled rank,
so a few hot tables take most changes and a long tail sees few.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from applier.intermediate.schema import Column, TableDef

SCHEMAS = ("app", "crm", "erp", "ops")
# Every type of the spec; decimal(p,s) is drawn from DECIMALS.
SPEC_TYPES = ("int", "bigint", "boolean", "double", "decimal", "string", "date", "timestamp", "binary")
DECIMALS = ((5, 2), (9, 2), (10, 4), (12, 2), (15, 3), (18, 0), (18, 6), (28, 8), (38, 10), (4, 4))
# Relative weights of the types of the columns beyond one of each.
EXTRA_TYPES = (("string", 5.0), ("decimal", 3.0), ("int", 2.0), ("bigint", 2.0), ("timestamp", 1.5),
               ("boolean", 1.5), ("double", 1.5), ("date", 1.0), ("binary", 0.5))  # fmt: skip
STEMS = {
    "int": ("qty", "level", "count", "rank", "status_no"),
    "bigint": ("ref_id", "account_id", "owner_id", "seq_no"),
    "boolean": ("is_active", "flag", "verified", "archived"),
    "double": ("score", "ratio", "weight", "reading"),
    "decimal": ("amount", "price", "balance", "rate"),
    "string": ("name", "code", "note", "label", "description", "city"),
    "date": ("due_date", "birth_date", "valid_from"),
    "timestamp": ("created_at", "updated_at", "seen_at"),
    "binary": ("payload", "digest", "thumb"),
}
KEY_PREFIXES = ("C-", "SKU", "acct_", "Ü", "ord-", "")
# What a column's values look like beyond its type (see ``values.py``).
FLAVORS = {
    "int": ("small", "medium", "full"),
    "bigint": ("small", "medium", "full"),
    "boolean": ("even", "rare", "often"),
    "double": ("unit", "hundreds", "millions", "huge"),
    "string": ("code", "name", "text"),
    "date": ("recent", "decade"),
    "timestamp": ("hour", "year"),
    "binary": ("blob",),
}
KEYLESS_SHARE = 0.1
COMPOSITE_SHARE = 0.12
SKEW = 1.1  # Zipf exponent: with 1,000 tables the 20 hottest take over half the changes


@dataclass(frozen=True)
class ColumnShape:
    """How one column's values look.

    Attributes:
        column: the column as the spec defines it.
        base: the type without precision (``decimal`` for ``decimal(p,s)``).
        flavor: what its values look like beyond the type (a key of ``FLAVORS``; ``p,s`` for decimals).
        null_rate: the share of values that are null (0 for a non-nullable column).
    """

    column: Column
    base: str
    flavor: str
    null_rate: float


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one object per table
class ShapedTable:
    """One generated table.

    Attributes:
        definition: its definition as the pairs carry it.
        key_kind: ``bigint``, ``int``, ``string``, ``composite`` or ``none``.
        key_base: the offset of its generated ids (large for some bigint keys).
        key_prefix: the text before the number of a generated string key.
        columns: its non-key columns' shapes, in table order.
        full_before: whether updates and deletes log the whole old row.
        weight: its share of the workload's changes (all weights sum to 1).
    """

    definition: TableDef
    key_kind: str
    key_base: int
    key_prefix: str
    columns: tuple[ColumnShape, ...]
    full_before: bool
    weight: float

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def keyed(self) -> bool:
        return bool(self.definition.primary_key)


def _key_columns(kind: str) -> list[Column]:
    if kind == "composite":
        return [Column("parent_id", "bigint", False), Column("line_no", "int", False)]
    if kind == "none":
        return []
    return [Column("id", kind, False)]


def _column(rng: random.Random, base: str, name: str) -> ColumnShape:
    type_name = base
    if base == "decimal":
        precision, scale = rng.choice(DECIMALS)
        flavor, type_name = f"{precision},{scale}", f"decimal({precision},{scale})"
    else:
        flavor = rng.choice(FLAVORS[base])
    nullable = rng.random() < 0.55
    null_rate = rng.uniform(0.03, 0.4) if nullable else 0.0
    return ColumnShape(Column(name, type_name, nullable), base, flavor, null_rate)


def _value_columns(rng: random.Random, count: int, present: set[str]) -> list[ColumnShape]:
    """``count`` columns: one of each type not in ``present`` first (shuffled), then a weighted mix."""
    missing = [t for t in SPEC_TYPES if t not in present]
    rng.shuffle(missing)
    bases = missing[:count]
    kinds, weights = zip(*EXTRA_TYPES, strict=True)
    bases += rng.choices(kinds, weights=weights, k=count - len(bases))
    used: dict[str, int] = {}
    shapes = []
    for base in bases:
        stem = rng.choice(STEMS[base])
        used[stem] = used.get(stem, 0) + 1
        shapes.append(_column(rng, base, stem if used[stem] == 1 else f"{stem}_{used[stem]}"))
    return shapes


def _key_kinds(rng: random.Random, count: int, fewest_columns: int) -> list[str]:
    """Key shapes for ``count`` tables: a tenth keyless, some composite, the rest single keys."""
    keyless = max(1, round(count * KEYLESS_SHARE)) if count >= 2 else 0
    composite = round(count * COMPOSITE_SHARE) if fewest_columns >= 5 else 0
    single = rng.choices(("bigint", "int", "string"), weights=(0.55, 0.25, 0.2), k=count - keyless - composite)
    kinds = ["none"] * keyless + ["composite"] * composite + single
    rng.shuffle(kinds)
    return kinds


def _weights(rng: random.Random, count: int) -> list[float]:
    ranks = list(range(1, count + 1))
    rng.shuffle(ranks)
    raw = [rank**-SKEW for rank in ranks]
    total = sum(raw)
    return [w / total for w in raw]


def build_tables(rng: random.Random, count: int, columns: tuple[int, int]) -> tuple[ShapedTable, ...]:
    """A seeded set of ``count`` tables of ``columns[0]`` to ``columns[1]`` columns each.

    Args:
        rng: the generator's random source.
        count: how many tables.
        columns: fewest and most columns of a table (at least 3; composite keys need 5).

    Returns:
        The tables, in name order of their number (``app.t0001``, ``crm.t0002``, ...).
    """
    width = max(4, len(str(count)))
    kinds, weights = _key_kinds(rng, count, columns[0]), _weights(rng, count)
    tables = []
    for index, (kind, weight) in enumerate(zip(kinds, weights, strict=True)):
        name = f"{SCHEMAS[index % len(SCHEMAS)]}.t{index + 1:0{width}d}"
        key = _key_columns(kind)
        present = {"bigint", "int"} if kind == "composite" else {c.type for c in key}
        shapes = _value_columns(rng, rng.randint(*columns) - len(key), present)
        definition = TableDef(name, (*key, *(s.column for s in shapes)), tuple(c.name for c in key))
        key_base = rng.choice((0, 0, 10_000_000_000, 2**40)) if kind in ("bigint", "composite") else 0
        key_prefix = rng.choice(KEY_PREFIXES) if kind == "string" else ""
        full_before = kind == "none" or rng.random() < 0.3
        tables.append(ShapedTable(definition, kind, key_base, key_prefix, tuple(shapes), full_before, weight))
    return tuple(tables)
