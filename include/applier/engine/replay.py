"""Replaying a finished run's recorded cycles: the recovery of a restored target.

A backfill runs a past run key again. Its record in the run ledger says which
cycles it applied, from which positions. The replay takes them in order and,
per table, lets the target decide:

- the table's current state already holds the cycle (``committed_cycle`` at or
  past it), or the cycle left it unchanged and it is exactly where the cycle
  found it: **verified**, nothing is written (no new Delta version);
- the table is exactly where the cycle found it (``committed_cycle`` equals the
  one recorded before the cycle): the cycle's changes are **reapplied**;
- anything else (the table is further behind, or holds a cycle the ledger does
  not place there) is refused before anything is written: earlier runs must be
  replayed first.

A cycle to reapply is rebuilt as a restart at its recorded ``before`` position
would be: the pairs ``restart_seq .. applied_seq`` are re-read to put the open
transactions back in the buffers, then exactly the recorded pairs are read and
applied under the recorded cycle id. Consecutive reapplied cycles carry the
buffers on, as the original run did. A replay never touches the checkpoint,
the intent, ``cycles.jsonl`` or the cycle numbering: the checkpoint is already
past these cycles. What it did is written back into the record (mode
``replay``, each table ``verified`` or ``reapplied``).

The record's cycles are streamed from its file, once to plan, once to re-run
and once to write the outcomes back; only the plans (table -> outcome, per
cycle) are held for the whole replay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from applier.config import Config
from applier.engine.buffers import TransactionBuffers
from applier.engine.checkpoint import Checkpoint, CheckpointStore, Intent
from applier.engine.ledger import LedgerCycle, RunLedger, RunRecord, TableOutcome
from applier.engine.reading import missing_pair_error, read_cycle
from applier.engine.report import CycleReport
from applier.engine.run import Applier, RunSummary
from applier.errors import GapError, TargetError
from applier.intermediate.pairs import PairRef, list_pairs, pair_name
from applier.intermediate.stream import StreamValidator
from applier.targets import Target

log = logging.getLogger("applier")


def plan_replay(record: RunRecord, held: Mapping[str, int]) -> list[dict[str, TableOutcome]]:
    """What a replay does to each table of each recorded cycle, given what the tables hold now.

    Args:
        record: the finished run's record.
        held: table -> the cycle its current state holds (``Target.committed_cycle``).

    Returns:
        Per recorded cycle, in order: table -> ``verified`` or ``reapplied``.

    Raises:
        TargetError: a table is not where a cycle to reapply found it (naming
            the table, both cycles and the runs to replay first).
    """
    now = dict(held)
    plans: list[dict[str, TableOutcome]] = []
    for cycle in record.cycles:
        found: Mapping[str, int] = cycle.before.get("table_cycles") or {}
        left: Mapping[str, int] = cycle.after.get("table_cycles") or {}
        plan: dict[str, TableOutcome] = {}
        for table in sorted(cycle.tables):
            have, want = now.get(table, 0), found.get(table)  # want None: recorded before table_cycles existed
            if have >= cycle.cycle_id or (want is not None and have == want == left.get(table)):
                plan[table] = "verified"
                continue
            if want is not None and have != want:
                raise TargetError(
                    f"table {table} holds cycle {have}, but cycle {cycle.cycle_id} of run {record.run_key} "
                    f"starts from cycle {want}: replay the runs before {record.run_key} first, in order "
                    "(see README 'Recovery')"
                )
            plan[table] = "reapplied"
            now[table] = left.get(table, cycle.cycle_id)
        plans.append(plan)
    return plans


def _check_pairs_present(config: Config, ledger: RunLedger, record: RunRecord, cycles: Iterable[LedgerCycle]) -> None:
    """Refuse, before anything is written, a replay whose pairs are gone.

    Raises:
        GapError: naming the first missing pair, the cycle and run that need it,
            and the run after which intermediate retention removed it.
    """
    for cycle in cycles:
        for seq in cycle.replay_window():
            name = pair_name(seq)
            if all((config.intermediate_dir / f"{name}.{ext}").is_file() for ext in ("dat", "trn")):
                continue
            pruned_by = [r.run_key for r in ledger.records() if seq in r.pruned_pairs]
            how = (
                f"intermediate retention (apply.intermediate_retention_hours) removed it after run {pruned_by[-1]}"
                if pruned_by
                else "removed by intermediate retention (apply.intermediate_retention_hours) or by hand"
            )
            raise GapError(
                config.intermediate_dir / name,
                seq,
                "pair-missing",
                f"pair {name} is needed to replay cycle {cycle.cycle_id} of run {record.run_key} but is gone: {how}",
            )


class ReplayApplier(Applier):
    """An :class:`Applier` that re-runs recorded cycles and persists nothing of its own.

    The cycle itself is the normal one (``_apply_cycle``); the intent, the
    checkpoint and the cycle report file are left alone.
    """

    def replay(
        self,
        record: RunRecord,
        plans: list[dict[str, TableOutcome]],
        summary: RunSummary,
        on_cycle: Callable[[CycleReport], None] | None = None,
    ) -> None:
        """Re-run the cycles of ``record`` that have a table to reapply, in order.

        Args:
            record: the finished run's record.
            plans: per recorded cycle, what the replay does to each table.
            summary: where the reports of the cycles re-run go.
            on_cycle: called with each of those reports.

        Raises:
            GapError: a pair of a cycle is missing.
            IntermediateFileError: a pair no longer reads as it did.
            TargetError: the target failed.
        """
        position: tuple[Checkpoint, StreamValidator] | None = None  # where the last re-run cycle left off
        try:
            for cycle, plan in zip(record.cycles, plans, strict=True):
                if "reapplied" not in plan.values():
                    position = None  # the next cycle re-run starts afresh from its recorded position
                    continue
                position, report = self._replay_cycle(record.run_key, cycle, position)
                summary.add_report(report)
                if on_cycle:
                    on_cycle(report)
        finally:
            self.buffers.close()
            self.checker.close()

    def _replay_cycle(
        self, run_key: str, cycle: LedgerCycle, position: tuple[Checkpoint, StreamValidator] | None
    ) -> tuple[tuple[Checkpoint, StreamValidator], CycleReport]:
        """Re-run one cycle from its recorded position: carried on from the cycle before, or rebuilt."""
        before = cycle.before_checkpoint()
        if before.cycle_id + 1 != cycle.cycle_id:
            raise TargetError(f"run {run_key}: cycle {cycle.cycle_id} is recorded after cycle {before.cycle_id}")
        if position is not None and (position[0].cycle_id, position[0].applied_seq) == (
            before.cycle_id,
            before.applied_seq,
        ):
            validator = position[1]
        else:
            self._fresh_buffers()
            validator = self._rebuild(before)
        started = time.perf_counter()
        read = read_cycle(self._recorded_pairs(cycle), validator, check_rows=False)
        if read.refused is not None:
            raise read.refused
        read.read_seconds = time.perf_counter() - started
        after, report = self._apply_cycle(before, validator, read)
        return (after, validator), report

    def _recorded_pairs(self, cycle: LedgerCycle) -> list[PairRef]:
        """Exactly the pairs the cycle took (the images were checked when it first ran)."""
        listed = {p.seq: p for p in list_pairs(self.config.intermediate_dir, cycle.seqs[0]).pairs}
        missing = [s for s in cycle.seqs if s not in listed]
        if missing:
            raise missing_pair_error(self.config.intermediate_dir, missing[0])
        return [listed[s] for s in cycle.seqs]

    def _fresh_buffers(self) -> None:
        self.buffers.close()  # also unregisters them from the queue
        self.buffers = TransactionBuffers(
            self.config.spill_dir,
            self.config.configuration_name,
            self.config.apply.buffer_size_for_split_records,
            self.queue,
        )

    def _record_intent(self, intent: Intent) -> Intent:
        """No intent: a replay re-run after a crash recomputes its plan from the target."""
        return intent

    def _save_intent(self, intent: Intent) -> Intent:
        return intent

    def _commit(self, before: Checkpoint, after: Checkpoint, report: CycleReport) -> Checkpoint:
        """No checkpoint: the real one is already past the replayed cycles."""
        return after

    def _file_report(self, report: CycleReport) -> None:
        log.info("replayed %s", report.log_line())


def replay_run(
    config: Config,
    spark: Any,
    target: Target,
    ledger: RunLedger,
    record: RunRecord,
    on_cycle: Callable[[CycleReport], None] | None = None,
) -> RunSummary:
    """Replay a finished run's cycles against ``target`` (see the module docstring).

    Args:
        config: the validated configuration.
        spark: the Spark session.
        target: the target, possibly restored to an earlier state.
        ledger: the run ledger (to name the run that pruned a missing pair).
        record: the finished run's record; its cycles' table outcomes are
            replaced by the replay's, in its cycles file (the caller saves
            its header).
        on_cycle: called with the report of each cycle re-run.

    Returns:
        The summary: ``replay`` True, the record's cycles with their outcomes
        (the last ones, and counts over all), the reports of the cycles re-run
        and the (unchanged) checkpoint.

    Raises:
        TargetError: a table is not where a cycle to reapply found it, or the target failed.
        GapError: a pair a cycle to reapply needs is gone (removed by retention, say).
    """
    tables = sorted({t for cycle in record.cycles for t in cycle.tables})
    plans = plan_replay(record, target.committed_cycles(tables))
    to_reapply = (c for c, plan in zip(record.cycles, plans, strict=True) if "reapplied" in plan.values())
    _check_pairs_present(config, ledger, record, to_reapply)
    applier = ReplayApplier(config, spark, target)
    summary = RunSummary(leftover_spills_removed=applier.buffers.clear_leftovers(), run_key=record.run_key, replay=True)
    applier.replay(record, plans, summary, on_cycle)
    for cycle_id, plan in zip((c.cycle_id for c in record.cycles), plans, strict=True):
        log.info(
            "run %s, cycle %d: %s",
            record.run_key,
            cycle_id,
            ", ".join(f"{t} {outcome}" for t, outcome in plan.items()) or "no tables",
        )
    summary.add_cycles(ledger.set_outcomes(record, plans))
    summary.checkpoint = CheckpointStore(config.work_dir).load()
    return summary
