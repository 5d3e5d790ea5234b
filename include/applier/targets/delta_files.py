"""Deleting copies of row values from a keyless Delta table, one data file at a time.

A table without a primary key has no identity to merge on: a cycle says
"delete n copies of this row value". The table is scanned file by file (one
file in memory at a time, never the whole table); each file holding copies to
delete is rewritten without them; scanning stops once every copy is found.
The removed files, the rewritten ones and the cycle's inserted copies land in
ONE commit (``create_write_transaction``) carrying the cycle's app transaction,
so the change is atomic and exactly once like every other table's. When the
table holds fewer copies than the log deletes, nothing is committed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from applier.engine.changes import COUNT_COLUMN, take_copies, typed
from applier.targets.delta_parquet import add_file, now_ms, removed_on_failure


def rewrite_copies(
    table: DeltaTable,
    root: Path,
    name: str,
    schema: pa.Schema,
    removals: pa.Table,
    inserts: pa.Table,
    props: CommitProperties,
    missing: Callable[[int], None],
) -> int:
    """Delete ``-__count`` copies of each value of ``removals`` and add ``inserts``, in one commit.

    Args:
        table: the table as just opened.
        root: its folder.
        name: ``schema.table``, for messages.
        schema: its Arrow schema (typed as the definition says).
        removals: row values plus ``__count`` (negative).
        inserts: the copies to insert, typed as ``schema``.
        props: the commit's properties (the cycle's app transaction and tags).
        missing: told, before the commit, how many copies to delete the table
            does not hold (collisions) when there are some; it may raise to
            commit nothing.

    Returns:
        How many data files were rewritten.
    """
    remaining = (-removals.column(COUNT_COLUMN).to_numpy()).astype(np.int64)
    actions: list[AddAction | RemoveAction] = []
    rewritten = 0
    files = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"]).to_pylist()
    with removed_on_failure() as written:
        for entry in files:
            if not remaining.any():
                break
            active = np.flatnonzero(remaining > 0)
            wanted = removals.take(pa.array(active)).set_column(
                removals.schema.get_field_index(COUNT_COLUMN), COUNT_COLUMN, pa.array(-remaining[active], pa.int64())
            )
            rows = typed(pq.read_table(root / unquote(entry["path"])), schema)
            keep, removed = take_copies(rows, wanted)
            if not removed.any():
                continue
            remaining[active] -= removed
            rewritten += 1
            actions.append(RemoveAction(entry["path"], True, now_ms(), entry["size_bytes"], {}))
            kept = rows.filter(pa.array(keep))
            if kept.num_rows:
                actions.append(add_file(root, kept, written))
        if remaining.any():
            missing(int(remaining.sum()))
        if inserts.num_rows:
            actions.append(add_file(root, inserts, written))
        if actions:
            table.create_write_transaction(actions, mode="append", schema=schema, commit_properties=props)
    return rewritten
