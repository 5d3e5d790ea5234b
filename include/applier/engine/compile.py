"""Net changes of a cycle's committed rows, per table (engine design, "Row ordering and net changes").

The Spark side (one job for all tables) is :mod:`applier.engine.netting`; this
module prepares its input (the committed rows) and turns its Arrow result into
each table's :class:`~applier.engine.changes.TableChanges`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from applier.engine.changes import COUNT_COLUMN, TableChanges, arrow_schema, typed
from applier.engine.netting import COUNT, NET_OP, final_column, net_changes
from applier.intermediate.schema import TableDef

DAT_COLUMNS = ("lsn", "xid", "table", "op", "before", "after")


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


def compile_cycle(
    rows: DataFrame,
    tables: Mapping[str, TableDef],
    truncates: Mapping[str, tuple[int, int]],
    touched: Iterable[str],
) -> dict[str, TableChanges]:
    """Compile a cycle's committed rows into each table's net changes, in one Spark job.

    Args:
        rows: the committed rows (``.dat`` columns plus ``commit_lsn``), ``T`` rows included.
        tables: table definitions (the latest of the cycle) by name; must hold every touched table.
        truncates: each truncated table's last truncate position ``(commit_lsn, lsn)``.
        touched: the tables the committed rows change (from the driver's reading).

    Returns:
        ``{table: TableChanges}`` for every touched table (empty changes when
        its rows net to nothing). ``stats`` counts net rows: ``I``/``U``/``D``
        (for a table without a key, copies inserted and deleted) and ``T`` 1
        when the table is truncated first.

    Raises:
        pyspark.errors.PySparkException: a value in an image does not fit its
            type (the reader checks images first, so this means a broken input).
    """
    defs = [tables[name] for name in sorted(set(touched) | set(truncates))]
    if not defs:
        return {}
    result = net_changes(rows, defs, truncates).toArrow()
    names = result.column("table")
    return {
        table.name: _table_changes(result.filter(pc.equal(names, table.name)), i, table, table.name in truncates)
        for i, table in enumerate(defs)
    }


def _table_changes(result: pa.Table, index: int, table: TableDef, truncated: bool) -> TableChanges:
    """One table's :class:`TableChanges` from its rows of :func:`~applier.engine.netting.net_changes`."""
    schema = arrow_schema(table)
    final = result.column(final_column(index)).combine_chunks()
    columns = final.flatten() if len(final) else [pa.array([], f.type) for f in final.type]
    counted: pa.Table | None = None
    if table.primary_key:
        keyed = pa.Table.from_arrays([result.column(NET_OP).combine_chunks(), *columns], names=[NET_OP, *schema.names])
        upserts, deletes, stats = split_keyed(keyed, schema, table.primary_key)
    else:
        plain = pa.Table.from_arrays([*columns, result.column(COUNT).combine_chunks()], names=[*schema.names, COUNT])
        counted, stats = counted_table(plain, schema)
        upserts, deletes = typed(schema.empty_table(), schema), pa.table({})
    stats["T"] = int(truncated)
    return TableChanges(table=table, truncate=truncated, upserts=upserts, deletes=deletes, counted=counted, stats=stats)


def compile_table(rows: DataFrame, table: TableDef) -> TableChanges:
    """Compile one table's committed rows of a cycle into its net changes.

    Every row counts as a row of ``table``, whatever its ``table`` column says.
    Runs two Spark jobs: a small one finding the last truncate, and
    :func:`compile_cycle`'s.

    Args:
        rows: the table's committed rows (``.dat`` columns plus ``commit_lsn``),
            ``T`` rows included.
        table: the table's definition, the latest of the cycle.

    Returns:
        The table's :class:`~applier.engine.changes.TableChanges`.
    """
    rows = rows.withColumn("table", F.lit(table.name))
    at = last_truncate(rows)
    truncates = {table.name: at} if at is not None else {}
    return compile_cycle(rows, {table.name: table}, truncates, [table.name])[table.name]


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
