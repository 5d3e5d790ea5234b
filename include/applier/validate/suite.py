"""The expectation suite of a target table, derived from its definition (pure).

For a table the suite asks, in this order:

1. the columns as defined, in definition order (the Delta target appends
   added columns, so the table holds them in that order);
2. the row count the checkpoint expects (net inserts minus net deletes, kept
   by the engine), reconciling the load with what the engine reported;
3. for each column, its Spark type, and non-null values where the column is
   part of the primary key or not nullable;
4. a unique primary key: one column or the combination of a compound key;
   nothing for a table without a key, whose rows may repeat.

GX 1.x compares a Spark column's type by class name only (``DecimalType``
matches any precision), so types are checked by
:class:`ExpectColumnValuesToBeOfSparkType`, which compares the whole type:
``DecimalType(12,2)`` is not ``DecimalType(10,2)``. A table validated in
memory (pandas with Arrow-backed columns) is checked against the same names:
its Arrow types are named as Spark would read them (:func:`arrow_type_name`).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import types as T

from applier.engine.images_spark import spark_type
from applier.intermediate.schema import TableDef
from applier.validate._gx import ExpectColumnValuesToBeOfType, gx

_E = gx.expectations


def spark_type_name(data_type: T.DataType) -> str:
    """A Spark type as the suite and the results name it: ``LongType``, ``DecimalType(12,2)``.

    Args:
        data_type: a Spark SQL type.

    Returns:
        The type's repr without empty parentheses.
    """
    text = repr(data_type)
    return text[:-2] if text.endswith("()") else text


def arrow_type_name(data_type: Any) -> str:
    """An Arrow type named as Spark reads it (:func:`spark_type_name`): ``decimal128(12, 2)``, ``DecimalType(12,2)``."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_type

    if pa.types.is_large_string(data_type) or pa.types.is_string_view(data_type):
        data_type = pa.string()
    elif pa.types.is_large_binary(data_type) or pa.types.is_binary_view(data_type):
        data_type = pa.binary()
    return spark_type_name(from_arrow_type(data_type))


class ExpectColumnValuesToBeOfSparkType(ExpectColumnValuesToBeOfType):
    """Expect a Spark column to be of exactly one type, parameters included.

    ``type_`` is a type as :func:`spark_type_name` writes it. GX's own
    ``ExpectColumnValuesToBeOfType`` checks a Spark column only against the type's
    class; this subclass keeps its arguments, metric and Data Docs rendering and
    compares the whole type. On other execution engines it behaves as its parent.
    """

    def _validate(
        self,
        metrics: dict[str, Any],
        runtime_configuration: dict[str, Any] | None = None,
        execution_engine: Any = None,
    ) -> dict[str, Any]:
        from great_expectations.execution_engine.pandas_execution_engine import PandasExecutionEngine
        from great_expectations.execution_engine.sparkdf_execution_engine import SparkDFExecutionEngine

        if not isinstance(execution_engine, SparkDFExecutionEngine | PandasExecutionEngine):
            result: dict[str, Any] = super()._validate(metrics, runtime_configuration, execution_engine)
            return result
        column = self.configuration.kwargs.get("column")
        types = [c["type"] for c in metrics.get("table.column_types", []) if c["name"] == column]
        if not types:
            raise ValueError(f"column {column!r} is not in the table")
        spark = isinstance(execution_engine, SparkDFExecutionEngine)
        observed = spark_type_name(types[0]) if spark else arrow_type_name(types[0].pyarrow_dtype)
        return {"success": observed == self.configuration.kwargs.get("type_"), "result": {"observed_value": observed}}


def table_expectations(table: TableDef, expected_rows: int) -> list[Any]:
    """The expectations a target table must meet after a load.

    Args:
        table: the table's definition (the checkpoint's, the latest seen).
        expected_rows: the row count the checkpoint expects.

    Returns:
        GX expectation objects, in the order of the module docstring.
    """
    key = set(table.primary_key)
    expectations: list[Any] = [
        _E.ExpectTableColumnsToMatchOrderedList(column_list=list(table.column_names)),
        _E.ExpectTableRowCountToEqual(value=expected_rows),
    ]
    for column in table.columns:
        expectations.append(
            ExpectColumnValuesToBeOfSparkType(column=column.name, type_=spark_type_name(spark_type(column.type)))
        )
        if column.name in key or not column.nullable:
            expectations.append(_E.ExpectColumnValuesToNotBeNull(column=column.name))
    if len(table.primary_key) == 1:
        expectations.append(_E.ExpectColumnValuesToBeUnique(column=table.primary_key[0]))
    elif table.primary_key:
        expectations.append(_E.ExpectCompoundColumnsToBeUnique(column_list=list(table.primary_key)))
    return expectations
