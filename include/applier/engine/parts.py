"""The apply step of one cycle: its committed transactions compiled and applied whole, or part by part.

:mod:`applier.engine.units` decides the parts and the error actions; this
module gives it the cycle's hands: compiling and applying a part with Spark
(:func:`~applier.engine.sparkapply.apply_committed`), passing a refused
transaction on the target (with its changes, read back from the pairs, when
its action logs it), and recording progress in the intent.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.advise.arithmetic import DEFAULT_LAYOUT, expanded_row_size, row_entry_bytes
from applier.config import Config
from applier.engine.buffers import BufferedTxn
from applier.engine.checkpoint import Intent
from applier.engine.compile_local import PairCache
from applier.engine.cycle_input import CycleInput, commit_positions
from applier.engine.groups import GroupLimits, Shapes, estimate_cdb_bytes
from applier.engine.measuring import measure_rest
from applier.engine.report import CycleReport
from applier.engine.retry import RetryPolicy
from applier.engine.sparkapply import (
    CompiledFactory,
    apply_committed,
    apply_compiled,
    compile_committed,
    narrowed,
    record_load,
    transaction_rows,
)
from applier.engine.units import Changed, CycleParts, commit_order_lsns
from applier.errors import TargetError
from applier.intermediate.pairs import pair_name
from applier.intermediate.schema import TableDef
from applier.lookup import looked_up
from applier.targets import LOGGED_ACTIONS, Part, PassedTransaction, Target


@dataclass
class PartContext:
    """Everything applying a cycle's parts needs (see :func:`~applier.engine.sparkapply.apply_committed`)."""

    spark: Any
    target: Target
    config: Config
    record_intent: Callable[[Intent], Intent]
    cycle_id: int
    cycle: CycleInput
    taken: Mapping[str, BufferedTxn]
    tables: Mapping[str, TableDef]
    report: CycleReport
    position: Mapping[str, int]
    holder: CompiledFactory
    memory_file: Path | None
    held: dict[str, int]
    pairs: PairCache = field(default_factory=PairCache)


def cycle_parts(context: PartContext) -> CycleParts:
    """The cycle's transactions in commit order, ready to apply group by group from where its intent left off.

    A target whose cycle commit is not atomic across tables (Delta) splits a
    refused group only when it refused before committing any table
    (``TargetError.nothing_applied``): otherwise a table that committed the
    group would keep the failing transaction's changes.
    """
    c = context
    c.pairs.max_bytes = c.config.queue_memory_bytes // 2  # decoded pairs kept for the parts, beside the queue
    order, lsns = commit_order_lsns(c.cycle.commits)
    apply = c.config.apply
    if c.cycle.unmeasured and not compiles_whole(c.config, c.target):
        measure_rest(c.cycle)  # the groups shape this target's compile: their estimates come first
    later = _MeasuredSizes(c, order, lsns) if c.cycle.unmeasured and order else None
    limits = GroupLimits(apply.compile, apply.compile_max_cmds, int(apply.cdb_max_size_mb * 1024 * 1024))
    return CycleParts(
        cycle_id=c.cycle_id,
        order=order,
        shapes=txn_shapes(c.cycle, c.taken, c.tables, order, lsns) if later is None else _unsized(order, lsns),
        apply_part=lambda part, xids: _apply_part(c, part, xids),
        compile_groups=lambda groups: _compile_groups(c, groups),
        apply_compiled=lambda part, holder: apply_compiled(
            c.target, c.cycle_id, holder, c.report, c.position, RetryPolicy.of(apply), c.held, part, _quiet(c)
        ),
        apply_log_order=(lambda part, xid: _apply_log_order(c, part, xid)) if c.target.log_order else None,
        discard=lambda holder: holder.close(),
        limits=limits,
        pass_transaction=lambda part, xid, error, action: _pass(c, part, xid, error, action),
        progress=lambda through, end, changed, passing: _progress(c, len(order), through, end, changed, passing),
        describe=lambda xid: describe(c.cycle, xid),
        errors=c.config.errors,
        split=apply.retry_split,
        threshold=apply.compile_retry_threshold,
        splits=c.target.atomic_cycles,
        together=apply.compile and not c.target.atomic_cycles,
        sizes=later,
    )


def _unsized(order: Sequence[str], commit_lsns: np.ndarray) -> Shapes:
    """The cycle's transactions in commit order with their commit lsns alone, until :class:`_MeasuredSizes` is asked."""
    none = np.zeros(len(order), np.int64)
    return Shapes(order, commit_lsns, none, none, none.astype(np.bool_))


def _commit_lsns(cycle: CycleInput, order: Sequence[str]) -> np.ndarray:
    return np.fromiter(map(cycle.commits.__getitem__, order), np.int64, len(order))


