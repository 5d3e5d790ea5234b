"""Table definitions and column types of intermediate files (spec section 3).

A table definition travels in each ``.dat`` file's Parquet metadata under
``cdc.tables``. This module parses and checks those definitions, decides
whether a later definition is a compatible evolution of an earlier one, and
checks that a JSON value fits its column type.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DOUBLE_SPECIALS = frozenset({"NaN", "Infinity", "-Infinity"})
MAX_DECIMAL_PRECISION = 38

_DECIMAL_TYPE = re.compile(r"decimal\((\d+),(\d+)\)")
_DECIMAL_TEXT = re.compile(r"-?\d+(\.\d+)?")
_DATE_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIMESTAMP_TEXT = re.compile(r"(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(\.\d{1,6})?Z")
# One part of a table name: letters, digits, underscore and dollar, nothing that
# could climb out of a directory or break out of a quoted identifier.
_NAME_PART = r"[^\W\d][\w$]*"
_TABLE_NAME = re.compile(rf"({_NAME_PART})\.({_NAME_PART})")
SIMPLE_TYPES = frozenset({"boolean", "int", "bigint", "double", "string", "date", "timestamp", "binary"})


class SchemaError(ValueError):
    """A table definition or value does not follow the spec (the caller adds the file)."""


@dataclass(frozen=True)
class Column:
    """One column of a table definition."""

    name: str
    type: str
    nullable: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "nullable": self.nullable}


@dataclass(frozen=True)
class TableDef:
    """A table's definition as one pair describes it."""

    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def schema_name(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def table_name(self) -> str:
        return self.name.split(".", 1)[1]

    def column(self, name: str) -> Column:
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"columns": [c.to_json() for c in self.columns], "primary_key": list(self.primary_key)}


