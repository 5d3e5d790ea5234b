"""Every table's net changes of a cycle in one Spark job (engine design, "Row ordering and net changes").

Committed transactions take effect in ascending commit lsn, and the rows of one
transaction in ascending lsn (spec section 4), so every committed row has the
position ``(commit_lsn, lsn)``. Nothing here relies on the physical order of a
DataFrame; positions are compared explicitly.

The job reads the committed rows once and shuffles once, for all tables:

1. Rows at or before their table's last truncate are dropped (the target
   empties the table first), and so are the ``T`` rows.
2. Each row's *identity* is computed from its images: the primary key for a
   table with one, the whole row for a table without. Images are parsed with
   the table's types, and the identity is a canonical string of the typed
   values, so ``"1.5"`` and ``"1.50"`` in a ``decimal(p,1)`` column, ``-0.0``
   and ``0.0``, or two NaNs are one identity.
3. Each row yields events on identities: present with its after image, or
   absent (a delete, the old key of an update that moves the key). On a table
   without a key every event also counts +1 (a copy added) or -1 (removed).
4. Per table and identity, the first event says whether the identity existed
   before the cycle, the last one decides its final state, and the counts add
   up. That is a net insert, update or delete, or nothing; for a table without
   a key, a signed number of copies of the row value.
5. The final image of each identity is parsed into the table's typed columns.

Only identity columns are parsed for every row; full images only for the
final rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from applier.engine.images_spark import parse_image
from applier.intermediate.schema import Column, TableDef

NET_OP = "__net_op"
"""``I``, ``U`` or ``D`` for a table with a key; null for a table without (see :data:`COUNT`)."""
COUNT = "__n"
"""The signed count of copies of a row value, for a table without a key."""
_POS = "__pos"


def final_column(index: int) -> str:
    """The result column holding the typed final rows of the ``index``-th table."""
    return f"__r{index}"


def identity_columns(table: TableDef) -> tuple[Column, ...]:
    """The columns that identify a row: the primary key, or every column of a table without one."""
    if table.primary_key:
        return tuple(table.column(name) for name in table.primary_key)
    return table.columns


def _canonical(value: SparkColumn, column: Column) -> SparkColumn:
    """A string equal for two values exactly when they are equal as typed values (null stays null)."""
    if column.type == "double":
        # Spark compares NaN equal to NaN and -0.0 equal to 0.0; so must the identity.
        return F.when(F.isnan(value), F.lit("NaN")).when(value == 0, F.lit("0")).otherwise(value.cast("string"))
    if column.type == "binary":
        return F.base64(value)
    if column.type == "timestamp":
        return F.unix_micros(value).cast("string")
    return value.cast("string")


def _identity(parsed: SparkColumn, columns: Sequence[Column]) -> SparkColumn:
    parts = [_canonical(parsed.getField(c.name), c) for c in columns]
    return parts[0] if len(parts) == 1 else F.to_json(F.array(*parts))


def _identities(side: str, tables: Sequence[TableDef]) -> list[SparkColumn]:
    """The identity of each table's parsed ``before`` (``side`` "b") or ``after`` ("a") image."""
    return [_identity(F.col(f"__{side}{i}"), identity_columns(t)) for i, t in enumerate(tables)]


def _per_table(tables: Sequence[TableDef], values: Sequence[SparkColumn]) -> SparkColumn:
    """``values[i]`` for rows of ``tables[i]`` (null for any other table)."""
    table = F.col("table")
    chosen = F.when(table == tables[0].name, values[0])
    for t, value in zip(tables[1:], values[1:], strict=True):
        chosen = chosen.when(table == t.name, value)
    return chosen


def _after_truncates(truncates: Mapping[str, tuple[int, int]]) -> SparkColumn:
    """True for rows later than their table's last truncate (every row of a table without one)."""
    keep = F.lit(True)
    commit_lsn, lsn = F.col("commit_lsn"), F.col("lsn")
    for name, (at_commit, at_lsn) in truncates.items():
        later = (commit_lsn > at_commit) | ((commit_lsn == at_commit) & (lsn > at_lsn))
        keep = keep & ((F.col("table") != name) | later)
    return keep