def compiles_whole(config: Config, target: Target) -> bool:
    """Whether what is left of a cycle is compiled as one part whatever its groups.

    So it is on a target whose tables commit one by one and that has no log
    order of its own (Delta): its cycle's compile job can then measure the
    images the groups' estimates need (:mod:`~applier.engine.measuring`).
    """
    return config.apply.compile and not target.atomic_cycles and not target.log_order


@dataclass
class _MeasuredSizes:
    """A cycle's shapes once its compile job measured its images (:class:`~applier.engine.units.ImageSizes`)."""

    context: PartContext
    order: Sequence[str]
    commit_lsns: np.ndarray

    def pending(self) -> bool:
        return bool(self.context.cycle.unmeasured)

    def shapes(self) -> Shapes:
        c = self.context
        measure_rest(c.cycle)
        return txn_shapes(c.cycle, c.taken, c.tables, self.order, self.commit_lsns)


def txn_shapes(
    cycle: CycleInput,
    taken: Mapping[str, BufferedTxn],
    tables: Mapping[str, TableDef],
    order: Sequence[str],
    commit_lsns: np.ndarray | None = None,
) -> Shapes:
    """What grouping needs of each committed transaction, in commit order (columns, not an object each).

    Its commands are its rows (``T`` rows included); its net-change size is
    estimated by the queue arithmetic, each table's row at its fixed widths
    plus the table's longest image in the cycle (a bound on the variable part).
    Rows buffered in earlier cycles are shared evenly among their tables.

    The counts are summed per transaction where they are, in Arrow and numpy
    (each pair's counts looked up in the commit order, then added by
    position): a cycle of 392,000 transactions held 90 MiB of maps of tables
    per transaction when they were summed in Python, and an Arrow group-by of
    its 600,000 counts took 100 MiB more for a moment. Each pair's xids find
    their positions through the cycle's commits (:func:`commit_positions`):
    an Arrow lookup of all of them in the commit order took 30 MiB for a moment.
    """
    counts = cycle.all_counts()
    names = set(pc.unique(counts["table"]).to_pylist()) | {t for txn in taken.values() for t in txn.tables}
    sizes = {name: _row_size(name, cycle, tables) for name in sorted(names)}
    entry = {name: row_entry_bytes(DEFAULT_LAYOUT, size) for name, size in sizes.items()}
    header = DEFAULT_LAYOUT.transaction_header
    if commit_lsns is None:
        commit_lsns = _commit_lsns(cycle, order)
    rows_at, bytes_at = np.zeros(len(order), np.int64), np.zeros(len(order), np.int64)
    for pair, wanted in _with_commit_lsns(cycle):
        at = commit_positions(commit_lsns, wanted)
        mine = pc.is_valid(at)
        where, n = at.filter(mine).to_numpy(), pair["rows"].filter(mine).to_numpy()
        np.add.at(rows_at, where, n)
        np.add.at(bytes_at, where, n * looked_up(pair["table"].filter(mine), entry).to_numpy())
    commands, cdb_bytes = rows_at, bytes_at + header
    position = {xid: i for i, xid in enumerate(order) if xid in taken}
    in_cycle = _table_rows(cycle, position)
    for xid, i in position.items():  # a buffered transaction's rows, rounded per table
        txn, shares = taken[xid], in_cycle.get(xid, {})
        for table in txn.tables:
            shares[table] = shares.get(table, 0) + txn.rows / len(txn.tables)
        commands[i] += txn.rows
        cdb_bytes[i] = estimate_cdb_bytes({table: round(n) for table, n in shares.items()}, sizes)
    truncating = {xid for xid, _ in cycle.truncates} | {x for x, t in taken.items() if t.truncates}
    truncates = (
        np.fromiter(map(truncating.__contains__, order), np.bool_, len(order))
        if truncating
        else np.zeros(len(order), np.bool_)
    )
    return Shapes(order, commit_lsns, commands, cdb_bytes, truncates)


def _with_commit_lsns(cycle: CycleInput) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Each batch of the cycle's counts, with its rows' commit lsns (:attr:`CycleInput.counts_commit_lsns`)."""
    for counts, lsns in zip(cycle.counts, cycle.counts_commit_lsns, strict=True):
        start = 0
        for batch in counts.to_batches():
            yield batch, lsns[start : start + batch.num_rows]
            start += batch.num_rows


def _table_rows(cycle: CycleInput, xids: Collection[str]) -> dict[str, dict[str, float]]:
    """The rows of each transaction of ``xids`` per table in the cycle's pairs."""
    found: dict[str, dict[str, float]] = {}
    if not xids:
        return found
    mine = cycle.counts_of(xids)
    for xid, table, n in zip(*(mine[c].to_pylist() for c in ("xid", "table", "rows")), strict=True):
        tables = found.setdefault(xid, {})
        tables[table] = tables.get(table, 0) + n
    return found


