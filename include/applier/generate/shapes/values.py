"""Values of the shaped tables' columns, in the spec's JSON encoding.

Values come from seeded pools shared by every column of one type and flavor
(2,048 values each), as real columns repeat values, so a row of
sixty columns costs one list comprehension rather than sixty value
generators: that is what keeps a million changes over a thousand tables
within a minute or two. Strings range over empty, short codes, names and long
texts in many scripts (accents, Cyrillic, Greek, CJK, Arabic, emoji); pools
hold the edges in small shares: double NaN, infinities and -0.0, integers at
their type's limits, decimals of all nines, empty binaries.

Nulls follow each nullable column's rate through a handful of null patterns
per table: a row takes one pattern, and a null column draws from a pool of
nulls.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import random
from collections.abc import Sequence
from typing import Any

from applier.generate.clock import EPOCH, SimClock
from applier.generate.shapes.tables import ColumnShape, ShapedTable
from applier.generate.values import FIRST_NAMES, LAST_NAMES, Row, date_text, decimal_text

Pool = Sequence[Any]

POOL_BITS = 11
POOL_SIZE = 1 << POOL_BITS  # every pool holds exactly this many values, so a draw is one getrandbits
NULL_PATTERNS = 32  # per table
NULLS: Pool = (None,) * POOL_SIZE
INT_LIMITS = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
INT_SPANS = {"small": 100, "medium": 10_000}
DOUBLE_SCALES = {"unit": (1.0, 6), "hundreds": (100.0, 4), "millions": (1e6, 2), "huge": (1e15, 0)}
DOUBLE_EDGES: tuple[float | str, ...] = ("NaN", "Infinity", "-Infinity", -0.0) * 3
BOOLEAN_SHARES = {"even": 10, "rare": 2, "often": 18}  # trues of 20
DAY_SPANS = {"recent": 365, "decade": 3650}
SECOND_SPANS = {"hour": 3_600, "year": 400 * 86_400}
WORDS = (
    "order", "Straße", "café", "東京", "данные", "ελληνικά", "🚀", "naïve", "über", "São Paulo", "Kraków",
    "データ", "مرحبا", "réservation", "Ørsted", "shipment", "invoice", "пример", "ümlaut", "🌸", "北京市",
    "señal", "çok", "delivery", "note", "Ελλάδα", "x", "",
)  # fmt: skip
CODE_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789ÄÖÜÉ-_"
_DAY_US = 86_400_000_000


@functools.lru_cache(maxsize=8192)
def _day_prefix(day: int) -> str:
    return f"{(EPOCH + dt.timedelta(days=day)).date().isoformat()}T"


def timestamp_text(micros: int) -> str:
    """Microseconds since the epoch as spec text, a few times cheaper than formatting a datetime.

    Args:
        micros: microseconds since 1970-01-01T00:00:00Z (not before it).

    Returns:
        ``YYYY-MM-DDTHH:MM:SS.ffffffZ``.
    """
    seconds, fraction = divmod(micros, 1_000_000)
    day, seconds = divmod(seconds, 86_400)
    hour, seconds = divmod(seconds, 3_600)
    minute, second = divmod(seconds, 60)
    return f"{_day_prefix(day)}{hour:02d}:{minute:02d}:{second:02d}.{fraction:06d}Z"


def _text(rng: random.Random, most_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, most_words))).strip()


def _strings(rng: random.Random, flavor: str) -> list[str]:
    if flavor == "code":
        return ["", *("".join(rng.choice(CODE_CHARS) for _ in range(rng.randint(1, 8))) for _ in range(255))]
    if flavor == "name":
        return ["", *(f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}" for _ in range(511))]
    return ["", *(_text(rng, rng.choice((3, 12, 60))) for _ in range(511))]


def _numbers(rng: random.Random, base: str, flavor: str) -> list[Any]:
    if base in INT_LIMITS:
        low, high = INT_LIMITS[base]
        if flavor in INT_SPANS:
            return [int(rng.random() * INT_SPANS[flavor]) for _ in range(POOL_SIZE)]
        return [*((low, high, 0, -1) * 2), *(rng.randint(low, high) for _ in range(POOL_SIZE))]
    if base == "double":
        scale, digits = DOUBLE_SCALES[flavor]
        return [*DOUBLE_EDGES, *(round((rng.random() - 0.3) * scale, digits) for _ in range(POOL_SIZE))]
    precision, scale = (int(p) for p in flavor.split(","))
    most, typical = 10**precision - 1, 10 ** min(precision, 6 + scale, 15)
    drawn = (int(rng.random() * typical) * (-1 if rng.random() < 0.2 else 1) for _ in range(POOL_SIZE))
    return [decimal_text(units, scale) for units in (most, -most, 0, *drawn)]


class ShapedValues:
    """Builds rows, keys and changed rows of :class:`ShapedTable` tables.

    Args:
        rng: the generator's single random source.
        clock: simulated time; pooled dates and timestamps lie before its start.
    """

    def __init__(self, rng: random.Random, clock: SimClock) -> None:
        self.rng = rng
        self.start_us = clock.now_us
        self._pools: dict[tuple[str, str], Pool] = {}
        self._layouts: dict[str, tuple[tuple[str, ...], tuple[tuple[Pool, ...], ...], tuple[Pool, ...]]] = {}

    def pool(self, shape: ColumnShape) -> Pool:
        """The shared pool of values of columns shaped like ``shape`` (made on first use)."""
        found = self._pools.get((shape.base, shape.flavor))
        if found is None:
            values = self._make_pool(shape.base, shape.flavor)  # edges first: they survive the cut to size
            repeats = -(-POOL_SIZE // len(values))
            found = self._pools[(shape.base, shape.flavor)] = tuple((values * repeats)[:POOL_SIZE])
        return found

    def _make_pool(self, base: str, flavor: str) -> list[Any]:
        rng = self.rng
        if base == "string":
            return _strings(rng, flavor)
        if base == "binary":
            return ["", *(base64.b64encode(rng.randbytes(rng.randint(1, 48))).decode("ascii") for _ in range(127))]
        if base == "boolean":
            trues = BOOLEAN_SHARES[flavor]
            return [True] * trues + [False] * (20 - trues)
        if base == "date":
            days = DAY_SPANS[flavor]
            return [date_text(self.start_us - int(rng.random() * days) * _DAY_US) for _ in range(POOL_SIZE)]
        if base == "timestamp":
            span = SECOND_SPANS[flavor] * 1_000_000
            return [timestamp_text(self.start_us - int(rng.random() * span)) for _ in range(POOL_SIZE)]
        return _numbers(rng, base, flavor)

    def _layout(self, table: ShapedTable) -> tuple[tuple[str, ...], tuple[tuple[Pool, ...], ...], tuple[Pool, ...]]:
        """Column names, the table's null patterns (a pool per column) and each column's own pool."""
        layout = self._layouts.get(table.name)
        if layout is None:
            names = tuple(s.column.name for s in table.columns)
            pools = tuple(self.pool(s) for s in table.columns)
            rnd = self.rng.random
            patterns = tuple(
                tuple(NULLS if rnd() < s.null_rate else p for s, p in zip(table.columns, pools, strict=True))
                for _ in range(NULL_PATTERNS)
            )
            layout = self._layouts[table.name] = (names, patterns, pools)
        return layout

    def key(self, table: ShapedTable, n: int) -> Row:
        """The key columns of the ``n``-th row ever made for ``table`` (never seen before for a new ``n``)."""
        kind = table.key_kind
        if kind == "composite":
            return {"parent_id": table.key_base + n // 4, "line_no": n % 4 + 1}
        if kind == "string":
            return {"id": f"{table.key_prefix}{n:07d}"}
        if kind == "none":
            return {}
        return {"id": table.key_base + n}

    def row(self, table: ShapedTable, key: Row) -> Row:
        """A new row of ``table`` under ``key`` (``{}`` for a keyless table)."""
        names, patterns, _ = self._layout(table)
        draw = self.rng.getrandbits
        pattern = patterns[int(self.rng.random() * NULL_PATTERNS)]
        row = dict(key)
        row.update(zip(names, [p[draw(POOL_BITS)] for p in pattern], strict=True))
        return row

    def changed(self, table: ShapedTable, row: Row) -> Row:
        """``row`` with one to three of its non-key columns given new values (or nulls, at their rates)."""
        names, _, pools = self._layout(table)
        rnd = self.rng.random
        new = dict(row)
        for _ in range(1 + int(rnd() * 3)):
            at = int(rnd() * len(names))
            pool = NULLS if rnd() < table.columns[at].null_rate else pools[at]
            new[names[at]] = pool[self.rng.getrandbits(POOL_BITS)]
        return new
