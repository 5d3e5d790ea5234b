"""The Spark part of a cycle: committed rows in, one target commit per table out.

Spark's executors read the cycle's ``.dat`` files and the buffered rows of
the transactions committed in the cycle (memory batches and closed spill
files; :mod:`~applier.engine.sources`), keep the committed rows, and compile
every table's net changes in one job;
the target applies them in one commit per table tagged with the cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from applier.engine.buffers import BufferedTxn
from applier.engine.compile import compile_cycle
from applier.engine.compile_local import (
    LOCAL_ROWS,
    PairCache,
    committed_rows_locally,
    compile_locally,
    part_rows,
)
from applier.engine.compiled import CompiledCycle
from applier.engine.cycle_input import CycleInput
from applier.engine.measuring import note_measured
from applier.engine.netting import compile_partitions
from applier.engine.reading import check_in_driver, spill_inputs
from applier.engine.report import CycleReport
from applier.engine.retry import NO_RETRY, RetryPolicy
from applier.engine.sources import read_tasks
from applier.engine.touches import last_truncates
from applier.intermediate.pairs import DAT_COLUMNS
from applier.intermediate.schema import TableDef
from applier.targets import CycleLoad, Part, Target, collisions

log = logging.getLogger("applier")

CompiledFactory = Callable[[Mapping[str, TableDef], frozenset[str]], CompiledCycle]
"""Makes the holder of a cycle's compiled tables: ``(definitions, truncated tables) -> CompiledCycle``."""


def apply_committed(
    spark: Any,
    target: Target,
    cycle_id: int,
    cycle: CycleInput,
    taken: Mapping[str, BufferedTxn],
    tables: Mapping[str, TableDef],
    report: CycleReport,
    position: Mapping[str, int],
    holder: CompiledFactory,
    memory_file: Path | None = None,
    retry: RetryPolicy = NO_RETRY,
    held: dict[str, int] | None = None,
    part: Part | None = None,
    cache: PairCache | None = None,
    quiet: bool = False,
) -> dict[str, tuple[bool, int]]:
    """Compile and apply the cycle's committed transactions.

    One Spark job compiles every table's net changes into a compiled cycle held
    under the queue-memory budget; the target then applies them its way
    (:meth:`~applier.targets.Target.apply_cycle`), taking one table at a time.
    A failure stops the cycle before its checkpoint, and what the target
    committed of it is skipped when it is re-run.

    Args:
        position: ``applied_seq``, ``applied_commit_lsn`` and ``restart_seq``
            after the cycle, for targets that keep their checkpoint with the data.
        holder: makes the compiled cycle's holder (its queue and spill folder).
        memory_file: the committed transactions' rows that were still in memory
            (:meth:`~applier.engine.buffers.TransactionBuffers.take_committed`);
            the caller removes it once the cycle is applied.
        retry: how a transient target error is retried (the compiled cycle is
            kept until the last attempt).
        held: filled with the cycle each table holds afterwards, where the
            target told it (:attr:`~applier.targets.CycleLoad.held`).
        part: the cycle's transactions to apply, when not all of them: ``cycle``
            and ``taken`` hold only those (:func:`narrowed`), and the target
            records the part.
        cache: the pairs a small part compiled in the driver reads, kept decoded for the next part.
        quiet: collisions are reported but not logged as warnings.

    Returns:
        For each table changed: whether it was truncated, and the change in its
        row count (net inserts minus net deletes after any truncate).
    """
    if not cycle.commits:
        return {}
    local = part is not None and part_rows(cycle, taken) <= LOCAL_ROWS  # a small part of a refused cycle
    compiled = compile_committed(spark, cycle, taken, tables, holder, memory_file, report, local=local, cache=cache)
    if not compiled:
        return {}
    return apply_compiled(target, cycle_id, compiled[0], report, position, retry, held, part)