def _row_size(name: str, cycle: CycleInput, tables: Mapping[str, TableDef]) -> int:
    """A table's row at its fixed widths plus its longest image in the cycle (the variable part's bound)."""
    columns = ((col.name, col.type) for col in tables[name].columns) if name in tables else ()
    return expanded_row_size(columns, {}) + cycle.longest_image.get(name, 0)


def describe(cycle: CycleInput, xid: str) -> str:
    """A committed transaction named for an operator: xid, commit lsn and the pair of its commit."""
    seq = cycle.commit_seq(xid)
    pair = f", pair {pair_name(seq)}" if seq is not None else ""
    return f"transaction {xid} (commit lsn {cycle.commits[xid]}{pair})"


def _apply_part(c: PartContext, part: Part, xids: Sequence[str]) -> Changed:
    whole = part.start == 0 and part.final
    cycle, taken = (c.cycle, c.taken) if whole else narrowed(c.cycle, c.taken, xids)
    return apply_committed(
        *(c.spark, c.target, c.cycle_id, cycle, taken, c.tables, c.report, c.position),
        *(c.holder, c.memory_file, RetryPolicy.of(c.config.apply), c.held),
        part=None if whole else part,
        cache=c.pairs,
        quiet=_quiet(c),
    )


def _quiet(c: PartContext) -> bool:
    """Whether collisions go unlogged (``errors.actions.collision: ignore``); they are reported all the same."""
    return c.config.errors.action("collision") == "ignore"


def _apply_log_order(c: PartContext, part: Part, xid: str) -> Changed:
    """Apply one transaction change by change on a target that can (:attr:`~applier.targets.Target.log_order`)."""
    rows = transaction_rows(c.spark, c.cycle, c.taken, c.memory_file, xid, c.pairs)
    what = f"cycle {c.cycle_id} ({describe(c.cycle, xid)}, in log order)"
    with c.report.phase("tables"):
        load = RetryPolicy.of(c.config.apply).run(
            lambda: c.target.apply_log_order(c.cycle_id, part, c.position, rows, c.tables), what
        )
    record_load(c.report, load, c.held, _quiet(c))
    for table, ops in load.statements.items():
        c.report.add_net_rows(table, ops)
    return log_changes(rows)


def log_changes(rows: pa.Table) -> Changed:
    """Per table, whether ``rows`` (one transaction's, in lsn order) truncate it, and the row-count change they log.

    What the log says, as a compiled part counts it, whether or not the target
    held what it said (a collision) and whether or not the target applied the
    part now or in an earlier run.
    """
    changed: Changed = {}
    ordered = rows.sort_by("lsn")
    for table, op in zip(ordered.column("table").to_pylist(), ordered.column("op").to_pylist(), strict=True):
        truncated, delta = changed.get(table, (False, 0))
        changed[table] = (True, 0) if op == "T" else (truncated, delta + {"I": 1, "D": -1}.get(op, 0))
    return changed


def _pass(c: PartContext, part: Part, xid: str, error: TargetError, action: str) -> None:
    logged = action in LOGGED_ACTIONS
    passed = PassedTransaction(
        cycle_id=c.cycle_id,
        xid=xid,
        commit_lsn=c.cycle.commits[xid],
        pair_seq=c.cycle.commit_seq(xid) or 0,
        error_class=error.error_class,
        code=error.code,
        table=error.table,
        message=str(error),
        action=action,
        changes=transaction_rows(c.spark, c.cycle, c.taken, c.memory_file, xid, c.pairs) if logged else None,
    )
    c.target.pass_transaction(c.cycle_id, part, c.position, passed)


def _compile_groups(c: PartContext, groups: Sequence[Sequence[str]]) -> list[Any]:
    """Several compilable groups of the cycle in one Spark job, a holder for each."""
    cycle, taken = narrowed(c.cycle, c.taken, list(chain.from_iterable(groups)))
    return list(compile_committed(c.spark, cycle, taken, c.tables, c.holder, c.memory_file, c.report, groups=groups))


def _progress(c: PartContext, total: int, through: int, part_end: int, changed: Changed, passing: bool) -> None:
    """Record how far the cycle went, and the row counts it changed; nothing while it is applied whole."""
    if (through, part_end) in ((0, total), (total, 0)):
        return  # the checkpoint follows
    c.record_intent(Intent(c.cycle_id, c.report.seqs, through, part_end, dict(changed), passing))
