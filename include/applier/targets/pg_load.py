"""Net changes as staging rows and COPY data, and rows read back as Arrow (pure Arrow).

A table's net changes become one Arrow table in the staging table's column
order (:func:`~applier.targets.pg_sql.staging_columns`), written to COPY as
CSV by pyarrow's C++ writer: PostgreSQL's CSV input reads an unquoted empty
field as null and ``""`` as the empty string, which is what the writer
produces. ``bytea`` travels as ``\\x`` hex text (PostgreSQL's input form),
built without a Python loop.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from applier.engine.changes import TableChanges
from applier.targets.pg_sql import COUNT, OP, ROW_ID

_ARROW_TYPES = {
    "boolean": pa.bool_(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "double precision": pa.float64(),
    "text": pa.string(),
    "date": pa.date32(),
    "timestamp with time zone": pa.timestamp("us", tz="UTC"),
    "bytea": pa.binary(),
}


_HEX = np.array([f"{b:02x}" for b in range(256)], dtype="S2").view(np.uint8).reshape(256, 2)
_CSV_OPTIONS = pa_csv.WriteOptions(include_header=False)
_BATCH_ROWS = 65_536


def staging_rows(changes: TableChanges) -> pa.Table:
    """The table's net changes in the staging table's columns.

    Keyed tables: every column then ``__op`` (``I`` and ``U`` rows carry the
    final row of a net insert or update, ``P`` of either when the changes do
    not tell, ``D`` rows the key and nulls). Tables without a key: ``__id`` (the row
    value's number), every column, ``__n`` (the signed copy count).
    """
    if changes.counted is not None:
        counted = changes.counted
        ids = pa.array(np.arange(counted.num_rows, dtype=np.int64))
        values = counted.select(list(changes.table.column_names)).columns
        columns = [ids, *values, counted.column(counted.num_columns - 1)]
        return pa.Table.from_arrays(columns, names=[ROW_ID, *changes.table.column_names, COUNT])
    upserts = changes.upserts
    deletes = changes.deletes
    full = [
        deletes.column(f.name) if f.name in deletes.column_names else pa.nulls(deletes.num_rows, f.type)
        for f in upserts.schema
    ]
    names = [*upserts.column_names, OP]
    if changes.new is None:  # not known whether new: an upsert, not counted
        ops = pa.repeat(pa.scalar("P"), upserts.num_rows).cast(pa.string())
    else:
        ops = pc.if_else(changes.new, "I", "U")
    ups = upserts.append_column(OP, ops)
    dels = pa.Table.from_arrays([*full, pa.repeat(pa.scalar("D"), deletes.num_rows).cast(pa.string())], names=names)
    return pa.concat_tables([ups, dels.cast(ups.schema)])


def bytea_text(values: pa.Array) -> pa.Array:
    """Binary values as PostgreSQL ``bytea`` input text: ``\\x`` then two hex digits a byte (null stays null)."""
    binary = pc.cast(values, pa.large_binary()) if not pa.types.is_large_binary(values.type) else values
    offsets = np.frombuffer(binary.buffers()[1], dtype=np.int64, count=len(binary) + 1, offset=binary.offset * 8)
    data = np.frombuffer(binary.buffers()[2], dtype=np.uint8) if binary.buffers()[2] else np.zeros(0, np.uint8)
    start, end = int(offsets[0]), int(offsets[-1])
    hexed = _HEX[data[start:end]].reshape(-1)
    lengths = np.diff(offsets)
    out_offsets = np.concatenate([[0], np.cumsum(lengths * 2 + 2)]).astype(np.int64)
    out = np.empty(int(out_offsets[-1]), dtype=np.uint8)
    positions = out_offsets[:-1]
    out[positions] = ord("\\")
    out[positions + 1] = ord("x")
    body = np.ones(len(out), dtype=bool)
    body[positions] = False
    body[positions + 1] = False
    out[body] = hexed
    text = pa.LargeStringArray.from_buffers(len(binary), pa.py_buffer(out_offsets), pa.py_buffer(out))
    return pc.if_else(binary.is_valid(), text, pa.scalar(None, pa.large_string()))


def csv_bytes(rows: pa.Table | pa.RecordBatch) -> bytes:
    """``rows`` as CSV for ``COPY … (FORMAT csv)``, binary columns as ``bytea`` hex."""
    if isinstance(rows, pa.Table):
        rows = rows.combine_chunks()  # pyarrow's CSV writer mishandles a table whose first chunk is empty
    columns = []
    for column in rows.columns:
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            column = pa.chunked_array([bytea_text(c) for c in chunks], pa.large_string())
        columns.append(column)
    table = pa.Table.from_arrays(columns, names=rows.schema.names)
    out = io.BytesIO()
    pa_csv.write_csv(table, out, _CSV_OPTIONS)
    return out.getvalue()


def read_batches(source: pa.Table | None) -> Iterator[pa.RecordBatch]:
    """Staging rows batch by batch (nothing once they are in staging)."""
    if source is not None:
        yield from source.to_batches(max_chunksize=_BATCH_ROWS)


def rows_as_arrow(columns: list[tuple[str, str, int | None, int | None]], rows: list[tuple[object, ...]]) -> pa.Table:
    """Rows read from PostgreSQL, typed as the spec types map to Arrow.

    Args:
        columns: ``(name, data_type, numeric_precision, numeric_scale)`` from ``information_schema.columns``.
        rows: the table's rows, in those columns' order.
    """
    return pa.table(
        {
            column: pa.array([r[i] for r in rows], _ARROW_TYPES.get(kind) or pa.decimal128(precision, scale))
            for i, (column, kind, precision, scale) in enumerate(columns)
        }
    )
