"""Net changes of a cycle's committed rows, per table (engine design, "Row ordering and net changes").

Committed transactions take effect in ascending commit lsn, and the rows of one
transaction in ascending lsn (spec section 4), so every committed row has the
position ``(commit_lsn, lsn)``. The functions here never rely on the physical
order of a DataFrame; they compare positions explicitly.

- Rows at or before a table's last ``T`` have no effect; the target empties
  the table first.
- A table with a primary key: each row yields key events (present with the
  after image, or absent). Per key, the last event decides the final state
  and the first says whether the key existed before the cycle, which gives a
  net insert, update, delete, or nothing.
- A table without a primary key: the result of the log equals a multiset
  difference, so each full row value gets a signed count.

Keys and rows are compared as typed values (``"1.5"`` equals ``"1.50"`` in a
``decimal(p,1)`` column, NaN equals NaN, null equals null), never as JSON text.
Only key columns are parsed for every row; full images only for final rows.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from applier.engine.changes import COUNT_COLUMN, TableChanges, arrow_schema, typed
from applier.engine.images_spark import parse_image
from applier.intermediate.schema import TableDef

DAT_COLUMNS = ("lsn", "xid", "table", "op", "before", "after")
_POS = "__pos"
_NET_OP = "__net_op"


def committed_rows(rows: DataFrame, commits: DataFrame) -> DataFrame:
    """Keep the rows of committed transactions and give each its commit lsn.

    The result's order of effect is ``(commit_lsn, lsn)``; it is carried by
    those two columns, not by a sort (downstream steps compare them).

    Args:
        rows: the ``.dat`` columns (lsn, xid, table, op, before, after).
        commits: ``(xid string, commit_lsn long)`` of the transactions committed
            in the cycle, one row per xid; small, so it is broadcast.

    Returns:
        The ``.dat`` columns of rows whose xid is in ``commits``, plus ``commit_lsn``.
    """
    committed = F.broadcast(commits.select("xid", "commit_lsn"))
    return rows.join(committed, on="xid", how="inner").select(*DAT_COLUMNS, "commit_lsn")


def last_truncate(rows: DataFrame) -> tuple[int, int] | None:
    """The position ``(commit_lsn, lsn)`` of the last ``T`` row, or None without one.

    Args:
        rows: committed rows of one table (with ``commit_lsn``).

    Returns:
        The latest truncate's position. Runs one small Spark job; the ``T``
        rows are few, so they are collected as they are (no shuffle).
    """
    truncates = rows.filter(F.col("op") == "T").select("commit_lsn", "lsn").collect()
    return max(((r["commit_lsn"], r["lsn"]) for r in truncates), default=None)


def tables_and_truncates(rows: DataFrame) -> dict[str, tuple[int, int] | None]:
    """Every table with committed rows, and the position of its last ``T`` row (None without).

    One small Spark job for all tables, instead of one per table.

    Args:
        rows: committed rows of any tables (with ``commit_lsn``).

    Returns:
        ``{table: (commit_lsn, lsn) or None}``.
    """
    position = F.when(F.col("op") == "T", F.struct("commit_lsn", "lsn"))
    found = rows.groupBy("table").agg(F.max(position).alias("at")).collect()
    return {r["table"]: (r["at"]["commit_lsn"], r["at"]["lsn"]) if r["at"] is not None else None for r in found}


def rows_after(rows: DataFrame, position: tuple[int, int] | None) -> DataFrame:
    """The rows that take effect after ``position`` (all rows when it is None).

    Args:
        rows: committed rows with ``commit_lsn`` and ``lsn``.
        position: a ``(commit_lsn, lsn)`` position, typically the last truncate.

    Returns:
        The rows strictly later than ``position`` in ``(commit_lsn, lsn)`` order.
    """
    if position is None:
        return rows
    commit_lsn, lsn = position
    later = (F.col("commit_lsn") > commit_lsn) | ((F.col("commit_lsn") == commit_lsn) & (F.col("lsn") > lsn))
    return rows.filter(later)


def key_events(rows: DataFrame, table: TableDef) -> DataFrame:
    """The key events of a table with a primary key, one row per event.

    ``I`` and ``U`` on one key: the key is present with the after image; ``U``
    moving the key: the old key is absent, the new one present; ``D``: the key
    is absent. ``existed`` says whether the event implies the key existed just
    before it (true for an update in place and for every absent event).

    Args:
        rows: committed rows of the table without ``T`` rows.
        table: the table's definition (the latest of the cycle).

    Returns:
        Columns ``__pos`` (struct commit_lsn, lsn), ``__k0``, ``__k1``, ...
        (the typed key columns in key order; named by position so that no
        table column name can clash), ``present``, ``existed`` (booleans) and
        ``after`` (the JSON after image of a present event, else null).
    """
    key_columns = [table.column(name) for name in table.primary_key]
    parsed = rows.select(
        F.struct("commit_lsn", "lsn").alias(_POS),
        "op",
        "after",
        parse_image(F.col("before"), key_columns).alias("before_key"),
        parse_image(F.col("after"), key_columns).alias("after_key"),
    )
    op = F.col("op")
    moved = (op == "U") & ~F.col("before_key").eqNullSafe(F.col("after_key"))
    present = F.struct(
        F.col("after_key").alias("key"),
        F.lit(True).alias("present"),
        ((op == "U") & ~moved).alias("existed"),
        F.col("after").alias("after"),
    )
    absent = F.struct(
        F.col("before_key").alias("key"),
        F.lit(False).alias("present"),
        F.lit(True).alias("existed"),
        F.lit(None).cast("string").alias("after"),
    )
    events = F.when(op == "D", F.array(absent)).when(moved, F.array(absent, present)).otherwise(F.array(present))
    exploded = parsed.select(_POS, F.explode(events).alias("event"))
    key = F.col("event.key")
    return exploded.select(
        _POS,
        *(key.getField(name).alias(_key_alias(i)) for i, name in enumerate(table.primary_key)),
        "event.present",
        "event.existed",
        "event.after",
    )


def net_keyed(events: DataFrame, table: TableDef, *, truncated: bool) -> DataFrame:
    """Net operations per key from key events.

    Args:
        events: the output of :func:`key_events`.
        table: the table's definition.
        truncated: the table was emptied before these events, so no key existed.

    Returns:
        Column ``__net_op`` (``I``, ``U`` or ``D``) then one typed column per
        table column: the final image for ``I``/``U``, the key with nulls
        elsewhere for ``D``. Keys that were new and end absent are left out.
    """
    # Grouping on flat columns is about twice as fast as on one struct column.
    per_key = events.groupBy(*(_key_alias(i) for i in range(len(table.primary_key)))).agg(
        F.min_by("existed", _POS).alias("existed"),
        F.max_by(F.struct("present", "after"), _POS).alias("last"),
    )
    existed = F.lit(False) if truncated else F.col("existed")
    present = F.col("last.present")
    net = per_key.filter(existed | present).select(
        F.when(~present, "D").when(existed, "U").otherwise("I").alias(_NET_OP),
        *(_key_alias(i) for i in range(len(table.primary_key))),
        present.alias("present"),
        parse_image(F.col("last.after"), table.columns).alias("image"),
    )
    return net.select(_NET_OP, *(_final_column(name, table) for name in table.column_names))


def _final_column(name: str, table: TableDef) -> SparkColumn:
    """A column of the net result: the final image's value, the key's for a delete."""
    image_value = F.col("image").getField(name)
    if name not in table.primary_key:
        return image_value.alias(name)
    key_value = F.col(_key_alias(table.primary_key.index(name)))
    return F.when(F.col("present"), image_value).otherwise(key_value).alias(name)


def _key_alias(position: int) -> str:
    return f"__k{position}"


def counted_rows(rows: DataFrame, table: TableDef) -> DataFrame:
    """Signed counts per full row value of a table without a primary key.

    ``I`` adds one copy of the after row, ``D`` removes one copy of the before
    row, ``U`` does both. Values group null-safely and NaN with NaN.

    Args:
        rows: committed rows of the table without ``T`` rows.
        table: the table's definition.

    Returns:
        One typed column per table column plus ``__count`` (long, never 0).
    """
    op = F.col("op")
    before = F.struct(parse_image(F.col("before"), table.columns).alias("row"), F.lit(-1).alias("n"))
    after = F.struct(parse_image(F.col("after"), table.columns).alias("row"), F.lit(1).alias("n"))
    deltas = F.when(op == "I", F.array(after)).when(op == "D", F.array(before)).otherwise(F.array(before, after))
    row = F.col("delta.row")
    # Flat columns named by position group faster than a struct and cannot clash with "n".
    values = [row.getField(name).alias(f"__c{i}") for i, name in enumerate(table.column_names)]
    exploded = rows.select(F.explode(deltas).alias("delta")).select(*values, "delta.n")
    counts = exploded.groupBy(*(f"__c{i}" for i in range(len(values)))).agg(F.sum("n").alias(COUNT_COLUMN))
    return counts.filter(F.col(COUNT_COLUMN) != 0).select(
        *(F.col(f"__c{i}").alias(name) for i, name in enumerate(table.column_names)), COUNT_COLUMN
    )


def compile_table(rows: DataFrame, table: TableDef) -> TableChanges:
    """Compile one table's committed rows of a cycle into its net changes.

    Runs two Spark jobs: a small one finding the last truncate, and one
    computing the net result, fetched with ``toArrow()``. Persist ``rows``
    first when several tables are compiled from one input.

    Args:
        rows: the table's committed rows (``.dat`` columns plus ``commit_lsn``),
            ``T`` rows included.
        table: the table's definition, the latest of the cycle; columns added
            later read as null in older images.

    Returns:
        The table's :class:`~applier.engine.changes.TableChanges`; ``stats``
        counts net rows: ``I``/``U``/``D`` (for a table without a key, copies
        inserted and deleted) and ``T`` 1 when the table is truncated first.

    Raises:
        pyspark.errors.PySparkException: a value in an image does not fit its
            type (the reader checks images first, so this means a broken input).
    """
    return compile_table_at(rows, table, last_truncate(rows))


def compile_table_at(rows: DataFrame, table: TableDef, truncate_at: tuple[int, int] | None) -> TableChanges:
    """:func:`compile_table` with the last truncate's position already known (one Spark job).

    Args:
        rows: the table's committed rows, as for :func:`compile_table`.
        table: the table's definition.
        truncate_at: the ``(commit_lsn, lsn)`` of the table's last ``T`` row, or None.

    Returns:
        The table's net changes.
    """
    effective = rows_after(rows, truncate_at).filter(F.col("op") != "T")
    truncated = truncate_at is not None
    schema = arrow_schema(table)
    counted: pa.Table | None = None
    if table.primary_key:
        result = net_keyed(key_events(effective, table), table, truncated=truncated).toArrow()
        upserts, deletes, stats = split_keyed(result, schema, table.primary_key)
    else:
        counted, stats = counted_table(counted_rows(effective, table).toArrow(), schema)
        upserts, deletes = typed(schema.empty_table(), schema), pa.table({})
    stats["T"] = int(truncated)
    return TableChanges(table=table, truncate=truncated, upserts=upserts, deletes=deletes, counted=counted, stats=stats)


def split_keyed(
    result: pa.Table, schema: pa.Schema, primary_key: tuple[str, ...]
) -> tuple[pa.Table, pa.Table, dict[str, int]]:
    """Split the Arrow form of :func:`net_keyed` into upserts and deletes.

    Columns are taken by position, so a table column named like the internal
    ``__net_op`` cannot be mistaken for it.

    Args:
        result: ``__net_op`` then the table columns, as Spark returned them.
        schema: the table's Arrow schema (``arrow_schema``).
        primary_key: the key columns, in key order.

    Returns:
        ``(upserts, deletes, stats)``: all columns of net ``I``/``U`` rows, key
        columns of net ``D`` rows (both typed exactly as ``schema``), and the
        counts of ``I``, ``U`` and ``D``. Every column is nullable (see
        :func:`~applier.engine.changes.typed`).
    """
    net_op = result.column(0)
    data = pa.Table.from_arrays(result.columns[1:], names=schema.names)
    is_delete = pc.equal(net_op, "D")
    upserts = typed(data.filter(pc.invert(is_delete)), schema)
    key_schema = _key_schema(schema, primary_key)
    deletes = typed(data.filter(is_delete).select(list(primary_key)), key_schema)
    stats = {op: int(pc.sum(pc.equal(net_op, op)).as_py() or 0) for op in ("I", "U", "D")}
    return upserts, deletes, stats


def counted_table(result: pa.Table, schema: pa.Schema) -> tuple[pa.Table, dict[str, int]]:
    """Type the Arrow form of :func:`counted_rows` and count copies inserted and deleted.

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
