"""Row identities, net-change events and typed final rows, in Python on Spark's executors.

The compile job (:mod:`applier.engine.netting`) runs two Python steps inside
Spark (``mapInArrow``), both here as plain functions of Arrow batches so they
can be tested without Spark:

- :func:`event_batches`: each committed row becomes one or two *events* on an
  identity (the typed primary key, or the whole row of a table without one).
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
"""

from __future__ import annotations

import bisect
import datetime as dt
import decimal
import functools
import math
import operator
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow as pa

from applier.engine.changes import arrow_type
from applier.engine.image_checks import Checks, PairRules, refusal
from applier.engine.worker_path import trim_import_caches
from applier.intermediate.schema import Column, TableDef, decimal_precision_scale

NET_OP = "__net_op"
"""``I``, ``U`` or ``D``: the first column of a keyed table's chunk."""
COUNT = "__n"
"""The signed count of copies of a row value: the last column of a keyless table's chunk."""
CHUNK_ROWS = 32_768
"""Rows per chunk file, so the driver reads a large table's changes in pieces."""

EVENT_SCHEMA = pa.schema(
    [
        ("table", pa.string()),
        ("key", pa.binary()),
        ("commit_lsn", pa.int64()),
        ("lsn", pa.int64()),
        ("present", pa.bool_()),
        ("existed", pa.bool_()),
        ("n", pa.int32()),
        ("image", pa.string()),
        ("salt", pa.int32()),
        ("group", pa.int32()),
    ]
)
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


