"""The one call that runs the Applier, shared by ``applier run`` and ``jobs/apply.py``."""

from __future__ import annotations

import datetime as dt
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from applier.config import Config
from applier.engine.checkpoint import CheckpointStore
from applier.engine.driver_memory import use_system_allocator
from applier.engine.jvm_launch import LaunchedJvm
from applier.engine.last_run import record_run
from applier.engine.ledger import (
    Clock,
    RunJournal,
    RunLedger,
    check_run_key,
    describe_seqs,
    prune_intermediate,
    utc_now,
)
from applier.engine.ledger_cycles import CycleLog
from applier.engine.replay import replay_run
from applier.engine.report import CycleReport
from applier.engine.run import Applier, RunSummary
from applier.engine.runlock import RunLock
from applier.engine.session import LazySession, start_spark
from applier.errors import RunLockedError
from applier.intermediate.pairs import list_pairs
from applier.preflight import check_folders, refused_pairs
from applier.targets import Target, open_target

log = logging.getLogger("applier")


def configure_logging() -> None:
    """Operator logs on stderr: the Applier's cycle lines at INFO, Spark's Python bridge quiet."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)


def run_applier(
    config: Config,
    *,
    max_cycles: int | None = None,
    spark: Any = None,
    set_master: bool = True,
    on_cycle: Callable[[CycleReport], None] | None = None,
    run_key: str | None = None,
    clock: Clock = utc_now,
    jvm: LaunchedJvm | None = None,
) -> RunSummary:
    """Run apply cycles until caught up or the cycle limit, or replay a finished run.

    Without a run key this is a plain run. With one, the run records its cycles
    in the run ledger (status ``running``, then ``finished``, or ``failed``
    with the error); a key whose record is finished (or whose replay began) is
    replayed instead: exactly its recorded cycles, verified or reapplied table
    by table, the checkpoint untouched (see :mod:`applier.engine.replay`). A
    record left running or failed by an apply is continued by a normal run.
    After the run, intermediate retention deletes what it may.

    Args:
        config: the validated configuration.
        max_cycles: cycles for this run; None takes ``apply.max_cycles_per_run``
            (a replay takes all the recorded ones).
        spark: a running session to use; None starts one from the configuration
            when the first cycle is about to be applied (none when there is nothing to do).
        set_master: whether the configuration's ``spark.master`` applies (not under spark-submit).
        on_cycle: called with each cycle's report.
        run_key: the run's key (Airflow: one per DAG run), or None.
        clock: the time of ledger entries and of intermediate retention.
        jvm: the driver's JVM launched ahead (``applier run``), which the session joins when it starts.

    Raises:
        UsageError: the run key is blank, too long or not printable.
        FolderError: ``intermediate_dir`` is missing, or the work folder or a
            Delta target's root cannot be written; before the lock.
        IntermediateFileError: a refused pair, after everything before it was
            applied; GapError: a pair a replay needs is gone.
        TargetError: the target failed (the cycle was not checkpointed), or
            was restored to an earlier state (replay the runs since), or is not
            where a replayed cycle found it (replay earlier runs first).
        StateFileError: the checkpoint, the intent or the key's ledger record
            is damaged; nothing was changed and Spark was not started.
        RunLockedError: another run of the configuration holds its run lock
            (the work folder's, or the target's); nothing was changed and
            Spark was not started.
    """
    logging.getLogger("applier").setLevel(logging.INFO)
    use_system_allocator()
    if run_key is not None:
        check_run_key(run_key)  # a bad key is refused before Spark starts, as before the lock
    check_folders(config, writing=True)
    # Spark starts at the first apply: every check before it (the locks, the state files, the target, the
    # first cycle's pairs) answers in about a second, and a run with nothing to do starts no Spark (nor a JVM).
    session = LazySession(lambda: start_spark(config, set_master=set_master, jvm=jvm), spark)
    # One run at a time: the folder's lock, then the target's, both before anything changes or Spark starts.
    with RunLock(config.work_dir, config.configuration_name, run_key=run_key):
        started, cycles = clock(), 0
        try:
            _check_state_files(config, run_key)  # a damaged one stops the run before Spark starts
            _warn_of_refused_pairs(config)
            target = open_target(config)
            with target.run_lock():
                summary = _locked_run(config, session, target, max_cycles, on_cycle, run_key, clock)
                cycles = summary.cycles_run
        except BaseException as e:
            session.settle()  # a JVM starting in the background prints before the run's error, not after it
            if not isinstance(e, RunLockedError):  # refused by the target's lock: another run's, and nothing changed
                record_run(config.work_dir, run_key=run_key, started_at=started, finished_at=clock(), cycles=0, error=e)
            raise
        record_run(config.work_dir, run_key=run_key, started_at=started, finished_at=clock(), cycles=cycles, error=None)
        if not (session.started or summary.cycles_run or summary.replay):
            log.info("nothing to do after pair %d: Spark not started", summary.checkpoint.applied_seq)
        return summary


def _warn_of_refused_pairs(config: Config) -> None:
    """Log the first backlog pair whose header or size is refused: the run applies the pairs before it, then stops."""
    applied = CheckpointStore(config.work_dir).load().applied_seq
    refused = next(refused_pairs(list_pairs(config.intermediate_dir, applied + 1).pairs), None)
    if refused is not None and refused.seq > applied + 1:  # the next pair itself is refused before the rebuild
        log.warning("%s: this run applies the pairs before it, then stops (exit code 3)", refused)


def _locked_run(
    config: Config,
    session: Any,
    target: Target,
    max_cycles: int | None,
    on_cycle: Callable[[CycleReport], None] | None,
    run_key: str | None,
    clock: Clock,
) -> RunSummary:
    """:func:`run_applier` once the run holds its locks."""
    ledger = RunLedger(config.work_dir)
    record = ledger.get(check_run_key(run_key)) if run_key is not None else None
    if run_key is None:
        summary = Applier(config, session, target, clock=clock).run(_limit(config, max_cycles), on_cycle)
        summary.pruned_pairs = _retention(config, ledger, clock)
        return summary
    replay = record is not None and record.replays
    record = ledger.begin(run_key, "replay" if replay else "apply", clock())
    try:
        if replay:
            log.info("run %s is finished in the run ledger: replaying its %d cycles", run_key, len(record.cycles))
            summary = replay_run(config, session, target, ledger, record, on_cycle)
        else:
            journal = RunJournal(ledger, record)
            summary = Applier(config, session, target, journal=journal, clock=clock).run(
                _limit(config, max_cycles), on_cycle
            )
        summary.pruned_pairs = _retention(config, ledger, clock)
        record.pruned_pairs.extend(summary.pruned_pairs)
    except Exception as e:
        ledger.end(record, clock(), e)
        raise
    ledger.end(record, clock())
    return summary


def _check_state_files(config: Config, run_key: str | None) -> None:
    """Read the checkpoint, the intent and the key's ledger record, raising StateFileError for a damaged one."""
    store = CheckpointStore(config.work_dir)
    store.load()
    store.load_intent()
    if run_key is not None:
        record = RunLedger(config.work_dir).get(run_key)
        if record is not None and isinstance(record.cycles, CycleLog):
            deque(record.cycles, maxlen=0)  # every line parses (one pass, at the start of the run)


def _limit(config: Config, max_cycles: int | None) -> int:
    return config.apply.max_cycles_per_run if max_cycles is None else max_cycles


def _retention(config: Config, ledger: RunLedger, clock: Clock) -> list[int]:
    """Delete the applied pairs ``apply.intermediate_retention_hours`` lets go (none when unset)."""
    hours = config.apply.intermediate_retention_hours
    if hours is None:
        return []
    checkpoint = CheckpointStore(config.work_dir).load()
    now = clock()
    recent = ledger.records(written_after=now - dt.timedelta(hours=hours))
    pruned = prune_intermediate(config.intermediate_dir, checkpoint, recent, hours, now)
    if pruned:
        log.info("intermediate retention (%g h) removed pairs %s", hours, describe_seqs(pruned))
    return pruned