def compile_committed(
    spark: Any,
    cycle: CycleInput,
    taken: Mapping[str, BufferedTxn],
    tables: Mapping[str, TableDef],
    holder: CompiledFactory,
    memory_file: Path | None,
    report: CycleReport,
    *,
    local: bool = False,
    groups: Sequence[Collection[str]] = (),
    cache: PairCache | None = None,
) -> list[CompiledCycle]:
    """Compile the committed transactions of ``cycle`` and ``taken``: one holder, or one per group.

    Args:
        local: compile in this process (:mod:`~applier.engine.compile_local`), not in a Spark job.
        groups: the transactions of each compilable group, in commit order
            (runs of commit order, none truncating): one job compiles them all
            and each group's net changes go to a holder of its own. None: all
            transactions are one group.

    Returns:
        The holders, one per group; none when no file holds a row to read.
    """
    with report.phase("spark"):
        members = list(groups) or [cycle.commits]
        truncates = last_truncates(
            cycle.commits, [*cycle.truncates, *((t.xid, at) for t in taken.values() for at in t.truncates)]
        )
        if len(members) > 1 and truncates:
            raise ValueError("compilable groups hold no truncate: a truncating transaction is applied alone")
        touched = _touched(cycle, taken, members)
        bounds = [min(cycle.commits[x] for x in xids) for xids in members[1:]]
        if not local and not (any(c.num_rows for c in cycle.pair_commits.values()) or spill_inputs(taken, memory_file)):
            return []
        holders: list[CompiledCycle] = []
        try:
            for names in touched:
                holders.append(holder({n: tables[n] for n in sorted(names | set(truncates))}, frozenset(truncates)))
            every = set().union(*touched)
            if local:
                check_in_driver(cycle)
                rows = committed_rows_locally(cycle, taken, memory_file, cache)
                compile_locally(rows, tables, truncates, every, holders[0], list(zip(bounds, holders[1:], strict=True)))
            else:
                _compile_in_spark(spark, cycle, taken, tables, every, truncates, memory_file, holders, bounds)
        except BaseException:
            for made in holders:
                made.close()
            raise
    return holders


def apply_compiled(
    target: Target,
    cycle_id: int,
    compiled: CompiledCycle,
    report: CycleReport,
    position: Mapping[str, int],
    retry: RetryPolicy = NO_RETRY,
    held: dict[str, int] | None = None,
    part: Part | None = None,
    quiet: bool = False,
) -> dict[str, tuple[bool, int]]:
    """Apply a compiled cycle (or part) to the target, then close it; per table: (truncated, row-count change).

    ``quiet``: collisions are reported, not logged as warnings (``errors.actions.collision: ignore``).
    """
    try:
        with report.phase("tables"):
            what = f"cycle {cycle_id}" + ("" if part is None else f" (transactions {part.start}..{part.end - 1})")
            load = retry.run(lambda: target.apply_cycle(cycle_id, compiled, position, part), what)
    finally:
        report.compiled_file_bytes += compiled.file_bytes
        compiled.close()
        report.spill_created.extend(compiled.spill_created)
        report.spill_removed.extend(compiled.spill_removed)
    record_load(report, load, held, quiet)
    return {name: _record(report, name, compiled) for name in sorted(compiled)}


def record_load(report: CycleReport, load: CycleLoad, held: dict[str, int] | None, quiet: bool = False) -> None:
    """What the target said of an apply, in the cycle report; collisions are logged too, unless ``quiet``."""
    report.skipped_tables.extend(load.skipped_tables)
    report.table_seconds.update(load.table_seconds)
    report.load_batches.extend(load.batches)
    if held is not None:
        held.update(load.held)
    report.spill_created.extend(load.spill_created)
    report.spill_removed.extend(load.spill_removed)
    for table, counted in sorted(load.collisions.items()):
        collisions.add(report.collisions, table, counted)
        said = collisions.describe(counted)
        (log.info if quiet else log.warning)("cycle %d: table %s: %s; applied as upserts", report.cycle_id, table, said)


def _touched(cycle: CycleInput, taken: Mapping[str, BufferedTxn], groups: Sequence[Collection[str]]) -> list[set[str]]:
    """The tables each group's transactions change, in the cycle's pairs and in their buffered rows."""
    touched = cycle.tables_by_group(groups)
    if taken:
        for tables, xids in zip(touched, groups, strict=True):
            tables.update(*(taken[x].tables for x in xids if x in taken))
    return touched


