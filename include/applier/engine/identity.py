"""Row identities, net-change events and typed final rows, in Python on Spark's executors.

The compile job (:mod:`applier.engine.netting`) runs two Python steps inside
Spark (``mapInArrow``), both here as plain functions of Arrow batches so they
can be tested without Spark:

- :func:`applier.engine.events.event_batches` (its own module): each committed
  row becomes one or two *events* on an identity (the typed primary key, or the
  whole row of a table without one), computed by :meth:`TableRules.key`.
- :func:`chunk_batches`: per table and identity, the aggregated last event
  becomes a net insert, update or delete (or a signed count of copies), and the
  final images are parsed into the table's typed Arrow columns, written as
  Arrow IPC chunk files of one table each; the driver receives their list.

Each row is decoded with its own table's rules, found by name, so the cost of a
cycle follows its rows, not the number or width of the tables it touches (the
earlier design built one Spark expression per table, which grew with the sum of
all tables' columns). Images were checked by the reader, so decoding trusts
their shape; a value that still does not fit raises.

Identities are canonical: two images name the same row exactly when their typed
values are equal, so ``"1.5"`` and ``"1.50"`` in a ``decimal(p,1)`` column,
``-0.0`` and ``0.0``, two NaNs, or two spellings of one instant are one identity.
An identity is msgspec's JSON encoding of its columns' canonical values:
integers, booleans and strings as they are; a decimal's integer at its scale,
a date's days and a timestamp's microseconds since 1970; a double's IEEE bits
and a binary's bytes as hex digits. Each is plain for the C pass to write
(:func:`applier.intermediate.native.identities`), byte for byte the same.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import math
import operator
import struct
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow as pa

from applier.engine.changes import arrow_type
from applier.engine.worker_path import trim_import_caches
from applier.intermediate import native
from applier.intermediate.schema import Column, TableDef, decimal_precision_scale

NET_OP = "__net_op"
"""``I``, ``U`` or ``D``: the first column of a keyed table's chunk."""
COUNT = "__n"
"""The signed count of copies of a row value: the last column of a keyless table's chunk."""
CHUNK_ROWS = 32_768
"""Rows per chunk file, so the driver reads a large table's changes in pieces."""

CHUNK_SCHEMA = pa.schema(
    [
        ("table", pa.string()),
        ("path", pa.string()),
        ("rows", pa.int64()),
        ("bytes", pa.int64()),
        ("I", pa.int64()),
        ("U", pa.int64()),
        ("D", pa.int64()),
        ("group", pa.int32()),
    ]
)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_DAY_ZERO = dt.date(1970, 1, 1)
_MICRO = dt.timedelta(microseconds=1)
_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_PY_TYPES: dict[str, Any] = {
    "boolean": bool,
    "int": int,
    "bigint": int,
    "double": float | str,
    "string": str,
    "date": dt.date,
    "timestamp": dt.datetime,
    "binary": bytes,
}
_encode = msgspec.json.Encoder().encode
# Room for any decimal(38, s) value: the default context keeps 28 digits.
_DECIMALS = decimal.Context(prec=100)


def _py_type(type_name: str) -> Any:
    return decimal.Decimal if decimal_precision_scale(type_name) is not None else _PY_TYPES[type_name]


def _double(value: Any) -> float:
    return _SPECIAL[value] if isinstance(value, str) else float(value)


def _canonical_double(value: Any) -> str:
    """A double's IEEE bits as hex digits, big-endian: one NaN, and -0.0 as 0.0."""
    number = _double(value)
    return _NAN_BITS if math.isnan(number) else struct.pack(">d", number + 0.0).hex()  # -0.0 + 0.0 is 0.0


_NAN_BITS = struct.pack(">d", math.nan).hex()


