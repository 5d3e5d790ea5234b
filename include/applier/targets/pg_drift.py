"""Drift: a PostgreSQL target table changed by hand so that applying to it could lose data.

What a table definition maps to (:func:`applier.targets.pg_sql.pg_type`) is
compared with what ``information_schema.columns`` says the table holds. A
column may be wider than mapped (a larger numeric, ``bigint`` for
``integer``, ``varchar`` without a length for ``text``); anything that could
round, cut or refuse values the source holds is drift:

- a column missing;
- another type, or a narrower one: a numeric of smaller scale (21.37 would
  become 21.00) or fewer integer digits, a ``varchar(n)``;
- ``NOT NULL`` on a column the source lets be null, or on a column the source
  does not have, without a default.

Drift stops the run (exit 4) before the table is written, naming the table,
the column, and the expected and found types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from applier.intermediate.schema import TableDef, decimal_precision_scale
from applier.targets.pg_sql import pg_type

COLUMNS_QUERY = (
    "SELECT column_name, data_type, character_maximum_length, numeric_precision, numeric_scale, "
    "is_nullable = 'YES', column_default IS NOT NULL "
    "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position"
)

# information_schema's data_type of each mapped type that is not a numeric.
_DATA_TYPES = {
    "boolean": ("boolean",),
    "integer": ("integer", "bigint"),
    "bigint": ("bigint",),
    "double precision": ("double precision",),
    "text": ("text", "character varying"),
    "date": ("date",),
    "timestamptz": ("timestamp with time zone",),
    "bytea": ("bytea",),
}


@dataclass(frozen=True)
class FoundColumn:
    """A column as ``information_schema.columns`` describes it (a row of :data:`COLUMNS_QUERY`)."""

    name: str
    data_type: str
    max_length: int | None
    precision: int | None
    scale: int | None
    nullable: bool
    has_default: bool

    def describe(self) -> str:
        if self.data_type == "numeric":
            shown = f"numeric({self.precision},{self.scale})" if self.precision is not None else "numeric"
        elif self.max_length is not None:
            shown = f"{self.data_type}({self.max_length})"
        else:
            shown = self.data_type
        return shown + ("" if self.nullable else " not null")


def drift(table: TableDef, found: Sequence[FoundColumn], *, before_evolution: bool = False) -> str | None:
    """What makes the target table unsafe to apply ``table``'s changes to, or None.

    ``before_evolution``: a nullable column the table lacks is no drift (at the
    start of a run, a definition may hold columns no applied change has
    brought yet; they are added when a cycle next touches the table).
    """
    by_name = {c.name: c for c in found}
    for column in table.columns:
        expected = pg_type(column.type)
        have = by_name.get(column.name)
        if have is None and before_evolution and column.nullable:
            continue
        if have is None:
            return f"column {column.name}: expected {expected}, found no such column"
        if not _holds(expected, column.type, have):
            return f"column {column.name}: expected {expected}, found {have.describe()}"
        if column.nullable and not have.nullable:
            return f"column {column.name}: expected {expected} (nullable), found {have.describe()}"
    wanted = set(table.column_names)
    for extra in found:
        if extra.name not in wanted and not extra.nullable and not extra.has_default:
            return f"column {extra.name}: not in the source, found {extra.describe()} without a default"
    return None


def _holds(expected: str, spec_type: str, have: FoundColumn) -> bool:
    """Whether ``have`` takes every value of the spec type without loss."""
    ps = decimal_precision_scale(spec_type)
    if ps is not None:
        if have.data_type != "numeric":
            return False
        if have.precision is None:
            return True  # unconstrained numeric
        precision, scale = ps
        return have.scale is not None and have.scale >= scale and have.precision - have.scale >= precision - scale
    if have.data_type not in _DATA_TYPES[expected]:
        return False
    return have.max_length is None  # a varchar with a length would refuse longer text
