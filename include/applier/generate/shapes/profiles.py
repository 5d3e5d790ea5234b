"""The shaped profiles: their defaults and the options they take.

Kept apart from the shop profiles (``applier.generate.profiles``), whose
figures describe the shop's transaction mix; a shaped profile is sized by its
table set instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

WIDE = "wide"
MANY_OPEN = "many-open"

# The fewest columns a shaped table may have: a key and two columns to update.
MIN_COLUMNS = 3
MAX_COLUMNS = 1000
MAX_TABLES = 100_000


@dataclass(frozen=True)
class ShapeProfile:
    """Defaults of one shaped profile.

    Attributes:
        name: the name the CLI selects the profile by.
        description: one line for ``applier generate --list-profiles``.
        transactions: default number of ordinary transactions.
        file_size_mb: default pair size (MiB) at which the writer rotates.
        tables: default number of tables.
        columns: default fewest and most columns of a table.
        options: the sizing options (``tables``, ``columns``) a caller may give.
    """

    name: str
    description: str
    transactions: int
    file_size_mb: float
    tables: int
    columns: tuple[int, int]
    options: frozenset[str]


SHAPE_PROFILES: Mapping[str, ShapeProfile] = MappingProxyType(
    {
        WIDE: ShapeProfile(
            name=WIDE,
            description="hundreds of tables of dozens of mixed-type columns (300 of 9-41 by default), "
            "a tenth keyless, skewed concurrent transactions; --tables N, --columns MIN-MAX",
            transactions=1_500,
            file_size_mb=4.0,
            tables=300,
            columns=(9, 41),
            options=frozenset({"tables", "columns"}),
        ),
        MANY_OPEN: ShapeProfile(
            name=MANY_OPEN,
            description="thousands of transactions open at once (4,000 by default, ~25 rows each) "
            "across ~25 small pairs, ending in the last pair or two",
            transactions=4_000,
            file_size_mb=0.25,
            tables=6,
            columns=(4, 9),
            options=frozenset(),
        ),
    }
)


def parse_columns(text: str) -> tuple[int, int]:
    """Parse a ``MIN-MAX`` column range (``10-60``; a single ``N`` means ``N-N``).

    Args:
        text: the range as given on the command line.

    Returns:
        ``(fewest, most)`` columns.

    Raises:
        ValueError: not two integers, fewest above most, or outside the allowed range.
    """
    low, _, high = text.partition("-")
    try:
        fewest, most = int(low), int(high or low)
    except ValueError:
        raise ValueError(f"columns {text!r} is not MIN-MAX, e.g. 10-60") from None
    check_columns((fewest, most))
    return fewest, most


def check_columns(columns: tuple[int, int]) -> None:
    """Refuse a column range a shaped table cannot have.

    Args:
        columns: ``(fewest, most)``.

    Raises:
        ValueError: the range is reversed or outside ``MIN_COLUMNS..MAX_COLUMNS``.
    """
    fewest, most = columns
    if not MIN_COLUMNS <= fewest <= most <= MAX_COLUMNS:
        raise ValueError(f"columns={fewest}-{most} is not allowed; need {MIN_COLUMNS} <= MIN <= MAX <= {MAX_COLUMNS}")


def check_tables(tables: int) -> None:
    """Refuse a table count a shaped workload cannot have.

    Args:
        tables: the number of tables.

    Raises:
        ValueError: fewer than 1 or more than ``MAX_TABLES``.
    """
    if not 1 <= tables <= MAX_TABLES:
        raise ValueError(f"tables={tables} is not allowed; it must be 1 to {MAX_TABLES}")


def check_sizes(transactions: int, file_size_mb: float) -> None:
    """Refuse a workload of no transactions or pairs of no size (every profile, shop or shaped).

    Raises:
        ValueError: naming the value and what is allowed.
    """
    if transactions < 1:
        raise ValueError(f"transactions={transactions} is not allowed; it must be at least 1")
    if not file_size_mb > 0:
        raise ValueError(f"file_size_mb={file_size_mb} is not allowed; it must be positive")
