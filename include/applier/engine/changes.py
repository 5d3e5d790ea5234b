"""The net changes of one table in one cycle, and the Arrow types of spec columns.

:class:`TableChanges` is what the net-change compiler hands a target: it is
already net (one final state per key, or one signed count per row value), so a
target applies it in one commit without knowing the log that produced it.

The pure Arrow transformations a target needs to apply a change (typing rows,
checking keys, expanding and removing copies of row values) live here too, apart
from the code that writes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.intermediate.schema import TableDef, decimal_precision_scale

_Rows = TypeVar("_Rows", pa.Table, pa.ChunkedArray)

COUNT_COLUMN = "__count"
"""The signed copy count of a row value in :attr:`TableChanges.counted`."""

_SIMPLE_TYPES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "double": pa.float64(),
    "string": pa.string(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "binary": pa.binary(),
}


@dataclass(frozen=True)
class TableChanges:
    """One table's net changes of a cycle (engine design, "Row ordering and net changes").

    Attributes:
        table: the cycle's (latest) definition of the table.
        truncate: empty the table first; the other fields describe what follows.
        upserts: tables with a primary key: the final rows (all columns, typed
            as :func:`arrow_schema`) of net inserts and updates.
        deletes: tables with a primary key: the key columns of net deletes.
        counted: tables without a primary key: all columns plus
            :data:`COUNT_COLUMN` (int64, signed): insert that many copies of the
            row value, or delete that many when negative. None for keyed tables.
        stats: net row counts ``{"I": n, "U": n, "D": n, "T": 0 or 1}``.
        new: tables with a primary key: for each row of ``upserts``, whether it
            is a net insert (its key held no row before the cycle, as the log
            tells) rather than an update; None when not known (every upsert is
            then taken for an update). A target that finds the log and the
            table disagree counts a *collision*.
    """

    table: TableDef
    truncate: bool
    upserts: pa.Table
    deletes: pa.Table
    counted: pa.Table | None
    stats: dict[str, int]
    new: pa.Array | None = None


def arrow_type(type_name: str) -> pa.DataType:
    """The Arrow type of a spec column type.

    Args:
        type_name: a spec type such as ``bigint`` or ``decimal(12,2)``.

    Returns:
        ``int``→int32, ``bigint``→int64, ``boolean``→bool, ``double``→float64,
        ``decimal(p,s)``→decimal128(p,s), ``string``→string, ``date``→date32,
        ``timestamp``→timestamp("us", tz="UTC"), ``binary``→binary.

    Raises:
        ValueError: the spec has no such type.
    """
    ps = decimal_precision_scale(type_name)
    if ps is not None:
        return pa.decimal128(*ps)
    try:
        return _SIMPLE_TYPES[type_name]
    except KeyError:
        raise ValueError(f"unknown column type {type_name!r}") from None


def arrow_schema(table_def: TableDef) -> pa.Schema:
    """The Arrow schema of a table: its columns in order, typed and with their nullability.

    Args:
        table_def: the table's definition.

    Returns:
        One field per column, typed by :func:`arrow_type`.

    Raises:
        ValueError: a column has a type the spec does not know.
    """
    return pa.schema([pa.field(c.name, arrow_type(c.type), nullable=c.nullable) for c in table_def.columns])


# Pure transformations of net changes: Arrow in, Arrow out.


def typed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``schema``'s columns of ``table``, in its order and cast to its types, every column nullable.

    Nullability is left to the writer: a target checks every row it writes
    against the table's non-nullable columns.
    """
    loose = pa.schema([f.with_nullable(True) for f in schema])
    chosen = table.select(schema.names)
    return chosen if chosen.schema.equals(loose) else chosen.cast(loose)


def repeated_keys(rows: pa.Table, primary_key: Sequence[str]) -> int:
    """How many key values occur in more than one row of ``rows`` (null equals null).

    Args:
        rows: rows holding at least the key columns.
        primary_key: the key columns.

    Returns:
        The number of key values that repeat; 0 when every key is unique.
    """
    if len(primary_key) == 1 and pc.count_distinct(rows.column(primary_key[0]), mode="all").as_py() == rows.num_rows:
        return 0  # the usual answer, about 8 us where a group-by takes 60 (1,000 tables a cycle)
    keys = rows.select(list(primary_key)).rename_columns([f"k{i}" for i in range(len(primary_key))])
    groups = keys.group_by(keys.column_names, use_threads=False).aggregate([([], "count_all")])
    return int(pc.sum(pc.greater(groups.column("count_all"), 1)).as_py() or 0)


