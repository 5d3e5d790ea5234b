"""A tiny, independent reference applier for intermediate files (format version 1).

It follows section 4 of ``/work/shared/spec/intermediate-files.md`` literally:
read every complete pair 1..N in sequence order, collect the transactions, and
apply every committed transaction in ascending commit-lsn order (its rows in
ascending lsn order) to in-memory tables that start empty.

It shares no code with the project (no ``applier`` import): only the standard
library and pyarrow (to read the ``.dat`` Parquet files). It does not try to
detect every defect of spec section 6, but it refuses streams that cannot be
real: an update or delete of a missing row, an insert of an existing key.

Values stay in the spec's JSON encoding, normalised so that equal values compare
equal (see :func:`canonical_value`).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

__all__ = [
    "RefTable",
    "ReferenceApplyError",
    "canonical_rows",
    "canonical_value",
    "reference_apply",
]

_DECIMAL_RE = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_INT_RANGES = {"int": 2**31, "bigint": 2**63}
_DOUBLE_SPECIALS = ("NaN", "Infinity", "-Infinity")
_TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


class ReferenceApplyError(Exception):
    """The input cannot be applied by the reference (an unrealistic or malformed stream)."""


@dataclass
class RefTable:
    """A table as the reference applier leaves it.

    ``rows`` hold values ordered like ``columns``, in canonical encoding, sorted
    by ``json.dumps`` of the row.
    """

    columns: list[str]
    types: list[str]
    primary_key: list[str]
    rows: list[list[Any]]


# --------------------------------------------------------------------------- values


def canonical_value(type_name: str, value: Any) -> Any:
    """Return ``value`` (spec JSON encoding) of SQL type ``type_name`` in canonical form.

    - ``boolean`` -> bool; ``int``/``bigint`` -> int (range-checked);
    - ``double`` -> float (``-0.0`` becomes ``0.0``), except NaN and the
      infinities, which become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
    - ``decimal(p,s)`` -> string with exactly ``s`` fraction digits (a
      :class:`decimal.Decimal` is accepted too);
    - ``string`` -> str; ``date`` -> ``YYYY-MM-DD`` (a :class:`datetime.date` is accepted);
    - ``timestamp`` -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC (an aware datetime is accepted);
    - ``binary`` -> standard base64 (bytes are accepted).

    ``None`` (SQL NULL) stays ``None``. Raises :class:`ReferenceApplyError` on a
    value that does not fit its type.
    """
    if value is None:
        return None
    try:
        return _canonical_non_null(type_name, value)
    except (ValueError, TypeError, ArithmeticError, binascii.Error) as exc:
        raise ReferenceApplyError(f"value {value!r} does not fit type {type_name}: {exc}") from exc


def _canonical_non_null(type_name: str, value: Any) -> Any:
    """Canonicalise one non-null value; raises ValueError/TypeError when it does not fit."""
    if type_name == "boolean":
        if not isinstance(value, bool):
            raise TypeError("not a boolean")
        return value
    if type_name in _INT_RANGES:
        return _canonical_int(type_name, value)
    if type_name == "double":
        return _canonical_double(value)
    match = _DECIMAL_RE.match(type_name)
    if match:
        return _canonical_decimal(int(match.group(1)), int(match.group(2)), value)
    if type_name == "string":
        if not isinstance(value, str):
            raise TypeError("not a string")
        return value
    if type_name == "date":
        return _canonical_date(value)
    if type_name == "timestamp":
        return _canonical_timestamp(value)
    if type_name == "binary":
        return _canonical_binary(value)
    raise ValueError(f"unknown type {type_name!r}")


def _canonical_int(type_name: str, value: Any) -> int:
    """An int within the 32- or 64-bit signed range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("not an integer")
    bound = _INT_RANGES[type_name]
    if not -bound <= value < bound:
        raise ValueError("out of range")
    return value


def _canonical_double(value: Any) -> float | str:
    """A float, or one of the strings NaN/Infinity/-Infinity."""
    if isinstance(value, str):
        if value not in _DOUBLE_SPECIALS:
            raise ValueError("not a double")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError("not a number")
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return number + 0.0  # turns -0.0 into 0.0


