"""A Delta table's shape against its definition: created, evolved with nullable columns, or refused (drift).

Also what a table's net changes must look like before they are written.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pyarrow.compute as pc
from deltalake import DeltaTable, Field
from deltalake import Schema as DeltaSchema

from applier.engine.changes import COUNT_COLUMN, TableChanges, arrow_schema
from applier.errors import TargetError
from applier.intermediate.schema import TableDef

log = logging.getLogger("applier.targets.delta")

NEW_TABLE_PROPERTIES = {"delta.checkpointInterval": "10"}
"""The properties of every Delta table the Applier creates (a table it finds keeps its own).

A checkpoint every 10 commits, Delta Lake's own default (delta-rs's is 100):
every open of a table reads its last checkpoint and the commits after it, so
with 100 a table applied to once a cycle was read from up to 99 JSON commits,
and the driver's memory followed the longest replay. The benchmark's 600
one-pair cycles, side by side: the driver's peak 236 -> 253 MiB with 100,
231 -> 238 with 10; a cycle's table phase 0.071 -> 0.099 s with 100, 0.038
-> 0.092 with 10 (medians of the first and last hundred cycles). A table's
owner may set another interval afterwards (``delta.checkpointInterval``).
"""


def prepared(path: Path, table_def: TableDef, current: DeltaTable | None) -> DeltaTable:
    """The table, created or evolved to the definition's columns (``current``: as just opened)."""
    if current is None:
        DeltaTable.create(
            str(path), arrow_schema(table_def), mode="error", name=table_def.name, configuration=NEW_TABLE_PROPERTIES
        )
        return DeltaTable(str(path))
    added = added_fields(current, table_def)
    if added:
        current.alter.add_columns(added)
        log.info("table %s: added columns %s", table_def.name, ", ".join(f.name for f in added))
        current = DeltaTable(str(path))
    return current


def added_fields(current: DeltaTable, table_def: TableDef, *, extra_nullable: bool = False) -> list[Field]:
    """The definition's columns the table lacks; the others must match exactly.

    ``extra_nullable``: nullable columns past the definition's are let pass (at
    the start of a run, a cycle under way may have added columns the
    checkpoint's definition has not yet).
    """
    have = list(current.schema().fields)
    want = list(DeltaSchema.from_arrow(arrow_schema(table_def)).fields)
    extra = have[len(want) :]
    common = min(len(have), len(want))
    if want[:common] != have[:common] or (extra and not (extra_nullable and all(f.nullable for f in extra))):
        pairs = zip(want, have, strict=False)
        differ = next(
            (f"column {w.name}: expected {describe([w])}, found {describe([h])}" for w, h in pairs if w != h),
            f"found columns the definition does not have: {describe(extra)}",
        )
        raise TargetError(
            f"table {table_def.name}: the Delta table was changed so that applying to it could lose data "
            f"({differ}); its columns: {describe(have)}",
            error_class="schema",
            table=table_def.name,
        )
    added = want[len(have) :]
    required = [f.name for f in added if not f.nullable]
    if required:
        raise TargetError(
            f"table {table_def.name}: cannot add non-nullable columns {required} to existing rows",
            error_class="schema",
            table=table_def.name,
        )
    return added


def describe(fields: Sequence[Field]) -> str:
    """``name type[ not null]`` of each field (a primitive type by its name: ``decimal(12,2)``)."""
    return ", ".join(f"{f.name} {getattr(f.type, 'type', f.type)}{'' if f.nullable else ' not null'}" for f in fields)


def check_shape(changes: TableChanges) -> None:
    table = changes.table
    missing_upserts = set(table.column_names) - set(changes.upserts.column_names)
    missing_deletes = set(table.primary_key) - set(changes.deletes.column_names)
    if table.primary_key and (changes.counted is not None or missing_upserts or missing_deletes):
        raise ValueError(f"table {table.name}: changes of a keyed table need upserts, deletes and no counted")
    if not table.primary_key:
        wanted = {*table.column_names, COUNT_COLUMN}
        if changes.counted is None or wanted - set(changes.counted.column_names):
            raise ValueError(f"table {table.name}: changes of a table without a key need counted")


def is_empty(changes: TableChanges) -> bool:
    if changes.truncate:
        return False
    if changes.counted is not None:
        return not bool(pc.any(pc.not_equal(changes.counted.column(COUNT_COLUMN), 0)).as_py())
    return bool(changes.upserts.num_rows == 0 and changes.deletes.num_rows == 0)
