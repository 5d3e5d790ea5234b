"""The Spark part of a cycle: committed rows in, one target commit per table out.

Spark reads the cycle's ``.dat`` files and the buffered rows of the
transactions committed in the cycle (memory batches and closed spill files),
keeps the committed rows, and compiles every table's net changes in one job;
the target applies them in one commit per table tagged with the cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from applier.engine.buffers import BufferedTxn
from applier.engine.changes import TableChanges
from applier.engine.compile import committed_rows, compile_cycle
from applier.engine.reading import CycleInput
from applier.engine.report import CycleReport
from applier.engine.touches import last_truncates
from applier.intermediate.schema import TableDef
from applier.targets import Target

DAT_DDL = "lsn long, xid string, `table` string, op string, before string, after string"


def _committed_input(spark: Any, cycle: CycleInput, taken: Mapping[str, BufferedTxn]) -> Any | None:
    """All rows that may belong to a committed transaction, as one DataFrame (None if none)."""
    committed = set(cycle.commits)
    dat_paths = [str(p.dat_path) for p in cycle.pairs if cycle.xids_by_seq.get(p.seq, set()) & committed]
    spill_paths = [str(t.spill_path) for t in taken.values() if t.spill_path is not None]
    memory = [t.memory for t in taken.values() if t.memory is not None and t.memory.num_rows]
    frames = []
    if dat_paths or spill_paths:
        frames.append(spark.read.schema(DAT_DDL).parquet(*dat_paths, *spill_paths))
    if memory:
        table = pa.concat_tables([m.cast(memory[0].schema) for m in memory])
        frames.append(spark.createDataFrame(table).selectExpr("lsn", "xid", "`table`", "op", "before", "after"))
    if not frames:
        return None
    rows = frames[0]
    for frame in frames[1:]:
        rows = rows.unionByName(frame)
    return rows


def apply_committed(
    spark: Any,
    target: Target,
    cycle_id: int,
    cycle: CycleInput,
    taken: Mapping[str, BufferedTxn],
    tables: Mapping[str, TableDef],
    report: CycleReport,
    position: Mapping[str, int],
) -> dict[str, tuple[bool, int]]:
    """Compile and apply the cycle's committed transactions.

    One Spark job compiles every table's net changes; the target then applies
    them its way (:meth:`~applier.targets.Target.apply_cycle`). A failure stops
    the cycle before its checkpoint, and what the target committed of it is
    skipped when it is re-run.

    Args:
        position: ``applied_seq``, ``applied_commit_lsn`` and ``restart_seq``
            after the cycle, for targets that keep their checkpoint with the data.

    Returns:
        For each table changed: whether it was truncated, and the change in its
        row count (net inserts minus net deletes after any truncate).
    """
    if not cycle.commits:
        return {}
    with report.phase("spark"):
        rows = _committed_input(spark, cycle, taken)
        if rows is None:
            return {}
        commits = spark.createDataFrame(sorted(cycle.commits.items()), "xid string, commit_lsn long")
        touched = set().union(*(cycle.tables_of.get(xid, set()) for xid in cycle.commits))
        touched.update(*(t.tables for t in taken.values()))
        truncates = last_truncates(
            cycle.commits, [*cycle.truncates, *((t.xid, at) for t in taken.values() for at in t.truncates)]
        )
        compiled = compile_cycle(committed_rows(rows, commits), tables, truncates, touched)

    with report.phase("tables"):
        load = target.apply_cycle(cycle_id, compiled, position)
    report.skipped_tables.extend(load.skipped_tables)
    report.table_seconds.update(load.table_seconds)
    report.load_batches = load.batches
    report.spill_created.extend(load.spill_created)
    report.spill_removed.extend(load.spill_removed)
    return {name: _record(report, name, changes) for name, changes in sorted(compiled.items())}


def _record(report: CycleReport, name: str, changes: TableChanges) -> tuple[bool, int]:
    """Put one table's figures in the report; return (truncated, row-count change)."""
    report.net_rows[name] = {op: n for op, n in changes.stats.items() if n}
    if changes.truncate:
        report.log_order_segments.append(f"{name}: truncate")
    if not changes.table.primary_key:
        report.log_order_segments.append(f"{name}: rows without primary key")
    return changes.truncate, changes.stats.get("I", 0) - changes.stats.get("D", 0)