def _canonical_decimal(precision: int, scale: int, value: Any) -> str:
    """Exact decimal text with exactly ``scale`` fraction digits and at most ``precision`` digits."""
    if isinstance(value, decimal.Decimal):
        number = value
    elif isinstance(value, str):
        number = decimal.Decimal(value)
    else:
        raise TypeError("decimal must be a string")
    if not number.is_finite():
        raise ValueError("not a finite decimal")
    with decimal.localcontext() as ctx:
        ctx.prec = max(precision, len(number.as_tuple().digits)) + scale + 2
        quantized = number.quantize(decimal.Decimal(1).scaleb(-scale))
        if quantized != number:
            raise ValueError(f"more than {scale} fraction digits")
    if len(quantized.as_tuple().digits) > precision and quantized != 0:
        raise ValueError(f"more than {precision} digits")
    if quantized == 0:
        quantized = quantized.copy_abs()
    return format(quantized, "f")


def _canonical_date(value: Any) -> str:
    """``YYYY-MM-DD``."""
    if isinstance(value, dt.datetime):
        raise TypeError("a datetime is not a date")
    if isinstance(value, dt.date):
        return value.isoformat()
    if not isinstance(value, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        raise ValueError("not YYYY-MM-DD")
    return dt.date.fromisoformat(value).isoformat()


def _canonical_timestamp(value: Any) -> str:
    """ISO 8601 UTC with ``Z`` and microseconds."""
    if isinstance(value, str):
        if not value.endswith("Z"):
            raise ValueError("timestamp must end in Z")
        value = dt.datetime.fromisoformat(value)
    if not isinstance(value, dt.datetime):
        raise TypeError("not a timestamp")
    if value.tzinfo is None:
        raise ValueError("timestamp without time zone")
    return value.astimezone(dt.UTC).strftime(_TIMESTAMP_FORMAT)


def _canonical_binary(value: Any) -> str:
    """Standard base64."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
    elif isinstance(value, str):
        raw = base64.b64decode(value, validate=True)
    else:
        raise TypeError("binary must be base64 text")
    return base64.b64encode(raw).decode("ascii")


def _row_sort_key(row: list[Any]) -> str:
    """A total order over canonical rows, tolerant of None and mixed types."""
    return json.dumps(row)


def canonical_rows(columns_types: list[tuple[str, str]], rows: list[list[Any]]) -> list[list[Any]]:
    """Turn rows in the spec's JSON encoding into canonical, sorted rows.

    ``columns_types`` gives ``(name, type)`` per column, in row order. The result
    compares equal to ``reference_apply(...)[table].rows`` for the same multiset.
    """
    out = []
    for row in rows:
        if len(row) != len(columns_types):
            raise ReferenceApplyError(f"row {row!r} has {len(row)} values, expected {len(columns_types)}")
        out.append(
            [canonical_value(type_name, value) for (_, type_name), value in zip(columns_types, row, strict=True)]
        )
    return sorted(out, key=_row_sort_key)


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _TableDef:
    """One table definition from a ``.dat``'s ``cdc.tables`` metadata."""

    columns: tuple[tuple[str, str, bool], ...]  # (name, type, nullable)
    primary_key: tuple[str, ...]

    @property
    def types(self) -> dict[str, str]:
        """Column name -> type."""
        return {name: type_name for name, type_name, _ in self.columns}


@dataclass(frozen=True)
class _Change:
    """One row of a ``.dat``, images already canonicalised."""

    lsn: int
    xid: str
    table: str
    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@dataclass
class _Stream:
    """Everything read from pairs 1..N."""

    tables: dict[str, _TableDef] = field(default_factory=dict)
    changes: list[_Change] = field(default_factory=list)
    commits: dict[str, int] = field(default_factory=dict)  # xid -> commit lsn


def _pair_paths(directory: Path, seq: int) -> tuple[Path, Path]:
    """The ``.dat`` and ``.trn`` paths of pair ``seq``."""
    stem = f"{seq:012d}"
    return directory / f"{stem}.dat", directory / f"{stem}.trn"


def _complete_seqs(directory: Path, through_seq: int | None) -> list[int]:
    """Sequence numbers 1..N of complete pairs, stopping at the first missing one (a gap)."""
    seqs: list[int] = []
    seq = 1
    while through_seq is None or seq <= through_seq:
        dat, trn = _pair_paths(directory, seq)
        if not trn.is_file():
            break
        if not dat.is_file():
            raise ReferenceApplyError(f"{trn.name} exists without its .dat")
        seqs.append(seq)
        seq += 1
    if through_seq is not None and len(seqs) < through_seq:
        raise ReferenceApplyError(f"pairs 1..{through_seq} requested, only 1..{len(seqs)} are complete")
    return seqs


def _parse_table_defs(dat: Path, metadata: dict[bytes, bytes] | None) -> dict[str, _TableDef]:
    """Parse the ``cdc.tables`` key-value metadata."""
    if not metadata or b"cdc.tables" not in metadata:
        raise ReferenceApplyError(f"{dat.name}: no cdc.tables metadata")
    defs = {}
    for name, spec in json.loads(metadata[b"cdc.tables"]).items():
        columns = tuple((c["name"], c["type"], bool(c["nullable"])) for c in spec["columns"])
        defs[name] = _TableDef(columns=columns, primary_key=tuple(spec["primary_key"]))
    return defs


def _merge_table_def(name: str, old: _TableDef | None, new: _TableDef) -> _TableDef:
    """Accept a redefinition that only adds nullable columns; return the new definition."""
    if old is None or old == new:
        return new
    new_columns = {c[0]: c for c in new.columns}
    kept = all(new_columns.get(c[0]) == c for c in old.columns)
    added_nullable = all(c[2] for c in new.columns if c[0] not in old.types)
    if not (kept and added_nullable and old.primary_key == new.primary_key):
        raise ReferenceApplyError(f"{name}: incompatible schema change {old} -> {new}")
    return new


def _canonical_image(table: str, definition: _TableDef, image: str | None, *, full: bool) -> dict[str, Any] | None:
    """Parse a JSON image and canonicalise its values; ``full`` requires every column."""
    if image is None:
        return None
    parsed = json.loads(image)
    if not isinstance(parsed, dict):
        raise ReferenceApplyError(f"{table}: image is not a JSON object: {image}")
    types = definition.types
    unknown = set(parsed) - set(types)
    required = set(types) if full else set(definition.primary_key)
    missing = required - set(parsed)
    if unknown or missing:
        raise ReferenceApplyError(f"{table}: image {image} has unknown {unknown or '{}'} / missing {missing or '{}'}")
    return {name: canonical_value(types[name], value) for name, value in parsed.items()}


def _read_dat(dat: Path) -> tuple[dict[str, _TableDef], list[_Change]]:
    """Read one ``.dat``: its table definitions and its changes."""
    table = pq.read_table(dat)
    defs = _parse_table_defs(dat, table.schema.metadata)
    changes = []
    for row in table.to_pylist():
        definition = defs.get(row["table"])
        if definition is None:
            raise ReferenceApplyError(f"{dat.name}: table {row['table']} not in cdc.tables")
        no_pk = not definition.primary_key
        changes.append(
            _Change(
                lsn=row["lsn"],
                xid=row["xid"],
                table=row["table"],
                op=row["op"],
                before=_canonical_image(row["table"], definition, row["before"], full=no_pk),
                after=_canonical_image(row["table"], definition, row["after"], full=True),
            )
        )
    return defs, changes


def _read_trn(trn: Path) -> dict[str, int]:
    """Read one ``.trn``: the commit lsn of each transaction committed in it."""
    lines = trn.read_text(encoding="utf-8").splitlines()
    if not lines or json.loads(lines[0]).get("record") != "header":
        raise ReferenceApplyError(f"{trn.name}: no header")
    commits = {}
    for line in lines[1:]:
        event = json.loads(line)
        if event["record"] == "commit":
            commits[event["xid"]] = event["lsn"]
    return commits


def _read_stream(directory: Path, through_seq: int | None) -> _Stream:
    """Read every complete pair 1..N (N = ``through_seq`` or the last before a gap)."""
    stream = _Stream()
    for seq in _complete_seqs(directory, through_seq):
        dat, trn = _pair_paths(directory, seq)
        defs, changes = _read_dat(dat)
        for name, definition in defs.items():
            stream.tables[name] = _merge_table_def(name, stream.tables.get(name), definition)
        stream.changes.extend(changes)
        stream.commits.update(_read_trn(trn))
    return stream


# --------------------------------------------------------------------------- applying


def _frozen(row: dict[str, Any]) -> frozenset[tuple[str, Any]]:
    """A hashable form of a row in which an absent column equals NULL (used for tables without a key)."""
    return frozenset((name, value) for name, value in row.items() if value is not None)


class _Table:
    """An in-memory table: by key for a table with a primary key, a multiset of rows otherwise."""

    def __init__(self, name: str, primary_key: tuple[str, ...]) -> None:
        self.name = name
        self.primary_key = primary_key
        self.by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.bag: Counter[frozenset[tuple[str, Any]]] = Counter()

    def _key(self, image: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(image[name] for name in self.primary_key)

    def insert(self, after: dict[str, Any]) -> None:
        """``I``: add the row; an existing key is an error."""
        if not self.primary_key:
            self.bag[_frozen(after)] += 1
            return
        key = self._key(after)
        if key in self.by_key:
            raise ReferenceApplyError(f"{self.name}: insert of existing key {key}")
        self.by_key[key] = after

    def delete(self, before: dict[str, Any]) -> None:
        """``D``: remove the row matched by key (no key: exactly one row equal to ``before``)."""
        if not self.primary_key:
            frozen = _frozen(before)
            if self.bag[frozen] <= 0:
                raise ReferenceApplyError(f"{self.name}: no row equal to {before}")
            self.bag[frozen] -= 1
            if not self.bag[frozen]:
                del self.bag[frozen]
            return
        key = self._key(before)
        if key not in self.by_key:
            raise ReferenceApplyError(f"{self.name}: no row with key {key}")
        del self.by_key[key]

    def update(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        """``U``: replace the matched row by ``after`` (which may carry a new key)."""
        self.delete(before)
        self.insert(after)

    def truncate(self) -> None:
        """``T``: empty the table."""
        self.by_key.clear()
        self.bag.clear()

    def row_dicts(self) -> list[dict[str, Any]]:
        """Every row as a dict (columns absent from a row are NULL)."""
        rows = list(self.by_key.values())
        for frozen, count in self.bag.items():
            rows.extend(dict(frozen) for _ in range(count))
        return rows


def _apply_change(table: _Table, change: _Change) -> None:
    """Apply one row change."""
    if change.op == "I" and change.after is not None:
        table.insert(change.after)
    elif change.op == "U" and change.before is not None and change.after is not None:
        table.update(change.before, change.after)
    elif change.op == "D" and change.before is not None:
        table.delete(change.before)
    elif change.op == "T":
        table.truncate()
    else:
        raise ReferenceApplyError(f"bad change at lsn {change.lsn}: op {change.op!r} with these images")


def reference_apply(directory: Path, through_seq: int | None = None) -> dict[str, RefTable]:
    """Apply the complete pairs in ``directory`` and return the resulting tables.

    Pairs 1..``through_seq`` are applied (all of them must be complete); without
    ``through_seq``, every complete pair up to the first missing number. Every
    committed transaction is applied in ascending commit-lsn order, its rows in
    ascending lsn order, to tables that start empty; rolled-back and open
    transactions have no effect. Every table described in an applied pair's
    ``cdc.tables`` is returned, even if empty.
    """
    stream = _read_stream(Path(directory), through_seq)
    tables = {name: _Table(name, definition.primary_key) for name, definition in stream.tables.items()}
    committed = sorted(stream.commits, key=stream.commits.__getitem__)
    changes_by_xid: dict[str, list[_Change]] = {}
    for change in stream.changes:
        changes_by_xid.setdefault(change.xid, []).append(change)
    for xid in committed:
        for change in sorted(changes_by_xid.get(xid, []), key=lambda c: c.lsn):
            _apply_change(tables[change.table], change)
    return {name: _result_table(stream.tables[name], table) for name, table in tables.items()}


def _result_table(definition: _TableDef, table: _Table) -> RefTable:
    """Project the in-memory rows onto the latest column list, sorted."""
    columns = [c[0] for c in definition.columns]
    rows = [[row.get(name) for name in columns] for row in table.row_dicts()]
    return RefTable(
        columns=columns,
        types=[c[1] for c in definition.columns],
        primary_key=list(definition.primary_key),
        rows=sorted(rows, key=_row_sort_key),
    )
