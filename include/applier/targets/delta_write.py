"""Writing one table's net changes of a cycle to Delta, in one commit (delta-rs).

A keyed table takes one MERGE on its primary key (deletes and upserts in one
source, told apart by a marker column), or an overwrite after a truncate; a
table without a key takes appended copies, or a rewrite of only the files
holding copies to delete. A table seen first is created by its first rows,
written by pyarrow (:mod:`~applier.targets.delta_parquet`).
:class:`~applier.targets.delta.DeltaTarget` decides whether to write at all
(the cycle already held, an empty change) and tags the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, WriterProperties, write_deltalake

from applier.engine.changes import (
    COUNT_COLUMN,
    TableChanges,
    arrow_schema,
    expand_copies,
    filtered,
    repeated_keys,
    typed,
)
from applier.errors import TargetError
from applier.intermediate.schema import TableDef
from applier.targets.delta_files import rewrite_copies
from applier.targets.delta_parquet import ROW_GROUP_ROWS, create

_WRITER = WriterProperties(max_row_group_size=ROW_GROUP_ROWS)

Settle = Callable[[dict[str, int]], None]
"""Told a table's collisions per kind (:mod:`~applier.targets.collisions`); may raise to refuse them."""


def apply_keyed(
    table: DeltaTable | None, path: Path, changes: TableChanges, props: CommitProperties, settle: Settle
) -> None:
    """One MERGE on the primary key, or after a truncate one overwrite with the upserts.

    After a truncate every key is new, so ``deletes`` has nothing to act on;
    nor has it on a table not yet created (``table`` None), which the upserts create.
    The MERGE's metrics tell ``settle`` the collisions (after the commit: see
    :func:`merge_collisions`).
    """
    schema = arrow_schema(changes.table)
    upserts = typed(changes.upserts, schema)
    keys = list(changes.table.primary_key)
    named = upserts.select(keys)
    # Only the keys: a MERGE source (below) would copy every upserted row, and a create or an overwrite needs none.
    # The deletes count as the source's did: not after a truncate, which writes the upserts alone.
    deleted = [] if changes.truncate else [changes.deletes.select(keys).cast(named.schema)]
    repeated = repeated_keys(pa.concat_tables([named, *deleted]), keys)
    if repeated:
        # A MERGE refuses a key matching an existing row twice but inserts a new key twice.
        raise TargetError(f"table {changes.table.name}: {repeated} keys appear more than once in the changes")
    if table is None:
        create(path, changes.table.name, upserts, schema, props)
        return
    if changes.truncate:
        write_deltalake(table, upserts, mode="overwrite", commit_properties=props, writer_properties=_WRITER)
        return
    marker = unused_name("__applier_delete", schema.names)
    source = merge_source(upserts, changes.deletes, changes.table, marker)
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in changes.table.primary_key)
    columns = {quote(c): f"s.{quote(c)}" for c in schema.names}
    is_delete = f"s.{quote(marker)}"
    metrics = (
        table.merge(source, on, source_alias="s", target_alias="t", writer_properties=_WRITER, commit_properties=props)
        .when_matched_delete(is_delete)
        .when_matched_update(columns, f"NOT {is_delete}")
        .when_not_matched_insert(columns, f"NOT {is_delete}")
        .execute()
    )
    settle(merge_collisions(changes, metrics))


def merge_collisions(changes: TableChanges, metrics: Mapping[str, Any]) -> dict[str, int]:
    """The collisions a MERGE's metrics show: deletes exactly; inserts and updates by their difference.

    A delete that found no row deleted nothing. An upsert is updated or
    inserted whichever the table held, so the metrics give only how many more
    (or fewer) rows were inserted than the log's net inserts: an insert whose
    key was held and an update that found no row, in one table and cycle,
    cancel out. A MERGE cannot tell more; the PostgreSQL target counts each.
    """
    found = {"delete": changes.deletes.num_rows - int(metrics.get("num_target_rows_deleted", 0))}
    if changes.new is not None:
        extra = int(metrics.get("num_target_rows_inserted", 0)) - int(pc.sum(changes.new).as_py() or 0)
        found["update" if extra > 0 else "insert"] = abs(extra)
    return {kind: n for kind, n in found.items() if n}


def apply_counted(
    table: DeltaTable | None, path: Path, changes: TableChanges, props: CommitProperties, settle: Settle
) -> None:
    """Insert and delete copies of row values in one commit.

    Inserts alone are appended. Deletes rewrite only the data files holding
    the copies to delete, one file in memory at a time
    (:func:`~applier.targets.delta_files.rewrite_copies`): rows carry no
    identity, so a merge could not delete "n of the m equal rows". Copies to
    delete that the table does not hold are collisions, told to ``settle``
    before anything commits.
    """
    assert changes.counted is not None
    name = changes.table.name
    schema = arrow_schema(changes.table)
    count = changes.counted.column(COUNT_COLUMN)
    inserts = expand_copies(filtered(changes.counted, pc.greater(count, 0)), schema)
    removals = changes.counted.filter(pc.less(count, 0))
    if (changes.truncate or table is None) and removals.num_rows:
        settle({"delete": -int(pc.sum(removals.column(COUNT_COLUMN)).as_py())})  # nothing there to delete
    if table is None:
        create(path, name, inserts, schema, props)
    elif changes.truncate:  # ``table``, as just opened: delta-rs would open the table again from its path
        write_deltalake(table, inserts, mode="overwrite", commit_properties=props, writer_properties=_WRITER)
    elif removals.num_rows == 0:
        write_deltalake(table, inserts, mode="append", commit_properties=props, writer_properties=_WRITER)
    else:
        rewrite_copies(table, path, name, schema, removals, inserts, props, lambda n: settle({"delete": n}))


# Pure transformations: Arrow in, Arrow out.


def quote(name: str) -> str:
    """A column name as a delta-rs (DataFusion) SQL identifier: backticks, inner backticks doubled."""
    return "`" + name.replace("`", "``") + "`"


def unused_name(base: str, taken: Sequence[str]) -> str:
    """``base``, prefixed with underscores until no name in ``taken`` equals it."""
    while base in taken:
        base = f"_{base}"
    return base


def merge_source(upserts: pa.Table, deletes: pa.Table, table_def: TableDef, marker: str) -> pa.Table:
    """One MERGE source: the upserts, then the deletes, told apart by a boolean ``marker`` column.

    Delete rows carry only their key; their other columns are null, so every
    column of the source is nullable.

    Args:
        upserts: all columns of the rows to insert or update.
        deletes: the key columns of the rows to delete.
        table_def: the table's definition.
        marker: the name of the marker column (not a column of the table).

    Returns:
        The table's columns plus ``marker`` (true for a delete).
    """
    schema = arrow_schema(table_def)
    upserts = typed(upserts, schema)
    loose = upserts.schema.append(pa.field(marker, pa.bool_(), nullable=False))
    upsert_columns = [*upserts.columns, pa.repeat(False, upserts.num_rows)]
    n = deletes.num_rows
    delete_columns = [
        deletes.column(f.name).cast(f.type) if f.name in table_def.primary_key else pa.nulls(n, f.type) for f in schema
    ]
    return pa.concat_tables(
        [
            pa.Table.from_arrays(upsert_columns, schema=loose),
            pa.Table.from_arrays([*delete_columns, pa.repeat(True, n)], schema=loose),
        ]
    )