def _canonical_double(value: Any) -> Any:
    number = _double(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return number + 0.0  # -0.0 is 0.0


def _canonical_decimal(quantum: decimal.Decimal, value: Any) -> str:
    number = decimal.Decimal(value).quantize(quantum, context=_DECIMALS)
    return str(abs(number) if number == 0 else number)


def _micros(value: dt.datetime) -> int:
    return (value - _EPOCH) // _MICRO


def _canonical(column: Column) -> Callable[[Any], Any] | None:
    """The canonical form of a non-null value of ``column`` (None: the value itself)."""
    if column.type == "double":
        return _canonical_double
    if column.type == "timestamp":
        return _micros
    scale = decimal_precision_scale(column.type)
    if scale is not None:
        return functools.partial(_canonical_decimal, decimal.Decimal(1).scaleb(-scale[1]))
    return None


def _struct_decoder(columns: Sequence[Column]) -> msgspec.json.Decoder[Any]:
    """A decoder of the given columns of an image; other keys are skipped, a missing column is None."""
    fields = [(f"c{i}", _py_type(c.type) | None, None) for i, c in enumerate(columns)]
    rename = {f"c{i}": c.name for i, c in enumerate(columns)}
    return msgspec.json.Decoder(msgspec.defstruct("Image", fields, rename=rename))


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
        decoder, fields = self._identity
        decoded = decoder.decode(image)
        values = []
        for name, canonical in fields:
            value = getattr(decoded, name)
            values.append(value if canonical is None or value is None else canonical(value))
        return _encode(values)

    @functools.cached_property
    def _values(self) -> Callable[[Any], tuple[Any, ...]]:
        fields = [f"c{i}" for i in range(len(self.table.columns))]
        if len(fields) == 1:
            return lambda row: (getattr(row, fields[0]),)
        return operator.attrgetter(*fields)

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


def _events_of_row(
    rules: TableRules, op: str, before: str | None, after: str | None
) -> Iterator[tuple[bytes, bool, bool, int, str]]:
    """``(key, present, existed, n, image)`` for each event of one row (not a ``T``)."""
    if op == "I":
        assert after is not None
        yield rules.key(after), True, False, 1, after
        return
    assert before is not None
    before_key = rules.key(before)
    if op == "D":
        yield before_key, False, True, -1, before
        return
    assert after is not None
    after_key = rules.key(after)
    if rules.keyless or after_key != before_key:  # a row value of a keyless table is its identity
        yield before_key, False, True, -1, before
        yield after_key, True, False, 1, after
    else:
        yield after_key, True, True, 1, after


def event_batch(
    batch: pa.RecordBatch,
    tables: Mapping[str, TableDef],
    truncates: Mapping[str, tuple[int, int]],
    spreads: Mapping[str, int] | None = None,
    bounds: Sequence[int] = (),
    checks: Checks | None = None,
) -> pa.RecordBatch:
    """The events of a batch of committed rows (``.dat`` columns plus ``commit_lsn``).

    With ``checks``, the batch holds every row of the pairs read (``seq`` and
    ``xid`` too, ``commit_lsn`` null for a row of a transaction not committed
    here): the images of the pairs in ``checks`` are checked in the same pass
    (:class:`~applier.engine.image_checks.PairRules`; a refusal raises
    :func:`~applier.engine.image_checks.refusal`'s error), and only the
    committed rows give events.

    ``T`` rows, and rows at or before their table's last truncate, give none:
    the target empties the table first. An event's ``salt`` spreads a busy
    table's identities over ``spreads[table]`` shuffle partitions (a hash of
    the key, the same in every process); it is 0 for every other table, whose
    identities all meet in one partition and become one chunk. Its ``group``
    is the compilable group of its transaction: groups are runs of commit
    order, and ``bounds`` holds the commit lsn each group after the first
    starts at (none: one group, 0).
    """
    spreads = spreads or {}
    events: list[tuple[Any, ...]] = []
    names = ["table", "op", "before", "after", "commit_lsn", "lsn"]
    checking = PairRules(checks) if checks is not None else None
    columns = [batch.column(c).to_pylist() for c in ([*names, "seq", "xid"] if checking is not None else names)]
    rules: dict[str, TableRules] = {}  # by name: hashing a TableDef (for rules_of's cache) costs as much as its columns
    for table, op, before, after, commit_lsn, lsn, *where in zip(*columns, strict=True):
        if checking is not None:
            problem = checking.problem(where[0], table, op, before, after)
            if problem is not None:
                raise refusal(where[0], lsn, where[1], table, problem)
            if commit_lsn is None:
                continue
        if op == "T":
            continue
        cut = truncates.get(table)
        if cut is not None and (commit_lsn, lsn) <= cut:
            continue
        spread = spreads.get(table, 1)
        group = bisect.bisect_right(bounds, commit_lsn) if bounds else 0
        table_rules = rules.get(table)
        if table_rules is None:
            table_rules = rules[table] = rules_of(tables[table])
        for key, present, existed, n, image in _events_of_row(table_rules, op, before, after):
            salt = zlib.crc32(key) % spread if spread > 1 else 0
            events.append((table, key, commit_lsn, lsn, present, existed, n, image, salt, group))
    by_field: Iterable[Sequence[Any]] = zip(*events, strict=True) if events else ([] for _ in EVENT_SCHEMA)
    return pa.RecordBatch.from_arrays(
        [pa.array(list(values), field.type) for values, field in zip(by_field, EVENT_SCHEMA, strict=True)],
        schema=EVENT_SCHEMA,
    )


def event_batches(
    tables: Mapping[str, TableDef],
    truncates: Mapping[str, tuple[int, int]],
    spreads: Mapping[str, int],
    bounds: Sequence[int],
    checks: Checks | None,
    batches: Iterable[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """:func:`event_batch` over a partition (the ``mapInArrow`` function, with its settings bound)."""
    trim_import_caches()
    for batch in batches:
        yield event_batch(batch, tables, truncates, spreads, bounds, checks)


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
    present, images, counts = (rows.column(c).to_pylist() for c in ("present", "image", "n"))
    if rules.keyless:
        keep = [i for i, n in enumerate(counts) if n]
        columns = rules.parse([images[i] for i in keep])
        names = [*rules.table.column_names, COUNT]
        return pa.Table.from_arrays([*columns, pa.array([counts[i] for i in keep], pa.int64())], names=names)
    existed = [bool(e) and not truncated for e in rows.column("existed").to_pylist()]
    keep = [i for i, (e, p) in enumerate(zip(existed, present, strict=True)) if e or p]
    ops = ["D" if not present[i] else "U" if existed[i] else "I" for i in keep]
    columns = rules.parse([images[i] for i in keep])
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
    """Typed chunks of net changes from aggregated identities sorted by table and group (the ``mapInArrow`` function).

    Rows arrive grouped by table and group (the partition is sorted on them);
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
