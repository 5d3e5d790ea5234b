"""Typed Spark columns from the JSON row images of intermediate files (spec section 3).

A ``before``/``after`` image is a JSON object whose values follow the spec's
encoding. Spark's JSON reader (``from_json`` with an explicit schema) decodes
every one of them to the spec type directly, as checked on Spark 4.1:

- ``int``/``bigint``/``boolean``/``string``: plain JSON values;
- ``double``: JSON numbers, and the strings ``"NaN"``, ``"Infinity"``,
  ``"-Infinity"``;
- ``decimal(p,s)``: the exact decimal held in a JSON string (``"12.50"``);
- ``date``: ``YYYY-MM-DD``; ``timestamp``: ISO 8601 with ``Z``, microseconds
  kept (the ``Z`` fixes the instant whatever the session time zone);
- ``binary``: standard base64 in a JSON string.

Field names match exactly (case-sensitive), and a column missing from an image
reads as null, which is what an image written before a nullable column was
added needs. Parsing is FAILFAST: a value that does not fit its type raises
instead of turning silently into null (the reader has checked every image, so
this only guards against a broken invariant).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F
from pyspark.sql import types as T

from applier.intermediate.schema import Column, decimal_precision_scale

_SIMPLE_TYPES: dict[str, T.DataType] = {
    "boolean": T.BooleanType(),
    "int": T.IntegerType(),
    "bigint": T.LongType(),
    "double": T.DoubleType(),
    "string": T.StringType(),
    "date": T.DateType(),
    "timestamp": T.TimestampType(),
    "binary": T.BinaryType(),
}
_PARSE_OPTIONS = {"mode": "FAILFAST"}


def spark_type(type_name: str) -> T.DataType:
    """The Spark type holding values of a spec column type.

    Args:
        type_name: a spec type name (``int``, ``decimal(12,2)``, ...).

    Returns:
        The Spark SQL type (``timestamp`` is the UTC instant type ``TimestampType``).

    Raises:
        ValueError: for a type name the spec does not know.
    """
    simple = _SIMPLE_TYPES.get(type_name)
    if simple is not None:
        return simple
    precision_scale = decimal_precision_scale(type_name)
    if precision_scale is None:
        raise ValueError(f"unknown column type {type_name!r}")
    return T.DecimalType(*precision_scale)


def image_schema(columns: Sequence[Column]) -> T.StructType:
    """The struct type an image of ``columns`` parses into (every field nullable).

    Args:
        columns: the columns to read, in the order the struct should have.

    Returns:
        A struct with one nullable field per column, named like the column.
    """
    return T.StructType([T.StructField(c.name, spark_type(c.type), nullable=True) for c in columns])


def parse_image(image: SparkColumn, columns: Sequence[Column]) -> SparkColumn:
    """Parse a JSON image column into a struct of typed ``columns``.

    Only the listed columns are decoded; other keys of the image are skipped,
    so parsing just the key columns of a wide row stays cheap.

    Args:
        image: a string column holding JSON images (null stays null).
        columns: the columns to decode.

    Returns:
        A struct column; a column absent from an image is null in it.
    """
    return F.from_json(image, image_schema(columns), _PARSE_OPTIONS)
