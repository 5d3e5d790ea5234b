"""Target tables as Spark DataFrames, for validation.

:func:`read_target_table` asks the dialect of the configured target type
(:mod:`applier.targets.dialects`) to read a table, with one of the readers
here. A PostgreSQL table is read by the target into Arrow and handed to Spark
(:func:`read_through_arrow`).

A Delta table is read without Spark's Delta jars (which cannot be fetched
here): delta-rs lists the Parquet files of the table's current version and
gives its schema, and Spark reads those files with that schema. Spark fills a
column that an older file lacks (one added later) with nulls, and an empty
table is an empty DataFrame of the table's columns. Reading the files directly
is only right for tables without partition columns, deletion vectors or
column mapping, which the Delta target never writes; a table with any of them
is refused rather than read wrongly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql import types as T

from applier.config import Config
from applier.errors import TargetError
from applier.targets import Target
from applier.targets.dialects import dialect

# Reader features whose tables cannot be read as plain Parquet files.
_UNSUPPORTED_FEATURES = frozenset({"deletionVectors", "columnMapping"})


def read_target_table(config: Config, spark: Any, table: str) -> Any | None:
    """One target table's current contents as a Spark DataFrame.

    Args:
        config: the configuration (``target.*`` picks the target).
        spark: the Spark session to read with.
        table: ``schema.table``.

    Returns:
        The DataFrame, with the table's own column names and types; None when
        the table does not exist in the target.

    Raises:
        ConfigError: the target type cannot be validated.
        TargetError: the table cannot be read (naming it and why).
    """
    return dialect(config.target.type, "validation reads").read_table(config, spark, table)


def read_through_arrow(spark: Any, target: Target, table: str) -> Any | None:
    """A table the target reads as Arrow (PostgreSQL), as a Spark DataFrame built from it in the driver.

    The whole table passes through the driver's memory: fine for validating
    the tables these tests and demos load; a warehouse of large tables is
    better validated over Spark's JDBC reader, which needs the PostgreSQL JDBC
    driver on Spark's class path.
    """
    rows = target.read_arrow(table)
    if rows is None:
        return None
    return spark.createDataFrame(rows)


def read_target_arrow(config: Config, table: str) -> pa.Table | None:
    """One target table's current contents as Arrow, for validation in memory (None: the target lacks it)."""
    rows: pa.Table | None = dialect(config.target.type, "validation reads").read_arrow(config, table)
    return rows


def read_delta_arrow(path: Path, table: str) -> pa.Table | None:
    """A Delta table's current version as Arrow, through delta-rs (None when ``path`` holds no Delta table).

    Raises:
        TargetError: delta-rs cannot open or read the table.
    """
    try:
        if not DeltaTable.is_deltatable(str(path)):
            return None
        rows: pa.Table = DeltaTable(str(path)).to_pyarrow_table()
    except (DeltaError, OSError) as e:
        raise TargetError(f"table {table}: reading the Delta table at {path} failed: {_first_line(e)}") from e
    return rows


def read_delta_table(spark: Any, path: Path, table: str) -> Any | None:
    """A Delta table's current version as a Spark DataFrame (see the module docstring).

    Args:
        spark: the Spark session.
        path: the Delta table's folder.
        table: ``schema.table``, for messages.

    Returns:
        The DataFrame; None when ``path`` holds no Delta table.

    Raises:
        TargetError: delta-rs cannot open the table, or it uses a feature
            that plain Parquet reading would get wrong.
    """
    try:
        if not DeltaTable.is_deltatable(str(path)):
            return None
        # One snapshot gives both the schema and the files, so they agree.
        current = DeltaTable(str(path))
        problem = _unreadable_because(current)
        schema = T.StructType.fromJson(json.loads(current.schema().to_json()))
        files = list(current.file_uris())
    except (DeltaError, OSError) as e:
        raise TargetError(f"table {table}: reading the Delta table at {path} failed: {_first_line(e)}") from e
    if problem:
        raise TargetError(f"table {table}: the Delta table at {path} cannot be validated: {problem}")
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*files)


def _unreadable_because(table: DeltaTable) -> str | None:
    """Why the table's Parquet files are not its rows as they stand, or None."""
    partitions = list(table.metadata().partition_columns)
    if partitions:
        return f"it is partitioned by {partitions} (partition values are not in the files)"
    features = _UNSUPPORTED_FEATURES.intersection(table.protocol().reader_features or ())
    if features:
        return f"it uses the reader features {sorted(features)}"
    mapping = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mapping != "none":
        return f"it uses column mapping ({mapping})"
    return None


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