def _canonical_decimal(quantum: decimal.Decimal, scale: int, value: Any) -> int:
    """A decimal's integer at the column's scale (``"1.5"`` at scale 2: 150)."""
    number = decimal.Decimal(value).quantize(quantum, context=_DECIMALS)
    return int(number.scaleb(scale, context=_DECIMALS))


def _micros(value: dt.datetime) -> int:
    return (value - _EPOCH) // _MICRO


def _days(value: dt.date) -> int:
    return (value - _DAY_ZERO).days


def _hex(value: bytes) -> str:
    return value.hex()


_FORMS: dict[str, Callable[[Any], Any]] = {
    "double": _canonical_double, "timestamp": _micros, "date": _days, "binary": _hex,
}  # fmt: skip
"""The canonical forms of the types that have one, but decimals (whose form takes the column's scale)."""


def _canonical(column: Column) -> Callable[[Any], Any] | None:
    """The canonical form of a non-null value of ``column`` (None: the value itself)."""
    if column.type in _FORMS:
        return _FORMS[column.type]
    scale = decimal_precision_scale(column.type)
    if scale is not None:
        return functools.partial(_canonical_decimal, decimal.Decimal(1).scaleb(-scale[1]), scale[1])
    return None


def _struct_decoder(columns: Sequence[Column]) -> msgspec.json.Decoder[Any]:
    """A decoder of the given columns of an image; other keys are skipped, a missing column is None.

    Its structs hold scalars only: the cyclic collector need not track them (``gc=False``).
    """
    fields = [(f"c{i}", _py_type(c.type) | None, None) for i, c in enumerate(columns)]
    rename = {f"c{i}": c.name for i, c in enumerate(columns)}
    return msgspec.json.Decoder(msgspec.defstruct("Image", fields, rename=rename, gc=False))


def _from_text(column: Column) -> Callable[[Any], Any] | None:
    """The canonical form of a non-null value of ``column`` as the image check read it (text-encoded types as text)."""
    if column.type == "timestamp":
        return lambda value: _micros(msgspec.convert(value, dt.datetime))
    if column.type == "date":
        return lambda value: _days(msgspec.convert(value, dt.date))
    if column.type == "binary":
        return lambda value: msgspec.convert(value, bytes).hex()
    return _canonical(column)  # a decimal's and a double's canonical forms take the text as it is


def _key_function(
    decode: Callable[[str], Any] | None, fields: Sequence[tuple[str, Callable[[Any], Any] | None]]
) -> Callable[[Any], bytes]:
    """Identity bytes from an image (``decode`` it first) or a decoded one: ``fields``' values, each canonical."""
    get, encode = operator.attrgetter(*(name for name, _ in fields)), _encode
    canonicals = [canonical for _, canonical in fields]
    if all(canonical is None for canonical in canonicals):
        if decode is None:
            return (lambda row: encode((get(row),))) if len(fields) == 1 else (lambda row: encode(get(row)))
        if len(fields) == 1:
            return lambda image: encode((get(decode(image)),))
        return lambda image: encode(get(decode(image)))

    def key(image: Any) -> bytes:
        values = get(image if decode is None else decode(image))
        values = (values,) if len(canonicals) == 1 else values
        return encode([v if c is None or v is None else c(v) for v, c in zip(values, canonicals, strict=True)])

    return key


def _to_arrow(column: Column, values: list[Any]) -> pa.Array:
    if column.type == "double":
        values = [None if v is None else _double(v) for v in values]
    return pa.array(values, type=arrow_type(column.type))


