"""A Delta table's CHECK constraints, checked before any table of a cycle (or part) commits.

delta-rs checks a table's constraints when it writes, one table at a time: a
cycle whose fifth table refuses a row has already committed four tables. So
the Delta target checks the rows of every constrained table first, and only
then commits; a refusal then leaves nothing of the part, like a rolled-back
PostgreSQL transaction, and the enhanced retry can split it
(:mod:`applier.engine.units`).

The check is delta-rs's own: the rows are written to a scratch table, in a
temporary folder, that carries the same constraints (about 10 ms), so the
rules (a NULL result refuses, as in Delta) cannot drift from the writer's.
On a refusal each constraint is tried alone, to name the one that refused.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from applier.engine.changes import COUNT_COLUMN, TableChanges

CONSTRAINT_PREFIX = "delta.constraints."
REFUSED = "failed validation check"


def constraints_of(table: DeltaTable) -> dict[str, str]:
    """The table's CHECK constraints: name -> SQL expression."""
    configuration = table.metadata().configuration
    return {k.removeprefix(CONSTRAINT_PREFIX): v for k, v in configuration.items() if k.startswith(CONSTRAINT_PREFIX)}


def rows_to_check(changes: TableChanges) -> pa.Table:
    """The rows a table's net changes write: upserts, or a keyless table's values with copies added."""
    if changes.counted is None:
        return changes.upserts
    added = changes.counted.filter(pc.greater(changes.counted[COUNT_COLUMN], 0))
    return added.drop_columns([COUNT_COLUMN])


def refused_constraints(rows: pa.Table, constraints: Mapping[str, str]) -> list[str]:
    """The constraints some of ``rows`` break, in name order ([] when every row passes them all)."""
    if not rows.num_rows or not constraints or _passes(rows, constraints):
        return []
    return [name for name in sorted(constraints) if not _passes(rows, {name: constraints[name]})]


def _passes(rows: pa.Table, constraints: Mapping[str, str]) -> bool:
    with tempfile.TemporaryDirectory(prefix="applier-check-") as folder:
        write_deltalake(folder, rows.schema.empty_table())
        DeltaTable(folder).alter.add_constraint(dict(constraints))
        try:
            write_deltalake(folder, rows, mode="append")
        except DeltaError as e:
            if REFUSED in str(e):
                return False
            raise
    return True
