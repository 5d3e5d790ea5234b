"""The value checks of configuration keys: each takes ``(key, value)`` and returns the value or raises ConfigError."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from applier.errors import ConfigError

# Letters, digits and underscores, not first: the name starts spill file names,
# and Spark silently skips files whose names start with "_".
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")


def name(key: str, v: Any) -> str:
    if not isinstance(v, str) or not NAME.fullmatch(v):
        raise ConfigError(key, v, "use letters, digits and underscores ([A-Za-z0-9_]+), not starting with '_'")
    return v


def boolean(key: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise ConfigError(key, v, "use true or false")


def boolean_or_auto(auto: str) -> Callable[[str, Any], bool | None]:
    """true or false, or null for the default ``auto`` names."""

    def check(key: str, v: Any) -> bool | None:
        if v is None:
            return None
        try:
            return boolean(key, v)
        except ConfigError:
            raise ConfigError(key, v, f"use true, false, or null for {auto}") from None

    return check


def seconds(meaning: str) -> Callable[[str, Any], float]:
    def check(key: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 10**7:
            raise ConfigError(key, v, f"use a number of seconds >= 0 ({meaning})")
        return float(v)

    return check


def non_negative_number(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v:
        raise ConfigError(key, v, "use a number of MB (MiB) >= 0; 0 means every available file")
    return float(v)


def hours_or_forever(key: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v or v == float("inf"):
        raise ConfigError(key, v, "use a number of hours >= 0, or null to keep applied pairs forever")
    return float(v)


def int_at_least(lowest: int, meaning: str) -> Callable[[str, Any], int]:
    def check(key: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
            raise ConfigError(key, v, f"use a whole number >= {lowest} ({meaning})")
        return v

    return check


def int_range(lowest: int, highest: int, meaning: str) -> Callable[[str, Any], int]:
    def check(key: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lowest <= v <= highest:
            raise ConfigError(key, v, f"use a whole number from {lowest:,} to {highest:,} ({meaning})")
        return v

    return check


def positive_or_null(allowed: str) -> Callable[[str, Any], float | None]:
    """A finite number > 0, or null (None); ``allowed`` is the refusal's words (the unit and what null means)."""

    def check(key: str, v: Any) -> float | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise ConfigError(key, v, allowed)
        return float(v)

    return check


megabytes_or_default = positive_or_null("use a number of MB (MiB) > 0, or null for a quarter of spark.driver.memory")


def identifier(key: str, v: Any) -> str:
    if not isinstance(v, str) or not v or any(ord(c) < 32 for c in v) or len(v.encode()) > 63:
        raise ConfigError(key, v, "use a schema name of 1 to 63 bytes without control characters")
    return v


def text(key: str, v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(key, v, "use a non-empty string")
    return v


def choice(choices: Sequence[str]) -> Callable[[str, Any], str]:
    def check(key: str, v: Any) -> str:
        if v not in choices:
            raise ConfigError(key, v, f"use one of: {', '.join(choices)}")
        return str(v)

    return check


def megabytes(meaning: str) -> Callable[[str, Any], float]:
    """A size in MiB >= 0; ``meaning`` says what it sizes and what 0 means."""

    def check(key: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise ConfigError(key, v, f"use a number of MiB >= 0 ({meaning})")
        return float(v)

    return check


def megabytes_or_null(meaning: str) -> Callable[[str, Any], float | None]:
    """A size in MiB >= 0, or null for the default ``meaning`` names."""

    def check(key: str, v: Any) -> float | None:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise ConfigError(key, v, f"use a number of MiB >= 0, or null for {meaning}")
        return float(v)

    return check


def megabytes_off_or_auto(auto: str) -> Callable[[str, Any], float | None]:
    """A size in MiB >= 0; ``off`` (infinity: never reached); or null for the default ``auto`` names.

    YAML reads a bare ``off`` as false, which therefore means off too.
    """

    def check(key: str, v: Any) -> float | None:
        if v is None:
            return None
        if v is False or v == "off":
            return float("inf")
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise ConfigError(key, v, f"use a number of MiB >= 0, off, or null for {auto}")
        return float(v)

    return check


def positive_number(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
        raise ConfigError(key, v, "a number above 0 (MiB)")
    return float(v)


def split(key: str, v: Any) -> int:
    if type(v) is not int or v not in (2, 3):
        raise ConfigError(key, v, "a failing group is split in 3 (HVAR) or 2 (its older mechanism)")
    return v


COMMAND_CONVERSIONS = ("i2di", "u2di", "d2none")
"""SAP's ``dsi_command_convert`` forms the target applies without counting a collision."""


def conversions(key: str, v: Any) -> frozenset[str]:
    """``none``, or a comma list (or YAML list) of :data:`COMMAND_CONVERSIONS`."""
    items = v if isinstance(v, list | tuple) else str(v).split(",") if isinstance(v, str) else None
    if items is None:
        raise ConfigError(key, v, f"none, or a comma list of: {', '.join(COMMAND_CONVERSIONS)}")
    names = {str(item).strip() for item in items} - {"", "none"}
    unknown = sorted(names - set(COMMAND_CONVERSIONS))
    if unknown:
        raise ConfigError(key, v, f"unknown conversion {unknown[0]!r}; use none or: {', '.join(COMMAND_CONVERSIONS)}")
    return frozenset(names)


def table_names(key: str, v: Any) -> frozenset[str]:
    """A YAML list or comma list of ``schema.table`` names (empty: none)."""
    items = v if isinstance(v, list | tuple) else str(v).split(",") if isinstance(v, str) else None
    if items is None:
        raise ConfigError(key, v, "a list (or comma list) of schema.table names")
    names = {str(item).strip() for item in items} - {""}
    for item in sorted(names):
        schema, dot, table = item.partition(".")
        if not dot or not schema or not table:
            raise ConfigError(key, v, f"{item!r} is not schema.table; use a list of schema.table names")
    return frozenset(names)


SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")


def slot_name(key: str, v: Any) -> str:
    """A replication slot's name, as PostgreSQL allows it."""
    if not isinstance(v, str) or not SLOT_NAME.fullmatch(v):
        raise ConfigError(key, v, "use 1 to 63 lowercase letters, digits and underscores (a slot name)")
    return v