@dataclass(frozen=True)
class TableRules:
    """How one table's images are identified and parsed.

    Attributes:
        table: the table's definition (the latest of the cycle).
        keyless: whether the table has no primary key (rows are a multiset).
    """

    table: TableDef

    @property
    def keyless(self) -> bool:
        return not self.table.primary_key

    @functools.cached_property
    def _identity_columns(self) -> tuple[Column, ...]:
        if self.table.primary_key:
            return tuple(self.table.column(name) for name in self.table.primary_key)
        return self.table.columns

    @functools.cached_property
    def _identity(self) -> tuple[msgspec.json.Decoder[Any], list[tuple[str, Callable[[Any], Any] | None]]]:
        columns = self._identity_columns
        return _struct_decoder(columns), [(f"c{i}", _canonical(c)) for i, c in enumerate(columns)]

    @functools.cached_property
    def _full(self) -> msgspec.json.Decoder[Any]:
        return _struct_decoder(self.table.columns)

    def key(self, image: str) -> bytes:
        """The canonical identity of an image, as bytes (equal exactly for equal typed values)."""
        return self.key_of(image)

    @functools.cached_property
    def key_of(self) -> Callable[[str], bytes]:
        """:meth:`key` as one function built for this table: without a canonical form to apply, two C calls."""
        decoder, fields = self._identity
        return _key_function(decoder.decode, fields)

    @functools.cached_property
    def native_keys(self) -> native.NativeRule | None:
        """The C pass's rule for this table's identities (:func:`applier.intermediate.native.identities`).

        None without the library, or for an identity of more columns than C
        takes (a table without a key: every column).
        """
        if native.LIBRARY is None or len(self._identity_columns) > native.MAX_KEYS:
            return None
        return native.NativeRule(self.table, (), [c.name for c in self._identity_columns])

    @functools.cached_property
    def key_of_checked(self) -> Callable[[Any], bytes]:
        """:meth:`key` of an image the image check decoded already, for this same definition.

        The check's bulk decoder (:class:`~applier.intermediate.images.ImageRules`)
        gives a struct whose field ``c<i>`` is column ``i``, text-encoded
        values as their strings: those are converted to the typed values
        :meth:`key` encodes, so both give the same bytes for an image.
        """
        position = {c.name: i for i, c in enumerate(self.table.columns)}
        return _key_function(None, [(f"c{position[c.name]}", _from_text(c)) for c in self._identity_columns])

    @functools.cached_property
    def _values(self) -> Callable[[Any], tuple[Any, ...]]:
        fields = [f"c{i}" for i in range(len(self.table.columns))]
        if len(fields) == 1:
            return lambda row: (getattr(row, fields[0]),)
        return operator.attrgetter(*fields)

    @functools.cached_property
    def _native_parse(self) -> native.NativeRule | None:
        return None if native.LIBRARY is None else native.NativeRule(self.table, ())

    def parse_column(self, images: pa.Array) -> list[pa.Array]:
        """The typed columns of an Arrow column of images: parsed in C (:func:`applier.intermediate.native.parse`),
        or here when C leaves them to Python."""
        rule = self._native_parse
        parsed = None if rule is None or native.LIBRARY is None else native.parse(images, rule, self.table.columns)
        return parsed if parsed is not None else self.parse(images.to_pylist())

    def parse(self, images: Sequence[str]) -> list[pa.Array]:
        """The typed columns of ``images`` (a column missing from an image is null)."""
        decode = self._full.decode
        rows = [self._values(decode(image)) for image in images]
        by_column = zip(*rows, strict=True) if rows else ([] for _ in self.table.columns)
        return [_to_arrow(column, list(values)) for column, values in zip(self.table.columns, by_column, strict=True)]


@functools.lru_cache(maxsize=4096)
def rules_of(table: TableDef) -> TableRules:
    """The rules of a table definition, built once per Python worker."""
    return TableRules(table)


