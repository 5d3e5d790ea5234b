"""Data files the Delta target writes itself (pyarrow), and the actions that add them to a table.

delta-rs's writer holds about 3.5 times a table's Arrow data while it writes
it (a 21 MiB table: +72 MiB), so the first cycle of a large load peaked in
its table creates, and the peak grew with the cycle's largest table. pyarrow
writes a table's rows a row group at a time (+22 MiB for a 30 MiB table). A
new table (:func:`create`) and a keyless table's rewritten files
(:mod:`~applier.targets.delta_files`) are written here; the file actions then
commit through delta-rs, which writes the log.

Only where delta-rs's writer would enforce nothing that is not checked here
or before: a new table has no CHECK constraints yet (its NOT NULL columns are
checked here, :func:`refuse_nulls`); a keyless table's rewrite keeps rows that
passed them and inserts rows the target checked first
(:mod:`~applier.targets.delta_check`). Appends, overwrites and merges of an
existing table go through delta-rs's writer.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties
from deltalake import Schema as DeltaSchema
from deltalake.transaction import AddAction, create_table_with_add_actions

from applier.targets.delta_schema import NEW_TABLE_PROPERTIES

ROW_GROUP_ROWS = 65_536
"""Rows per Parquet row group of the data files written (delta-rs's own default is 1,048,576).

The writer encodes a row group whole in memory before it writes it out: on
the 4x benchmark workload (560,000 net rows in six tables) the driver's peak
in its Delta writes was 474 and 492 MiB with delta-rs's default, 456 and 456
with row groups of 65,536 rows, in the same time.
"""

FILE_BYTES = 128 * 2**20
"""Arrow bytes of rows per data file written here: a larger table is cut into files of about this much."""


def now_ms() -> int:
    """Now, in milliseconds since the epoch: the time a file action carries."""
    return int(time.time() * 1000)


def file_stats(rows: pa.Table) -> str:
    """The ``stats`` of a data file holding ``rows`` (JSON): its row count and each column's null count.

    No bounds (``minValues``/``maxValues``): delta-rs 1.6's datasets read a
    file with bounds for some columns as bounds of null for the others and
    skip it for any value of those, so a file would need delta-rs's own form
    of a bound for every type (whose doubles and large decimals it rounds).
    Readers read every file written here; the files MERGEs write carry
    delta-rs's bounds.
    """
    nulls = {name: column.null_count for name, column in zip(rows.column_names, rows.columns, strict=True)}
    return json.dumps({"numRecords": rows.num_rows, "nullCount": nulls}, separators=(",", ":"))


def file_slices(rows: pa.Table, file_bytes: int | None = None) -> Iterator[pa.Table]:
    """``rows`` cut into slices of about ``file_bytes`` (:data:`FILE_BYTES`) of Arrow data, a row group at least.

    None for no rows.
    """
    per_file = max(ROW_GROUP_ROWS, rows.num_rows * (file_bytes or FILE_BYTES) // max(rows.nbytes, 1))
    for start in range(0, rows.num_rows, per_file):
        yield rows.slice(start, per_file)


def add_file(root: Path, rows: pa.Table, written: list[Path]) -> AddAction:
    """Write ``rows`` as a new data file of the table at ``root``; the action that adds it.

    Its path goes into ``written`` before the file is begun, so a caller that
    fails later removes what was written (:func:`removed_on_failure`).
    """
    name = f"part-applier-{uuid.uuid4()}.snappy.parquet"
    path = root / name
    written.append(path)
    pq.write_table(rows, path, compression="snappy", row_group_size=ROW_GROUP_ROWS)
    return AddAction(name, path.stat().st_size, {}, now_ms(), True, file_stats(rows))


@contextmanager
def removed_on_failure() -> Iterator[list[Path]]:
    """A list of the files written under it, removed if it ends with an exception (nothing committed them)."""
    written: list[Path] = []
    try:
        yield written
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise


class NullInNotNull(ValueError):
    """Rows with a null in a NOT NULL column: what delta-rs's writer refuses as an invariant violation."""


def refuse_nulls(rows: pa.Table, schema: pa.Schema) -> None:
    """Refuse ``rows`` when one has a null in a column ``schema`` says is NOT NULL, as delta-rs's writer would.

    Raises:
        NullInNotNull: naming the column and how many rows.
    """
    for field in schema:
        nulls = rows.column(field.name).null_count
        if not field.nullable and nulls:
            raise NullInNotNull(f"{nulls} rows have a null in NOT NULL column {field.name!r}")


def create(path: Path, name: str, rows: pa.Table, schema: pa.Schema, props: CommitProperties) -> None:
    """Create the table at ``path`` with its first rows, in one commit (it must not exist yet).

    The table takes ``schema`` (the definition's, NOT NULL included); the rows
    are refused whole when one breaks a NOT NULL column.
    """
    loose = pa.schema([f.with_nullable(True) for f in schema])
    rows = rows if rows.schema.equals(loose) else rows.cast(loose)
    refuse_nulls(rows, schema)
    path.mkdir(parents=True, exist_ok=True)
    with removed_on_failure() as written:
        actions = [add_file(path, part, written) for part in file_slices(rows)]
        delta_schema = DeltaSchema.from_arrow(schema)
        create_table_with_add_actions(str(path), delta_schema, actions, mode="error", name=name,
                                      configuration=NEW_TABLE_PROPERTIES, commit_properties=props)  # fmt: skip
