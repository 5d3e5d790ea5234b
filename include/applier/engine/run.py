"""One Applier run: rebuild open transactions, then apply cycles until caught up.

The order of the steps is what makes a cycle exactly-once:

1. read and check the cycle's pairs (nothing is written yet);
2. record the intent (which pairs this cycle is) before the target is touched;
3. apply each table's net changes, one target commit per table tagged with the
   cycle, skipping tables that already carry it (a restart after a crash);
4. write the checkpoint, which clears the intent;
5. remove the spill files of the committed transactions and report.

A crash before 2 leaves nothing; between 2 and 4 the restart re-runs the same
pairs and the tables that have the cycle skip it; after 4 the next cycle begins.

A run with a run key records each cycle in the run ledger just before its
checkpoint (:mod:`applier.engine.ledger`); a run starts by refusing a target
whose tables hold less than the checkpoint recorded for them (restored from a
backup): a backfill replay (:mod:`applier.engine.replay`) is the way back.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from applier.config import Config
from applier.engine.buffers import TransactionBuffers
from applier.engine.checking import PairChecker
from applier.engine.checkpoint import Checkpoint, CheckpointStore, Intent
from applier.engine.compiled import CompiledCycle
from applier.engine.cycle_input import CycleInput
from applier.engine.dat_facts import dat_reader, reads_on_executors
from applier.engine.driver_memory import return_freed_memory
from applier.engine.ledger import Clock, LedgerCycle, RunJournal, RunLedger, utc_now
from applier.engine.ledger_cycles import RECENT_CYCLES, CycleTally
from applier.engine.open_rows import buffer_open_rows, plan
from applier.engine.parts import PartContext, compiles_whole, cycle_parts
from applier.engine.queue import MemoryQueue
from applier.engine.reading import check_in_driver, read_cycle, reread_window, window_pairs
from applier.engine.report import CycleReport, append_report, peak_rss_mib
from applier.engine.resume_checks import authoritative_checkpoint, pairs_of_intent, restored_target_error
from applier.engine.session import prefetch, session_of
from applier.engine.spill import COMMITTED_PART, OPEN_PART, SPILL_SUFFIX
from applier.errors import LateImageRefusal
from applier.intermediate.pairs import list_pairs
from applier.intermediate.stream import StreamValidator
from applier.planner import plan_cycle
from applier.preflight import refused_pairs
from applier.targets import Target

log = logging.getLogger("applier")


@dataclass
class RunSummary:
    """What a run did: counts and totals, its last cycle reports and where it stopped.

    Its size does not grow with the run: it keeps the last ``RECENT_CYCLES``
    (100) reports and cycles, and counts all of them.

    Attributes:
        reports: the last reports of the cycles this attempt ran through Spark
            (a replay: those it re-ran), oldest first.
        checkpoint: the checkpoint after the run (a replay leaves it as it was).
        leftover_spills_removed: spill files of an earlier run deleted at the start.
        run_key: the run's key, if it was given one.
        replay: whether the run replayed a finished record instead of applying new pairs.
        cycles: the last of the run's cycles as the ledger records them: ids,
            pairs, positions, net rows and per table ``applied``/``skipped`` (a
            replay: ``reapplied``/``verified``); with a run key, the cycles of
            the key (also those of an earlier, crashed attempt).
        pruned_pairs: pairs intermediate retention deleted after the run.
        cycles_run: how many cycles this attempt ran (``reports`` keeps the last).
        cycles_recorded: how many cycles ``cycles`` stands for (``cycles`` keeps the last).
        table_outcomes: outcome -> how many times a table had it, over all those cycles.
        committed: transactions committed by the cycles run.
        rolled_back: transactions rolled back in them.
        rows_read: rows read from their pairs.
        bytes: bytes of their pairs.
    """

    reports: list[CycleReport] = field(default_factory=list)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    leftover_spills_removed: list[str] = field(default_factory=list)
    run_key: str | None = None
    replay: bool = False
    cycles: list[LedgerCycle] = field(default_factory=list)
    pruned_pairs: list[int] = field(default_factory=list)
    cycles_run: int = 0
    cycles_recorded: int = 0
    table_outcomes: dict[str, int] = field(default_factory=dict)
    committed: int = 0
    rolled_back: int = 0
    rows_read: int = 0
    bytes: int = 0

    def add_report(self, report: CycleReport) -> None:
        """Count a cycle run and keep its report among the last ones."""
        self.reports.append(report)
        del self.reports[:-RECENT_CYCLES]
        self.cycles_run += 1
        self.committed += report.committed
        self.rolled_back += report.rolled_back
        self.rows_read += report.rows_read
        self.bytes += report.bytes

    def add_cycles(self, tally: CycleTally) -> None:
        """Take the recorded cycles' figures from ``tally``."""
        self.cycles = list(tally.recent)
        self.cycles_recorded = tally.count
        self.table_outcomes = dict(sorted(tally.outcomes.items()))


