"""Informix Enterprise Replication's queue arithmetic, as plain functions (no I/O).

ER sizes its send and receive queues (``CDR_QUEUEMEM``) by what a transaction
occupies in memory: a transaction header, then per row a row header, a hash
option and the row itself, expanded to its full width. Two layouts are kept as
data: the 32-bit one of the article's worked figures (52-byte row header,
4-byte hash option, 258-byte transaction header) and the 64-bit one the
Applier uses by default (60, 4 and 292 bytes).

    single-row transaction = row header + hash + row size + transaction header
    n-row transaction      = transaction header + n x (row header + hash + row size)
    transactions that fit  = budget // single-row transaction
    rows one transaction can hold = (budget - transaction header) // (row header + hash + row size)

The article's "4 MB" is 4,292,608 bytes, not 4 MiB: its four worked figures
(customer table, 134-byte rows: 9,581 single-row transactions or one of 22,591
inserts; warehouses table, 4,106-byte rows: 971 or one of 1,031) hold together
only for a budget between 4,292,548 and 4,292,735 bytes, and 4,292,608 =
4 x 1,048 x 1,024 lies in that range: 1 MB was taken as 1,048 KiB (the first
digits of 1,048,576 read as kilobytes). With 4 MiB (4,194,304 bytes) the first
figure would be 9,362. :data:`ARTICLE_4MB` keeps that byte count.

Row sizes: fixed widths per spec type (:data:`FIXED_WIDTHS`; a
``decimal(p,s)`` by Informix's DECIMAL storage rule, :func:`decimal_bytes`);
``string`` and ``binary`` columns have no fixed width and are counted by the
caller at their observed maximum byte length.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from applier.intermediate.schema import decimal_precision_scale


@dataclass(frozen=True)
class Layout:
    """The bytes ER adds around the rows of a queued transaction.

    Attributes:
        name: how the layout is called in reports.
        row_header: bytes per row before its data.
        hash_option: bytes per row of the hash option.
        transaction_header: bytes per transaction.
    """

    name: str
    row_header: int
    hash_option: int
    transaction_header: int

    @property
    def row_overhead(self) -> int:
        """Bytes each row adds besides its data: row header + hash option."""
        return self.row_header + self.hash_option


LAYOUT_32 = Layout("32-bit", row_header=52, hash_option=4, transaction_header=258)
LAYOUT_64 = Layout("64-bit", row_header=60, hash_option=4, transaction_header=292)
LAYOUTS: Mapping[int, Layout] = {32: LAYOUT_32, 64: LAYOUT_64}
DEFAULT_LAYOUT = LAYOUT_64

# "4 MB" as the article counted it: 4 x 1,048 x 1,024 bytes (see the module docstring).
ARTICLE_MB = 1048 * 1024
ARTICLE_4MB = 4 * ARTICLE_MB

# Bytes of each fixed-width spec type; string and binary are variable-length.
FIXED_WIDTHS: Mapping[str, int] = {
    "boolean": 1,
    "int": 4,
    "bigint": 8,
    "double": 8,
    "date": 4,
    "timestamp": 8,
}
VARIABLE_TYPES = frozenset({"string", "binary"})


def decimal_bytes(precision: int, scale: int) -> int:
    """Bytes of a ``decimal(p,s)`` by Informix's DECIMAL storage rule.

    One byte holds two digits, the integer and fraction digits are packed
    apart, and one byte holds the sign and exponent: ``(p + 3) // 2`` bytes
    for an even scale, ``(p + 4) // 2`` for an odd one (``decimal(6,3)``: 5,
    ``decimal(12,2)``: 7). Informix stops at 32 digits; the spec's 38-digit
    decimals follow the same rule (``decimal(38,0)``: 20).

    Args:
        precision: total digits, 1 to 38.
        scale: fraction digits, 0 to ``precision``.

    Returns:
        The bytes one value takes.
    """
    return (precision + (4 if scale % 2 else 3)) // 2


def column_bytes(type_name: str) -> int | None:
    """The fixed width of a spec type, or None for a variable-length one (string, binary).

    Raises:
        ValueError: the type is not a spec type.
    """
    if type_name in FIXED_WIDTHS:
        return FIXED_WIDTHS[type_name]
    if type_name in VARIABLE_TYPES:
        return None
    ps = decimal_precision_scale(type_name)
    if ps is None:
        raise ValueError(f"{type_name!r} is not a spec type")
    return decimal_bytes(*ps)


def expanded_row_size(column_types: Iterable[tuple[str, str]], observed_max: Mapping[str, int]) -> int:
    """A row's full width: fixed widths plus each variable-length column at its observed maximum.

    Args:
        column_types: ``(column name, spec type)`` in table order.
        observed_max: observed maximum byte length per variable-length column;
            a column never observed counts 0.

    Returns:
        The expanded row size in bytes.
    """
    total = 0
    for name, type_name in column_types:
        width = column_bytes(type_name)
        total += observed_max.get(name, 0) if width is None else width
    return total


def row_entry_bytes(layout: Layout, row_size: int) -> int:
    """What one row takes in a queued transaction: row header + hash option + row size."""
    return layout.row_overhead + row_size


def single_row_transaction_bytes(layout: Layout, row_size: int) -> int:
    """Memory of a one-row transaction: row header + hash option + row size + transaction header."""
    return row_entry_bytes(layout, row_size) + layout.transaction_header


def transaction_bytes(layout: Layout, row_size: int, rows: int) -> int:
    """Memory of a transaction of ``rows`` rows of one table: header + rows x (row header + hash + row size)."""
    return layout.transaction_header + rows * row_entry_bytes(layout, row_size)


def mixed_transaction_bytes(layout: Layout, rows_by_size: Iterable[tuple[int, int]]) -> int:
    """Memory of a transaction over several tables: header + the sum of rows x entry per ``(row size, rows)``."""
    return layout.transaction_header + sum(rows * row_entry_bytes(layout, size) for size, rows in rows_by_size)


def transactions_that_fit(budget: int, transaction_size: int) -> int:
    """How many transactions of ``transaction_size`` bytes fit in ``budget`` bytes (whole transactions).

    Raises:
        ValueError: ``transaction_size`` is not positive.
    """
    if transaction_size <= 0:
        raise ValueError(f"a transaction takes at least its header; got {transaction_size} bytes")
    return max(0, budget) // transaction_size


def rows_that_fit(layout: Layout, row_size: int, budget: int) -> int:
    """The most rows one transaction of one table can hold in ``budget`` bytes (after its header)."""
    return max(0, budget - layout.transaction_header) // row_entry_bytes(layout, row_size)


def percentile(values: Sequence[int], fraction: float) -> int:
    """The nearest-rank percentile of ``values``: the smallest value at least ``fraction`` of them do not exceed.

    Args:
        values: the observations, in any order.
        fraction: 0 < fraction <= 1 (0.99 for the 99th percentile).

    Returns:
        The percentile; 0 when there is no observation.
    """
    if not values:
        return 0
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class StrategyBudget:
    """The article's queue budgets for a machine's memory, in bytes.

    Attributes:
        update_anywhere: 1/8 to 1/6 of the memory per queue.
        source_to_target: 200 to 250 MB of each 1 GB (MiB of GiB), the
            Applier's case (changes flow one way, from the source to the target).
    """

    update_anywhere: tuple[int, int]
    source_to_target: tuple[int, int]


def strategy_budget(memory_bytes: int) -> StrategyBudget:
    """The article's queue budgets scaled to ``memory_bytes`` (the Applier's driver memory)."""
    return StrategyBudget(
        update_anywhere=(memory_bytes // 8, memory_bytes // 6),
        source_to_target=(memory_bytes * 200 // 1024, memory_bytes * 250 // 1024),
    )
