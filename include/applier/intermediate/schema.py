"""Table definitions and column types of intermediate files (spec section 3).

A table definition travels in each ``.dat`` file's Parquet metadata under
``cdc.tables``. This module parses and checks those definitions, decides
whether a later definition is a compatible evolution of an earlier one, and
checks that a JSON value fits its column type.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, Literal

import msgspec

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DOUBLE_SPECIALS = frozenset({"NaN", "Infinity", "-Infinity"})
MAX_DECIMAL_PRECISION = 38

_DECIMAL_TYPE = re.compile(r"decimal\((\d+),(\d+)\)")
# A calendar date YYYY-MM-DD (years 0001-9999) with the right number of days in
# its month, February 29 in leap years only.
_LEAP_DAY = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29"
_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
_MONTH_DAY = r"(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
DATE_PATTERN = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_DAY})"
# ISO 8601 in UTC with Z, at most microseconds.
TIMESTAMP_PATTERN = rf"{DATE_PATTERN}T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{{1,6}})?Z"
# Standard base64 with padding.
BINARY_PATTERN = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
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

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its JSON text, unpickled once per process and text: Spark ships a cycle's definitions
        # (thousands, with their columns) to every task of the compile, where rebuilding each column's object
        # cost more than checking a small pair.
        columns = [(c.name, c.type, c.nullable) for c in self.columns]
        return _table_def_of, (self.name, _ENCODE((columns, self.primary_key)))


_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.Decoder(tuple[list[tuple[str, str, bool]], tuple[str, ...]]).decode


@functools.lru_cache(maxsize=8192)
def _table_def_of(name: str, text: bytes) -> TableDef:
    """The :class:`TableDef` a pickle holds (see ``TableDef.__reduce__``)."""
    columns, primary_key = _DECODE(text)
    return TableDef(name, tuple(Column(*column) for column in columns), primary_key)


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


def tables_metadata_of(metadata: bytes) -> Mapping[str, TableDef]:
    """A ``cdc.tables`` value parsed, once for the run's pairs that carry the same one.

    Each pair carries the definitions of the tables it touches, so consecutive
    pairs' values differ; an equal definition is still one object, whichever
    pair brought it (comparing them, in the stream's schema checks and the
    executors' image rules, is then an identity test). A few values parsed
    are kept, by a digest of their text: the text is megabytes for a
    1,000-table source.

    Raises:
        SchemaError: a table's name is not safe; ValueError: the value is not a valid ``cdc.tables``.
    """
    digest = hashlib.blake2b(metadata, digest_size=16).digest()
    parsed = _PARSED.pop(digest, None)
    if parsed is None:
        parsed = _parse_tables(metadata)
    _PARSED[digest] = parsed  # the most recent last
    while len(_PARSED) > _PARSED_KEPT:
        del _PARSED[next(iter(_PARSED))]
    return parsed


_PARSED: dict[bytes, Mapping[str, TableDef]] = {}
_PARSED_KEPT = 16


def _parse_tables(metadata: bytes) -> Mapping[str, TableDef]:
    raw_tables = json.loads(metadata)
    if not isinstance(raw_tables, dict):
        raise ValueError("cdc.tables is not a JSON object")
    for name in raw_tables:
        check_table_name(name)
    try:
        return MappingProxyType({name: _shared(parse_table_def(name, raw)) for name, raw in raw_tables.items()})
    except SchemaError as e:
        raise ValueError(str(e)) from e


@functools.lru_cache(maxsize=8192)
def _shared(definition: TableDef) -> TableDef:
    """The first object seen of an equal definition (one per table, however many pairs carry it)."""
    return definition


def evolution_problem(old: TableDef, new: TableDef) -> str | None:
    """Say why ``new`` is not ``old`` plus added nullable columns; None when it is.

    The old columns must keep their order, types and nullability, the key must
    stay the same, and every added column must be nullable.
    """
    if old == new:  # the usual case, and cheap when the pairs share their definitions (one object each)
        return None
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


def decimal_pattern(precision: int, scale: int) -> str:
    """Exact decimal text of at most ``precision - scale`` integer and ``scale`` fraction digits.

    Leading zeros and trailing fraction zeros do not count: the value must be
    exactly representable, the text need not be minimal.
    """
    integer = f"0*[0-9]{{1,{precision - scale}}}" if precision > scale else "0+"
    fraction = f"(?:\\.[0-9]{{1,{scale}}}0*)?" if scale else "(?:\\.0+)?"
    return f"-?{integer}{fraction}"


_VALUE_TYPES: dict[str, Any] = {
    "boolean": bool,
    "int": Annotated[int, msgspec.Meta(ge=INT32_MIN, le=INT32_MAX)],
    "bigint": Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)],
    "double": float | Literal["NaN", "Infinity", "-Infinity"],
    "string": str,
}
_TEXT_PATTERNS = {"date": DATE_PATTERN, "timestamp": TIMESTAMP_PATTERN, "binary": BINARY_PATTERN}


def value_pattern(type_name: str) -> str | None:
    """The regular expression a JSON string of ``type_name`` must match whole (None: not a text-encoded type).

    Dates, timestamps, binaries and decimals are JSON strings of a given form.
    The expression is not anchored, and reads the same in Python's ``re`` and
    in RE2 (ASCII classes, groups, counted repeats): anchor it with ``^...\\Z``
    in Python (its ``$`` also matches before a final newline) and ``^...$`` in RE2.
    """
    ps = decimal_precision_scale(type_name)
    pattern = decimal_pattern(*ps) if ps is not None else _TEXT_PATTERNS.get(type_name)
    return None if pattern is None else f"(?:{pattern})"


def value_type(type_name: str) -> Any:
    """The msgspec type that accepts exactly the spec's JSON encoding of ``type_name``.

    Decoding is strict: no number for a string, no string for a number, no
    boolean for an integer; doubles accept numbers and the three special strings;
    a text-encoded value matches its form whole (not even a newline after it).
    """
    pattern = value_pattern(type_name)
    return _VALUE_TYPES[type_name] if pattern is None else Annotated[str, msgspec.Meta(pattern=f"^{pattern}\\Z")]


def value_checker(type_name: str) -> Callable[[Any], bool]:
    """A predicate telling whether a non-null JSON value fits ``type_name``."""
    kind = value_type(type_name)

    def check(v: Any) -> bool:
        try:
            msgspec.convert(v, kind, strict=True)
        except msgspec.ValidationError:
            return False
        return True

    return check


def tables_metadata(defs: Sequence[TableDef]) -> dict[str, Any]:
    """The ``cdc.tables`` JSON object describing ``defs``."""
    return {d.name: d.to_json() for d in defs}