def _compile_in_spark(
    spark: Any,
    cycle: CycleInput,
    taken: Mapping[str, BufferedTxn],
    tables: Mapping[str, TableDef],
    touched: set[str],
    truncates: Mapping[str, tuple[int, int]],
    memory_file: Path | None,
    holders: Sequence[CompiledCycle],
    bounds: Sequence[int],
) -> None:
    """The compile job over the cycle's input, into ``holders`` (one per group)."""
    checks = dict(cycle.unchecked) or None  # the first job of the cycle checks its pairs' images
    tasks = read_tasks(spark, cycle, taken, memory_file, checks=checks is not None)
    assert tasks is not None  # compile_committed found input
    if cycle.unmeasured:  # the first job of the cycle measures its pairs' images too
        tasks = replace(tasks, measure_into=str(holders[0].folder))
    input_bytes = cycle.bytes + sum(t.bytes for t in taken.values())
    partitions = compile_partitions(input_bytes, int(spark.conf.get("spark.sql.shuffle.partitions")))
    compile_cycle(
        tasks,
        tables,
        truncates,
        touched,
        holders[0],
        partitions=partitions,
        weights=_table_weights(cycle, taken),
        groups=list(zip(bounds, holders[1:], strict=True)),
        checks=checks,
    )
    if tasks.measure_into:
        note_measured(cycle, holders[0].folder)
    cycle.checked()


def narrowed(
    cycle: CycleInput, taken: Mapping[str, BufferedTxn], xids: Collection[str]
) -> tuple[CycleInput, dict[str, BufferedTxn]]:
    """``cycle`` and ``taken`` with only the committed transactions ``xids`` (a part of the cycle).

    ``xids``, each once, naming every committed transaction (the groups of a
    cycle compiled in one job) give the cycle itself: no copy of its commits.
    """
    if len(xids) == len(cycle.commits) and all(map(cycle.commits.__contains__, xids)):
        return cycle, dict(taken)
    keep = set(xids)
    part = replace(
        cycle,
        commits={x: lsn for x, lsn in cycle.commits.items() if x in keep},
        truncates=[t for t in cycle.truncates if t[0] in keep],
    )
    return part, {x: t for x, t in taken.items() if x in keep}


def transaction_rows(
    spark: Any,
    cycle: CycleInput,
    taken: Mapping[str, BufferedTxn],
    memory_file: Path | None,
    xid: str,
    cache: PairCache | None = None,
) -> pa.Table:
    """Every change of committed transaction ``xid`` as the pairs hold it, in lsn order (an exceptions record)."""
    check_in_driver(cycle)
    one, mine = narrowed(cycle, taken, [xid])
    if part_rows(one, mine) <= LOCAL_ROWS:
        return committed_rows_locally(one, mine, memory_file, cache).drop_columns(["commit_lsn"]).sort_by("lsn")
    tasks = read_tasks(spark, one, mine, memory_file)
    assert tasks is not None  # it has rows: it was refused
    rows = tasks.rows()
    return rows.filter(rows.xid == xid).orderBy("lsn").select(*DAT_COLUMNS).toArrow()


def _table_weights(cycle: CycleInput, taken: Mapping[str, BufferedTxn]) -> dict[str, float]:
    """Rows per table of the cycle's input: its pairs' rows, and taken transactions' rows shared among their tables."""
    weights: dict[str, float] = dict(cycle.table_rows)
    for txn in taken.values():
        for table in txn.tables:
            weights[table] = weights.get(table, 0) + txn.rows / len(txn.tables)
    return weights


def _record(report: CycleReport, name: str, compiled: CompiledCycle) -> tuple[bool, int]:
    """Put one table's figures in the report; return (truncated, row-count change)."""
    stats = compiled.stats(name)
    report.add_net_rows(name, stats)
    truncated = name in compiled.truncated
    segments = [f"{name}: truncate"] if truncated else []
    if not compiled.tables[name].primary_key:
        segments.append(f"{name}: rows without primary key")
    report.log_order_segments.extend(s for s in segments if s not in report.log_order_segments)
    return truncated, stats.get("I", 0) - stats.get("D", 0)
