"""PostgreSQL column types to spec types, and their text values to the spec's JSON encoding.

pgoutput sends every value in its type's text output form, as the decoding
session prints it; :data:`SESSION_SETTINGS` fixes the settings that shape that
text (ISO dates, UTC, shortest exact floats, hex bytea), so this module is a
pure function of the text. The mapping is documented in one table, the
README's "Extracting from PostgreSQL" (types section); a type not in it, or a
value its spec type cannot hold exactly, raises :class:`UnmappableError`, and
the decoder names the table and column. ``timestamp without time zone`` is
read as UTC.
"""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Callable
from typing import Any

from applier.intermediate.schema import decimal_pattern

# Settings of the decoding session: the output functions pgoutput calls print with them.
SESSION_SETTINGS = {
    "client_encoding": "UTF8",  # pgoutput converts names and values to the client's encoding; the parser reads UTF-8
    "DateStyle": "ISO, YMD",
    "TimeZone": "UTC",
    "extra_float_digits": "1",
    "bytea_output": "hex",
}
UNCONSTRAINED_NUMERIC = "decimal(38,18)"
MAX_PRECISION = 38

_BOOL, _BYTEA, _NAME, _INT8, _INT2, _INT4, _TEXT = 16, 17, 19, 20, 21, 23, 25
_JSON, _FLOAT4, _FLOAT8, _BPCHAR, _VARCHAR = 114, 700, 701, 1042, 1043
_DATE, _TIMESTAMP, _TIMESTAMPTZ, _NUMERIC, _UUID, _JSONB = 1082, 1114, 1184, 1700, 2950, 3802

_SIMPLE: dict[int, str] = {
    _BOOL: "boolean",
    _INT2: "int",
    _INT4: "int",
    _INT8: "bigint",
    _FLOAT4: "double",
    _FLOAT8: "double",
    _BYTEA: "binary",
    _DATE: "date",
    _TIMESTAMP: "timestamp",
    _TIMESTAMPTZ: "timestamp",
    **dict.fromkeys((_TEXT, _VARCHAR, _BPCHAR, _NAME, _UUID, _JSON, _JSONB), "string"),
}
_DATE_TEXT = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIMESTAMP_TEXT = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2}) ([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,6}))?(\+00)?")
_DOUBLE_SPECIALS = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}


class UnmappableError(ValueError):
    """A type or value no spec type holds exactly (the decoder adds the table and column)."""


def spec_type(type_oid: int, typmod: int) -> str:
    """The spec type of a PostgreSQL column type (its OID and type modifier).

    Raises:
        UnmappableError: no spec type holds the type's values exactly.
    """
    if type_oid in _SIMPLE:
        return _SIMPLE[type_oid]
    if type_oid == _NUMERIC:
        if typmod < 4:
            return UNCONSTRAINED_NUMERIC
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
        if precision > MAX_PRECISION or scale > precision:
            raise UnmappableError(f"numeric({precision},{scale}) has no spec type (decimal holds precision <= 38)")
        return f"decimal({precision},{scale})"
    raise UnmappableError(f"type oid {type_oid} has no spec type")


def _float4(text: str) -> float | str:
    if text in _DOUBLE_SPECIALS:
        return _DOUBLE_SPECIALS[text]
    # The shortest text that reads back as the float4; its exact value is the float4 itself.
    result: float = struct.unpack("<f", struct.pack("<f", float(text)))[0]
    return result


def _float8(text: str) -> float | str:
    return _DOUBLE_SPECIALS.get(text) or float(text)


def _date(text: str) -> str:
    found = _DATE_TEXT.fullmatch(text)
    if not found or found.group(1) == "0000":
        raise UnmappableError("an infinite, BC or five-digit-year date has no spec value")
    return text


def _timestamp(text: str) -> str:
    found = _TIMESTAMP_TEXT.fullmatch(text)
    if not found or found.group(1).startswith("0000"):
        raise UnmappableError("an infinite, BC or five-digit-year timestamp has no spec value")
    return f"{found.group(1)}T{found.group(2)}.{(found.group(3) or '').ljust(6, '0')}Z"


def _bytea(text: str) -> str:
    if not text.startswith("\\x"):
        raise UnmappableError("bytea not in hex output")
    return base64.b64encode(bytes.fromhex(text[2:])).decode("ascii")


def _decimal(type_name: str) -> Callable[[str], str]:
    inner = type_name[len("decimal(") : -1]
    precision, scale = (int(part) for part in inner.split(","))
    pattern = re.compile(decimal_pattern(precision, scale))

    def convert(text: str) -> str:
        if not pattern.fullmatch(text):
            raise UnmappableError(f"no exact {type_name} value")
        return text

    return convert


_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "boolean": lambda text: text == "t",
    "int": int,
    "bigint": int,
    "string": str,
    "date": _date,
    "timestamp": _timestamp,
    "binary": _bytea,
}


def value_converter(type_oid: int, type_name: str) -> Callable[[str], Any]:
    """A function from a column's text output to its spec JSON value.

    Raises (from the returned function):
        UnmappableError: the value has no exact spec value.
    """
    if type_oid == _FLOAT4:
        return _float4
    if type_oid == _FLOAT8:
        return _float8
    if type_name.startswith("decimal("):
        return _decimal(type_name)
    return _CONVERTERS[type_name]
