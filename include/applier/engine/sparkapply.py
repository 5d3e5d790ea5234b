"""The Spark part of a cycle: committed rows in, one target commit per table out.

Spark reads the cycle's ``.dat`` files and the buffered rows of the
transactions committed in the cycle (memory batches and closed spill files),
keeps the committed rows, and compiles every table's net changes in one job;
the target applies them in one commit per table tagged with the cycle.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
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

# Tables committed at once: delta-rs commits of different tables are
# independent and release the GIL; few enough not to crowd a small driver.
_TABLE_THREADS = 4
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

    One Spark job compiles every table's net changes; then the tables are
    committed side by side on a few threads (delta-rs commits are independent
    per table). A failure of one stops the cycle before its checkpoint, and
    tables already committed skip the cycle when it is re-run.

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

    def one_table(name: str) -> tuple[str, TableChanges, bool, dict[str, float]]:
        started = time.perf_counter()
        changes = compiled[name]
        skipped = target.committed_cycle(name) >= cycle_id
        if not skipped:
            target.apply(cycle_id, changes)
        return name, changes, skipped, {"apply": round(time.perf_counter() - started, 3)}

    with report.phase("tables"), ThreadPoolExecutor(max_workers=_TABLE_THREADS) as pool:
        results = list(pool.map(one_table, sorted(compiled)))
    return {name: _record(report, name, changes, skipped, seconds) for name, changes, skipped, seconds in results}


def _record(
    report: CycleReport, name: str, changes: TableChanges, skipped: bool, seconds: dict[str, float]
) -> tuple[bool, int]:
    """Put one table's figures in the report; return (truncated, row-count change)."""
    if skipped:
        report.skipped_tables.append(name)
    report.table_seconds[name] = seconds
    report.net_rows[name] = {op: n for op, n in changes.stats.items() if n}
    if changes.truncate:
        report.log_order_segments.append(f"{name}: truncate")
    if not changes.table.primary_key:
        report.log_order_segments.append(f"{name}: rows without primary key")
    return changes.truncate, changes.stats.get("I", 0) - changes.stats.get("D", 0)
