"""The Spark part of a cycle: committed rows in, one target commit per table out.

Spark reads the cycle's ``.dat`` files and the buffered rows of the
transactions committed in the cycle (memory batches and closed spill files),
keeps the committed rows, and compiles each table's net changes, which the
target applies in one commit per table tagged with the cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from applier.engine.buffers import BufferedTxn
from applier.engine.compile import committed_rows, compile_table
from applier.engine.reading import CycleInput
from applier.engine.report import CycleReport
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
) -> dict[str, tuple[bool, int]]:
    """Compile and apply the cycle's committed transactions.

    Returns:
        For each table changed: whether it was truncated, and the change in its
        row count (net inserts minus net deletes after any truncate).
    """
    counts: dict[str, tuple[bool, int]] = {}
    if not cycle.commits:
        return counts
    with report.phase("spark"):
        rows = _committed_input(spark, cycle, taken)
        if rows is None:
            return counts
        commits = spark.createDataFrame(sorted(cycle.commits.items()), "xid string, commit_lsn long")
        committed = committed_rows(rows, commits).persist()
        names = sorted(r[0] for r in committed.select("table").distinct().collect())
    try:
        for name in names:
            with report.phase("spark"):
                changes = compile_table(committed.filter(committed["table"] == name), tables[name])
            with report.phase("target"):
                if target.committed_cycle(name) >= cycle_id:
                    report.skipped_tables.append(name)
                else:
                    target.apply(cycle_id, changes)
            report.net_rows[name] = {op: n for op, n in changes.stats.items() if n}
            if changes.truncate:
                report.log_order_segments.append(f"{name}: truncate")
            if not changes.table.primary_key:
                report.log_order_segments.append(f"{name}: rows without primary key")
            delta = changes.stats.get("I", 0) - changes.stats.get("D", 0)
            counts[name] = (changes.truncate, delta)
    finally:
        committed.unpersist()
    return counts