class Applier:
    """Runs apply cycles for one configuration against one target.

    Args:
        config: the validated configuration.
        spark: the Spark session the cycles run in.
        target: where changes are applied.
        journal: the run's ledger record, when the run has a key.
        clock: the time of ledger entries.
    """

    def __init__(
        self, config: Config, spark: Any, target: Target, *, journal: RunJournal | None = None, clock: Clock = utc_now
    ) -> None:
        self.config = config
        self.spark = spark
        self.target = target
        self.journal = journal
        self.clock = clock
        self.cycles = CycleTally()  # a run without a key: its last cycles, and their count
        self.store = CheckpointStore(config.work_dir)
        self.queue = MemoryQueue(config.queue_memory_bytes)
        self.dat_reader = dat_reader(lambda: session_of(self.spark))
        # The driver's footprint before it holds anything (Python, Spark's gateway, the libraries).
        self.start_rss_mib = peak_rss_mib()
        self.holder = functools.partial(
            CompiledCycle,
            queue=self.queue,
            spill_dir=config.spill_dir,
            configuration_name=config.configuration_name,
        )
        self.buffers = self._new_buffers()
        self.report_path = config.work_dir / "cycles.jsonl"
        self._memory_file = config.spill_dir / f"{config.configuration_name}_{COMMITTED_PART}{SPILL_SUFFIX}"
        self._open_folder = config.spill_dir / f"{config.configuration_name}_{OPEN_PART}"
        self.checker = PairChecker()
        # Pairs up to this one are read with the driver checking their images (after a late refusal).
        self._check_in_driver_through = 0

    def _new_buffers(self) -> TransactionBuffers:
        c = self.config
        return TransactionBuffers(c.spill_dir, c.configuration_name, c.apply.buffer_size_for_split_records, self.queue)

    def run(self, max_cycles: int = 0, on_cycle: Callable[[CycleReport], None] | None = None) -> RunSummary:
        """Apply cycles until caught up, or ``max_cycles`` cycles (0: no limit).

        Raises:
            IntermediateFileError: a refused pair, after everything before it
                was applied and checkpointed.
            TargetError: the target failed (the cycle was not checkpointed), or
                it holds less than the checkpoint says (restored: replay first).
        """
        summary = RunSummary(leftover_spills_removed=self.buffers.clear_leftovers())
        try:
            local = self.store.load()
            # What every table holds, read once (each Delta table keeps its own log).
            held = self.target.committed_cycles(sorted(local.table_cycles))
            checkpoint = authoritative_checkpoint(self.store, self.target, local, held)
            self._refuse_restored_target(checkpoint, held)
            self.target.check_tables(checkpoint.tables)
            if self.journal is not None:
                self.journal.forget_after(checkpoint.cycle_id)
            # Nothing to do: no pair after the applied one and no cycle under way, so no rebuild and no Spark.
            caught_up = not self._work_ahead(checkpoint)
            if not caught_up:
                prefetch(self.spark)  # the JVM starts while the pairs are read
            validator = None if caught_up else self._rebuild(checkpoint)
            while validator is not None and (not max_cycles or summary.cycles_run < max_cycles):
                cycle = self._next_cycle(checkpoint, validator)
                if cycle is None:
                    break
                try:
                    checkpoint, report = self._apply_cycle(checkpoint, validator, cycle)
                except LateImageRefusal as e:
                    validator = self._reread_checking(checkpoint, e)
                    continue
                summary.add_report(report)
                if on_cycle:
                    on_cycle(report)
                if cycle.refused is not None:
                    raise cycle.refused
        finally:
            # Open transactions are rebuilt by re-reading at the next start; their
            # spill files would be deleted then anyway, so none outlives the run.
            self.buffers.close()
            self.checker.close()
        summary.checkpoint = checkpoint
        # With a key, the record's cycles (earlier attempts' too), read once from its file.
        summary.add_cycles(CycleTally.of(self.journal.record.cycles) if self.journal is not None else self.cycles)
        summary.run_key = self.journal.record.run_key if self.journal is not None else None
        return summary

    def _refuse_restored_target(self, checkpoint: Checkpoint, held: Mapping[str, int]) -> None:
        """Refuse to apply on top of tables holding less than the checkpoint recorded: they were restored."""
        behind = {
            table: (held[table], recorded)
            for table, recorded in sorted(checkpoint.table_cycles.items())
            if held[table] < recorded
        }
        if behind:
            raise restored_target_error(behind, RunLedger(self.config.work_dir))

    def _work_ahead(self, checkpoint: Checkpoint) -> bool:
        """Whether a pair, or a gap, follows the applied pair, or a cycle after the checkpoint is under way.

        Raises:
            IntermediateFileError: the next pair's header or ``.dat`` size is refused: nothing can be applied.
            GapError: nothing is ahead, but a pair the next restart re-reads is missing.
        """
        listing = list_pairs(self.config.intermediate_dir, checkpoint.applied_seq + 1)
        refused = next(refused_pairs(listing.pairs[:1]), None)
        if refused is not None:
            raise refused
        intent = self.store.load_intent()
        under_way = intent is not None and intent.cycle_id == checkpoint.cycle_id + 1
        ahead = bool(listing.pairs) or listing.gap_seq is not None or under_way
        if not ahead:
            window_pairs(self.config.intermediate_dir, checkpoint)  # what the next restart needs is still there
        return ahead

    def _rebuild(self, checkpoint: Checkpoint) -> StreamValidator:
        """Re-read ``restart_seq .. applied_seq`` to put open transactions back in the buffers."""
        validator, reread = reread_window(self.config.intermediate_dir, checkpoint, self.target.table_misfit)
        if reread.pairs:
            buffer_open_rows(reread, plan(reread, validator.state.open_xids), self.buffers)
            return_freed_memory()
            log.info(
                "rebuilt %d open transactions from pairs %d..%d",
                len(validator.state.open_xids),
                checkpoint.restart_seq,
                checkpoint.applied_seq,
            )
        return validator

    def _reread_checking(self, checkpoint: Checkpoint, refusal: LateImageRefusal) -> StreamValidator:
        """Start again from ``checkpoint`` after a late refusal, the driver checking images up to the refused pair.

        Nothing of the cycle reached the target (its images are checked before
        anything is applied), so this is a restart by re-reading: new buffers,
        open transactions rebuilt, the cycle read again and cut at the refused
        pair (see :mod:`applier.engine.reading`).
        """
        log.info("pair %d refused by Spark's image check (%s): re-reading, the driver checking", refusal.seq, refusal)
        self.store.drop_intent(checkpoint.cycle_id + 1)
        self.buffers.close()
        self.buffers = self._new_buffers()
        self._check_in_driver_through = refusal.seq
        return self._rebuild(checkpoint)

    def _next_cycle(self, checkpoint: Checkpoint, validator: StreamValidator) -> CycleInput | None:
        """Read the next cycle's pairs: the recorded intent's, or newly planned ones."""
        listing = list_pairs(self.config.intermediate_dir, checkpoint.applied_seq + 1)
        intent = self.store.load_intent()
        if intent is not None and intent.cycle_id == checkpoint.cycle_id + 1:
            refs = pairs_of_intent(listing.pairs, intent, self.config)
        else:
            refs = list(plan_cycle(listing.pairs, checkpoint.applied_seq, self.config.apply.cycle_limit_bytes).pairs)
        if not refs:
            gap = listing.gap_error()
            if gap is not None:
                raise gap
            return None
        started = time.perf_counter()
        driver_checks = refs[0].seq <= self._check_in_driver_through
        measure = not compiles_whole(self.config, self.target)  # else the compile job measures the images
        executors = self.dat_reader if reads_on_executors(self.config.apply.executor_reads, self.spark) else None
        cycle = read_cycle(
            refs, validator, checker=self.checker, defer_images=not driver_checks, measure=measure,
            dat_reader=executors,
        )  # fmt: skip
        cycle.read_seconds = time.perf_counter() - started
        if not cycle.pairs:
            assert cycle.refused is not None
            raise cycle.refused
        return cycle

    def _apply_cycle(
        self, checkpoint: Checkpoint, validator: StreamValidator, cycle: CycleInput
    ) -> tuple[Checkpoint, CycleReport]:
        cycle_id = checkpoint.cycle_id + 1
        report = CycleReport(cycle_id=cycle_id, seqs=[p.seq for p in cycle.pairs], bytes=cycle.bytes)
        report.driver_start_rss_mib = self.start_rss_mib
        report.seconds["read"] = round(cycle.read_seconds, 3)
        report.dat_read_by_executors = cycle.dat_read_by_executors
        report.started_at = (self.clock() - dt.timedelta(seconds=cycle.read_seconds)).isoformat()
        report.rows_read, report.committed, report.rolled_back = (
            cycle.rows_read,
            len(cycle.commits),
            len(cycle.rollbacks),
        )
        self.target.autocorrect(frozenset(cycle.autocorrect))
        with report.phase("buffer"):
            still_open = set(validator.state.open_xids)  # their rows are buffered once the cycle is applied
            cycle.open_after = opened = plan(cycle, still_open, self._open_folder)
            for xid in cycle.rollbacks:
                self.buffers.discard(xid)
            taken, memory_file = self.buffers.take_committed(cycle.commits, self._memory_file)
            return_freed_memory()  # the pairs read, and the rows just written out for Spark
        intent = self._record_intent(Intent(cycle_id, report.seqs))
        applied_seq = report.seqs[-1]
        applied_commit_lsn = max(cycle.commits.values(), default=checkpoint.applied_commit_lsn)
        restart_seq = validator.restart_seq(applied_seq)
        position = dict(applied_seq=applied_seq, applied_commit_lsn=applied_commit_lsn or 0, restart_seq=restart_seq)
        known: dict[str, int] = {}
        try:
            spark = session_of(self.spark)  # a lazy session starts here, at the first apply
            self.target.use_spark(spark)
            context = PartContext(
                *(
                    spark,
                    self.target,
                    self.config,
                    self._save_intent,
                    cycle_id,
                    cycle,
                    taken,
                    validator.state.tables,
                ),
                *(report, position, self.holder, memory_file, known),
            )
            parts = cycle_parts(context)
            changed = parts.apply_from(*self._resume_at(intent), intent.changed)
            check_in_driver(cycle)  # a cycle Spark did not compile (nothing committed in it)
            with report.phase("buffer"):
                buffer_open_rows(cycle, opened, self.buffers)
        finally:
            if memory_file is not None:
                memory_file.unlink(missing_ok=True)
        report.groups, report.exceptions = parts.groups, parts.passed
        counts = dict(checkpoint.row_counts)
        for table, (truncated, delta) in changed.items():
            counts[table] = (0 if truncated else counts.get(table, 0)) + delta
        with report.phase("checkpoint"):
            # What each table holds now, as the target told or reads it (an empty change commits nothing).
            held = {**self.target.committed_cycles(sorted(set(changed) - set(known))), **known}
            checkpoint = self._commit(
                checkpoint,
                replace(
                    checkpoint,
                    cycle_id=cycle_id,
                    applied_seq=applied_seq,
                    applied_commit_lsn=applied_commit_lsn,
                    restart_seq=restart_seq,
                    last_lsn=validator.state.last_lsn,
                    tables=dict(validator.state.tables),
                    row_counts=counts,
                    table_cycles={**checkpoint.table_cycles, **held},
                ),
                report,
            )
            for xid in taken:
                self.buffers.release(xid)
        report.open, report.applied_seq, report.restart_seq = len(still_open), applied_seq, checkpoint.restart_seq
        for kind, name, size in self.buffers.drain_spill_events():
            (report.spill_created if kind == "created" else report.spill_removed).append({"file": name, "bytes": size})
        report.queue = self.queue.cycle_figures(reset=True)
        return_freed_memory()  # what the compile and the target's commits freed
        report.ended_at = self.clock().isoformat()
        self._file_report(report)
        return checkpoint, report

    def _record_intent(self, intent: Intent) -> Intent:
        """Record the cycle's pairs; a cycle begun in parts before keeps its progress (the same pairs)."""
        begun = self.store.load_intent()
        if begun is not None and (begun.cycle_id, begun.seqs) == (intent.cycle_id, intent.seqs):
            intent = begun
        return self._save_intent(intent)

    def _save_intent(self, intent: Intent) -> Intent:
        self.store.save_intent(intent)
        return intent

    def _resume_at(self, intent: Intent) -> tuple[int, int]:
        """Where a cycle begun in parts goes on: ``(through, part_end)``, the target's answer if it is ahead.

        A target that holds exactly the part under way (it committed it, the
        run died before recording so) still has that part applied again when
        it was being applied, not passed: the target skips it, and its rows
        are counted (``intent.changed`` holds those before it only).
        """
        held = self.target.applied_through(intent.cycle_id)
        if held > intent.through and (held != intent.part_end or intent.passing):
            return held, 0
        return intent.through, intent.part_end

    def _commit(self, before: Checkpoint, after: Checkpoint, report: CycleReport) -> Checkpoint:
        """Record the cycle in the ledger, then write its checkpoint.

        In this order, a crash between the two leaves a recorded cycle past the
        checkpoint; the next attempt drops it (``forget_after``) and re-runs it.
        """
        after = replace(after, committed_at=self.clock().isoformat())
        cycle = LedgerCycle.of(before, after, report)
        self.cycles.append(cycle)
        if self.journal is not None:
            self.journal.add(cycle)
        saved = self.store.save(after)
        self.target.save_checkpoint(saved.to_json())
        return saved

    def _file_report(self, report: CycleReport) -> None:
        append_report(self.report_path, report)