def decimal_precision_scale(type_name: str) -> tuple[int, int] | None:
    """Return ``(precision, scale)`` of a ``decimal(p,s)`` type name, else None."""
    m = _DECIMAL_TYPE.fullmatch(type_name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_type_name(type_name: object) -> str:
    """Return the type name if the spec knows it, else raise :class:`SchemaError`."""
    if not isinstance(type_name, str):
        raise SchemaError(f"column type {type_name!r} is not a string")
    if type_name in SIMPLE_TYPES:
        return type_name
    ps = decimal_precision_scale(type_name)
    if ps is None:
        raise SchemaError(f"unknown column type {type_name!r}")
    precision, scale = ps
    if not (1 <= precision <= MAX_DECIMAL_PRECISION and 0 <= scale <= precision):
        raise SchemaError(f"column type {type_name!r}: need 1 <= p <= 38 and 0 <= s <= p")
    return type_name


def check_table_name(name: object) -> str:
    """Return a safe ``schema.table`` name, else raise :class:`SchemaError`.

    Table names become directory names and SQL identifiers, so anything other
    than two plain identifiers joined by one dot is refused.
    """
    if not isinstance(name, str) or not _TABLE_NAME.fullmatch(name):
        raise SchemaError(f"table name {name!r} is not a plain schema.table of safe identifiers")
    return name


def parse_table_def(name: str, raw: object) -> TableDef:
    """Build a :class:`TableDef` from one entry of the ``cdc.tables`` metadata."""
    check_table_name(name)
    if not isinstance(raw, Mapping):
        raise SchemaError(f"definition of {name} is not a JSON object")
    raw_columns, raw_pk = raw.get("columns"), raw.get("primary_key")
    if not isinstance(raw_columns, list) or not raw_columns:
        raise SchemaError(f"definition of {name} has no list of columns")
    if not isinstance(raw_pk, list):
        raise SchemaError(f"definition of {name} has no primary_key list")
    columns = []
    for raw_col in raw_columns:
        if not isinstance(raw_col, Mapping):
            raise SchemaError(f"definition of {name}: column {raw_col!r} is not an object")
        col_name, nullable = raw_col.get("name"), raw_col.get("nullable")
        if not isinstance(col_name, str) or not col_name or not col_name.isprintable():
            raise SchemaError(f"definition of {name}: column name {col_name!r} is not allowed")
        if not isinstance(nullable, bool):
            raise SchemaError(f"definition of {name}: column {col_name} has no boolean 'nullable'")
        columns.append(Column(col_name, check_type_name(raw_col.get("type")), nullable))
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        raise SchemaError(f"definition of {name} names a column twice")
    for key in raw_pk:
        if key not in names:
            raise SchemaError(f"definition of {name}: primary key column {key!r} is not a column")
    if len(set(raw_pk)) != len(raw_pk):
        raise SchemaError(f"definition of {name} names a primary key column twice")
    return TableDef(name, tuple(columns), tuple(raw_pk))


def evolution_problem(old: TableDef, new: TableDef) -> str | None:
    """Say why ``new`` is not ``old`` plus added nullable columns; None when it is.

    The old columns must keep their order, types and nullability, the key must
    stay the same, and every added column must be nullable.
    """
    if old.primary_key != new.primary_key:
        return f"primary key changed from {list(old.primary_key)} to {list(new.primary_key)}"
    new_by_name = {c.name: c for c in new.columns}
    for col in old.columns:
        now = new_by_name.get(col.name)
        if now is None:
            return f"column {col.name} was dropped"
        if now != col:
            return f"column {col.name} changed from {col.type} to {now.type}" + (
                "" if now.nullable == col.nullable else f" (nullable {col.nullable} -> {now.nullable})"
            )
    kept = [c.name for c in new.columns if c.name in set(old.column_names)]
    if kept != list(old.column_names):
        return "columns were reordered"
    for col in new.columns:
        if col.name not in old.column_names and not col.nullable:
            return f"added column {col.name} is not nullable"
    return None


def _check_int(lo: int, hi: int) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi

    return check


def _check_double(v: Any) -> bool:
    if isinstance(v, str):
        return v in DOUBLE_SPECIALS
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_date(v: Any) -> bool:
    if not isinstance(v, str) or not _DATE_TEXT.fullmatch(v):
        return False
    try:
        dt.date.fromisoformat(v)
    except ValueError:
        return False
    return True


def _check_timestamp(v: Any) -> bool:
    if not isinstance(v, str):
        return False
    m = _TIMESTAMP_TEXT.fullmatch(v)
    if not m:
        return False
    try:
        dt.datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}")
    except ValueError:
        return False
    return True


def _check_binary(v: Any) -> bool:
    if not isinstance(v, str):
        return False
    try:
        base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _decimal_checker(precision: int, scale: int) -> Callable[[Any], bool]:
    quantum = Decimal(1).scaleb(-scale)
    max_integer_digits = precision - scale

    def check(v: Any) -> bool:
        if not isinstance(v, str) or not _DECIMAL_TEXT.fullmatch(v):
            return False
        try:
            d = Decimal(v)
            exact = d.quantize(quantum) == d
        except InvalidOperation:
            return False
        integer_digits = len(str(abs(int(d)))) if int(d) != 0 else 0
        return exact and integer_digits <= max_integer_digits

    return check


_SIMPLE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "boolean": lambda v: isinstance(v, bool),
    "int": _check_int(INT32_MIN, INT32_MAX),
    "bigint": _check_int(INT64_MIN, INT64_MAX),
    "double": _check_double,
    "string": lambda v: isinstance(v, str),
    "date": _check_date,
    "timestamp": _check_timestamp,
    "binary": _check_binary,
}


def value_checker(type_name: str) -> Callable[[Any], bool]:
    """Return a predicate telling whether a non-null JSON value fits ``type_name``."""
    ps = decimal_precision_scale(type_name)
    if ps is not None:
        return _decimal_checker(*ps)
    return _SIMPLE_CHECKS[type_name]


def tables_metadata(defs: Sequence[TableDef]) -> dict[str, Any]:
    """The ``cdc.tables`` JSON object describing ``defs``."""
    return {d.name: d.to_json() for d in defs}