def filtered(rows: _Rows, keep: pa.ChunkedArray) -> _Rows:
    """``rows`` (a table or a column) where ``keep`` is true; ``rows`` themselves when it is true for every row.

    Arrow's filter copies every kept row: a first load's or an insert-only
    cycle's changes would be copied whole to drop nothing.
    """
    return rows if pc.all(keep, skip_nulls=False).as_py() else rows.filter(keep)


def expand_copies(counted: pa.Table, schema: pa.Schema) -> pa.Table:
    """Each row of ``counted`` repeated ``__count`` times (counts must be positive).

    Args:
        counted: row values plus ``__count``.
        schema: the table's Arrow schema.

    Returns:
        The copies, typed as ``schema``.
    """
    counts = counted.column(COUNT_COLUMN).to_numpy()
    if (counts == 1).all():  # one copy each, as a first load's rows: the rows as they are, not a copy
        return typed(counted, schema)
    return typed(counted, schema).take(pa.array(np.repeat(np.arange(len(counts)), counts)))


def _match_key(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Values that group together exactly when they are equal: -0.0 is 0.0 and every NaN one NaN.

    Nulls group with nulls already, so equality is null-safe too.
    """
    if not pa.types.is_floating(column.type):
        return column
    zeroed = pc.add(column, pa.scalar(0.0, column.type))  # -0.0 + 0.0 is +0.0
    return pc.if_else(pc.is_nan(zeroed), pa.scalar(math.nan, column.type), zeroed)


def _copies_to_remove(current: pa.Table, removals: pa.Table) -> pa.Table:
    """Per row value to delete: ``row_list`` (its copies in ``current``), ``take_sum``, ``rid_max`` (its removal)."""
    keys = [f"k{i}" for i in range(current.num_columns)]
    held = [_match_key(column) for column in current.columns]
    gone = [_match_key(removals.column(f.name).cast(f.type)) for f in current.schema]
    # Only rows whose every value occurs among the removals can go: group just those.
    found = [pc.is_in(h, value_set=g.combine_chunks(), skip_nulls=False) for h, g in zip(held, gone, strict=True)]
    index = pa.array(np.flatnonzero(functools.reduce(pc.and_, found).to_numpy(zero_copy_only=False)), pa.int64())
    candidates = {k: h.take(index) for k, h in zip(keys, held, strict=True)}
    candidates |= {
        "row": index,
        "take": pa.repeat(pa.scalar(0, pa.int64()), len(index)),
        "rid": pa.nulls(len(index), pa.int64()),
    }
    removed = dict(zip(keys, gone, strict=True))
    removed |= {
        "row": pa.nulls(removals.num_rows, pa.int64()),
        "take": pc.negate(removals.column(COUNT_COLUMN)),
        "rid": pa.array(np.arange(removals.num_rows), pa.int64()),
    }
    both = pa.concat_tables([pa.table(candidates), pa.table(removed)])
    groups = both.group_by(keys, use_threads=False).aggregate([("row", "list"), ("take", "sum"), ("rid", "max")])
    return groups.filter(pc.greater(groups.column("take_sum"), 0))


def take_copies(current: pa.Table, removals: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Which rows of ``current`` to keep when up to ``-__count`` copies of each value of ``removals`` go.

    Row values compare as typed values, null-safe (null equals null) and
    NaN-safe (NaN equals NaN, -0.0 equals 0.0). Which of several equal copies
    go does not matter; the others keep their exact values. A value with
    fewer copies than wanted loses all of them (a caller scanning a table
    file by file asks the next file for the rest).

    Args:
        current: rows (one file of a table, or all of it).
        removals: row values (``current``'s columns) plus ``__count``, negative.

    Returns:
        ``(keep, removed)``: a boolean mask over ``current``, and per removal
        row how many of its copies the mask removes.
    """
    groups = _copies_to_remove(current, removals)
    lists = groups.column("row_list").combine_chunks()
    rows, parents = pc.list_flatten(lists), pc.list_parent_indices(lists)
    present = rows.is_valid()
    rows, parents = rows.filter(present).to_numpy(), parents.filter(present).to_numpy()
    wanted = groups.column("take_sum").to_numpy()
    have = np.bincount(parents, minlength=len(wanted))
    ordinal = np.arange(len(parents)) - np.searchsorted(parents, parents)
    keep = np.ones(current.num_rows, dtype=bool)
    keep[rows[ordinal < wanted[parents]]] = False
    removed = np.zeros(removals.num_rows, dtype=np.int64)
    removed[groups.column("rid_max").to_numpy()] = np.minimum(have, wanted)
    return keep, removed


def remove_copies(current: pa.Table, removals: pa.Table) -> pa.Table:
    """``current`` without ``-__count`` copies of each row value of ``removals`` (see :func:`take_copies`).

    Returns:
        The rows of ``current`` that stay, in their order.

    Raises:
        ValueError: a row value has fewer copies in ``current`` than are to be deleted.
    """
    keep, removed = take_copies(current, removals)
    wanted = pc.negate(removals.column(COUNT_COLUMN)).to_numpy()
    if (removed < wanted).any():
        i = int(np.argmax(removed < wanted))
        raise ValueError(f"{wanted[i]} copies of a row value are to be deleted but the table holds {removed[i]}")
    return current.filter(pa.array(keep))


def split_keyed(
    result: pa.Table, schema: pa.Schema, primary_key: tuple[str, ...]
) -> tuple[pa.Table, pa.Table, dict[str, int], pa.Array]:
    """Split a keyed table's net changes (``__net_op`` then its columns) into upserts and deletes.

    Columns are taken by position, so a table column named like the internal
    ``__net_op`` cannot be mistaken for it.

    Args:
        result: ``__net_op`` then the table columns, as Spark returned them.
        schema: the table's Arrow schema (``arrow_schema``).
        primary_key: the key columns, in key order.

    Returns:
        ``(upserts, deletes, stats, new)``: all columns of net ``I``/``U`` rows,
        key columns of net ``D`` rows (both typed exactly as ``schema``), the
        counts of ``I``, ``U`` and ``D``, and per upsert whether it is a net
        ``I``. Every column is nullable (see :func:`~applier.engine.changes.typed`).
    """
    net_op = result.column(0)
    data = pa.Table.from_arrays(result.columns[1:], names=schema.names)
    is_delete = pc.equal(net_op, "D")
    upserted = pc.invert(is_delete)
    upserts = typed(filtered(data, upserted), schema)
    key_schema = _key_schema(schema, primary_key)
    deletes = typed(data.filter(is_delete).select(list(primary_key)), key_schema)
    stats = {op: int(pc.sum(pc.equal(net_op, op)).as_py() or 0) for op in ("I", "U", "D")}
    new = pc.equal(filtered(net_op, upserted), "I").combine_chunks()
    return upserts, deletes, stats, new


def counted_table(result: pa.Table, schema: pa.Schema) -> tuple[pa.Table, dict[str, int]]:
    """Type a keyless table's net changes (its columns then the signed count) and count copies.

    Args:
        result: the table columns then ``__count``, as Spark returned them.
        schema: the table's Arrow schema (``arrow_schema``).

    Returns:
        ``(counted, stats)``: ``counted`` typed as ``schema`` plus ``__count``
        int64; ``stats`` with ``I`` the copies to insert, ``D`` the copies to
        delete and ``U`` 0.
    """
    full = schema.append(pa.field(COUNT_COLUMN, pa.int64(), nullable=False))
    counted = typed(pa.Table.from_arrays(result.columns, names=full.names), full)
    count = counted.column(COUNT_COLUMN)
    inserted = pc.sum(pc.if_else(pc.greater(count, 0), count, 0)).as_py() or 0
    deleted = pc.sum(pc.if_else(pc.less(count, 0), pc.negate(count), 0)).as_py() or 0
    return counted, {"I": int(inserted), "U": 0, "D": int(deleted)}


def _key_schema(schema: pa.Schema, primary_key: tuple[str, ...]) -> pa.Schema:
    return pa.schema([schema.field(name) for name in primary_key])