def _identified(rows: DataFrame, tables: Sequence[TableDef]) -> DataFrame:
    """The rows with ``bkey``/``akey``, the identities of their before and after images.

    Parsing happens in its own projection, one column per table, so that each
    image is parsed once and only with its own table's types.
    """
    table = F.col("table")
    parsed = rows.select(
        "commit_lsn",
        "lsn",
        "table",
        "op",
        "before",
        "after",
        *(
            F.when(table == t.name, parse_image(F.col(image), identity_columns(t))).alias(f"__{image[0]}{i}")
            for image in ("before", "after")
            for i, t in enumerate(tables)
        ),
    )
    return parsed.select(
        F.struct("commit_lsn", "lsn").alias(_POS),
        "table",
        "op",
        "before",
        "after",
        table.isin([t.name for t in tables if not t.primary_key]).alias("multiset"),
        *(_per_table(tables, _identities(side, tables)).alias(f"{side}key") for side in "ba"),
    )


def _events(identified: DataFrame) -> DataFrame:
    """One row per event: ``__pos``, ``table`` and the struct ``e`` (key, present, existed, image, n)."""
    op = F.col("op")
    # A row value of a table without a key is its identity: every update moves it.
    moved = (op == "U") & (F.col("multiset") | ~F.col("bkey").eqNullSafe(F.col("akey")))
    present = F.struct(
        F.col("akey").alias("key"),
        F.lit(True).alias("present"),
        ((op == "U") & ~moved).alias("existed"),
        F.col("after").alias("image"),
        F.lit(1).alias("n"),
    )
    absent = F.struct(
        F.col("bkey").alias("key"),
        F.lit(False).alias("present"),
        F.lit(True).alias("existed"),
        F.col("before").alias("image"),
        F.lit(-1).alias("n"),
    )
    events = F.when(op == "D", F.array(absent)).when(moved, F.array(absent, present)).otherwise(F.array(present))
    return identified.select(_POS, "table", "multiset", F.explode(events).alias("e"))


def net_changes(rows: DataFrame, tables: Sequence[TableDef], truncates: Mapping[str, tuple[int, int]]) -> DataFrame:
    """Net changes of every table of ``tables`` from a cycle's committed rows.

    Args:
        rows: committed rows (``.dat`` columns plus ``commit_lsn``), ``T`` rows
            included; rows of tables not in ``tables`` must not occur.
        tables: the definitions (the latest of the cycle) of the tables to compile;
            columns added later read as null in older images.
        truncates: each truncated table's last truncate position ``(commit_lsn, lsn)``.

    Returns:
        One row per identity that changes: ``table``, :data:`NET_OP`,
        :data:`COUNT` and, per table ``i``, :func:`final_column` ``(i)``: a
        struct of the table's typed columns (the final row; for a delete the
        row's last image, of which only the key counts), null on other tables'
        rows.

    Raises:
        pyspark.errors.PySparkException: on evaluation, a value in an image that
            does not fit its type (the reader checks images first, so this means
            a broken input).
    """
    effective = rows.filter((F.col("op") != "T") & _after_truncates(truncates))
    events = _events(_identified(effective, tables))
    e = F.col("e")
    per_identity = events.groupBy("table", "multiset", e.getField("key").alias("key")).agg(
        F.min_by(e.getField("existed"), _POS).alias("existed"),
        F.max_by(F.struct(e.getField("present").alias("present"), e.getField("image").alias("image")), _POS).alias(
            "last"
        ),
        F.sum(e.getField("n")).alias(COUNT),
    )
    multiset, present = F.col("multiset"), F.col("last.present")
    existed = F.col("existed") & ~F.col("table").isin(list(truncates))
    changed = per_identity.filter(F.when(multiset, F.col(COUNT) != 0).otherwise(existed | present))
    net_op = F.when(multiset, F.lit(None).cast("string")).when(~present, "D").when(existed, "U").otherwise("I")
    image = F.col("last.image")
    return changed.select(
        "table",
        net_op.alias(NET_OP),
        F.col(COUNT),
        *(
            F.when(F.col("table") == t.name, parse_image(image, t.columns)).alias(final_column(i))
            for i, t in enumerate(tables)
        ),
    )