def final_table(rules: TableRules, truncated: bool, rows: pa.Table) -> pa.Table:
    """One table's net changes, typed, from its aggregated identities.

    Args:
        rules: the table's rules.
        truncated: the cycle empties the table first (nothing existed before).
        rows: ``existed`` (first event), ``present`` and ``image`` (last event)
            and ``n`` (summed counts), one row per identity.

    Returns:
        A keyed table: :data:`NET_OP` then its columns, one row per identity that
        changes (``D`` rows carry the last image, of which only the key counts).
        A keyless table: its columns then :data:`COUNT`, one row per value whose
        count is not 0.
    """
    present, counts = (rows.column(c).to_pylist() for c in ("present", "n"))
    images = rows.column("image")
    if rules.keyless:
        keep = [i for i, n in enumerate(counts) if n]
        columns = rules.parse_column(images.take(pa.array(keep, pa.int64())).combine_chunks())
        names = [*rules.table.column_names, COUNT]
        return pa.Table.from_arrays([*columns, pa.array([counts[i] for i in keep], pa.int64())], names=names)
    existed = [bool(e) and not truncated for e in rows.column("existed").to_pylist()]
    keep = [i for i, (e, p) in enumerate(zip(existed, present, strict=True)) if e or p]
    ops = ["D" if not present[i] else "U" if existed[i] else "I" for i in keep]
    columns = rules.parse_column(images.take(pa.array(keep, pa.int64())).combine_chunks())
    return pa.Table.from_arrays([pa.array(ops, pa.string()), *columns], names=[NET_OP, *rules.table.column_names])


def chunk_stats(table: TableDef, rows: pa.Table) -> dict[str, int]:
    """Net rows of a chunk: ``I``/``U``/``D`` (for a keyless table, copies inserted and deleted)."""
    if table.primary_key:
        ops = rows.column(NET_OP).to_pylist()
        return {op: ops.count(op) for op in ("I", "U", "D")}
    counts = rows.column(COUNT).to_pylist()
    return {"I": sum(n for n in counts if n > 0), "U": 0, "D": -sum(n for n in counts if n < 0)}


def _chunk(folder: str, table: TableDef, group: int, rows: pa.Table) -> pa.RecordBatch:
    """Write one chunk to its own file in ``folder``; the row that describes it."""
    path = f"{folder}/{uuid.uuid4().hex}.arrow"
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    described = {"table": table.name, "path": path, "rows": rows.num_rows, "bytes": rows.nbytes, "group": group}
    return pa.RecordBatch.from_pylist([{**described, **chunk_stats(table, rows)}], schema=CHUNK_SCHEMA)


def chunk_batches(
    tables: Mapping[str, TableDef], truncated: frozenset[str], folder: str, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Typed chunks of net changes from aggregated identities grouped by table and group (the ``mapInArrow`` function).

    Rows arrive grouped by table and group (:func:`~applier.engine.reduce.net_identities`);
    each run of one table and group is cut into chunks of at most
    :data:`CHUNK_ROWS` identities, each written to a file of its own in
    ``folder`` (an Arrow IPC stream) and described by one output row: the
    compiled cycle goes to the driver as a list of files, and the driver reads
    one table's files when it applies it.
    """
    trim_import_caches()
    pending: list[pa.RecordBatch] = []
    current: tuple[str, int] | None = None
    held = 0
    for batch in batches:
        runs = list(zip(batch.column("table").to_pylist(), batch.column("group").to_pylist(), strict=True))
        start = 0
        for i in range(1, len(runs) + 1):
            if i < len(runs) and runs[i] == runs[start]:
                continue
            if current is not None and (runs[start] != current or held >= CHUNK_ROWS):
                yield _flush(tables, truncated, folder, current, pending)
                pending, held = [], 0
            current = runs[start]
            pending.append(batch.slice(start, i - start))
            held += i - start
            start = i
    if current is not None and pending:
        yield _flush(tables, truncated, folder, current, pending)


def _flush(
    tables: Mapping[str, TableDef],
    truncated: frozenset[str],
    folder: str,
    run: tuple[str, int],
    pending: list[pa.RecordBatch],
) -> pa.RecordBatch:
    name, group = run
    rows = pa.Table.from_batches(pending)
    table = tables[name]
    return _chunk(folder, table, group, final_table(rules_of(table), name in truncated, rows))
