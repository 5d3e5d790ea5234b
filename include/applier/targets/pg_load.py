"""Net changes as staging rows and COPY data, and rows read back as Arrow (pure Arrow).

A table's net changes become one Arrow table in the staging table's column
order (:func:`~applier.targets.pg_sql.staging_columns`), sent to COPY in
PostgreSQL's binary format, encoded from Arrow by pgpq (Rust): on 200,000
rows of nine mixed columns, 0.02-0.04 CPU s against 0.3 s for pyarrow's CSV
writer, and the COPY took 0.13 s of wall time against 0.47-0.53 s, the server
no longer parsing text.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pgpq
import pyarrow as pa
import pyarrow.compute as pc

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


def binary_copy(rows: pa.Table | None) -> Iterator[bytes]:
    """``rows`` as ``COPY … (FORMAT binary)`` data, encoded by pgpq a batch at a time (nothing for None).

    The staging rows' Arrow types are the staging columns' (``int`` int32 for
    ``integer``, ``timestamp`` for ``timestamptz``, whose binary forms are one),
    which binary COPY needs: it checks each value's size, not its text. Every
    field is nullable there (a delete's non-key columns are null).
    """
    if rows is None:
        return
    schema = pa.schema([f.with_nullable(True) for f in rows.schema])
    encoder = pgpq.ArrowToPostgresBinaryEncoder(schema)
    yield encoder.write_header()
    for batch in read_batches(rows):
        yield encoder.write_batch(batch)
    yield encoder.finish()


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
