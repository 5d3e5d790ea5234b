"""Crashes at any point: the next run reaches exactly the state an uninterrupted run reaches."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from applier.engine.changes import TableChanges
from applier.engine.checkpoint import CheckpointStore
from applier.engine.run import Applier
from applier.generate import generate_workload
from applier.targets import open_target
from applier.targets.per_table import apply_tables
from applier.targets.postgres import PostgresTarget
from engine_support import assert_target_equals_reference, make_config, run, target_tables

pytestmark = [pytest.mark.spark, pytest.mark.slow]


class Crash(BaseException):
    """Stands for the process dying: nothing in the Applier may catch it."""


class CrashingTarget:
    """The real Delta target, dying right after its ``after``-th table commit."""

    atomic_cycles = False
    log_order = False

    def __init__(self, real: Any, after: int) -> None:
        self.real, self.after, self.applied = real, after, 0

    def applied_through(self, cycle_id: int) -> int:
        return int(self.real.applied_through(cycle_id))

    def committed_cycle(self, table: str) -> int:
        return int(self.real.committed_cycle(table))

    def committed_cycles(self, tables: Any) -> dict[str, int]:
        return dict(self.real.committed_cycles(tables))

    def autocorrect(self, tables: frozenset[str]) -> None:
        self.real.autocorrect(tables)

    def use_spark(self, spark: Any) -> None:
        """Nothing: every table goes through :meth:`apply_one`, which counts the commits it dies after."""

    def read_arrow(self, table: str) -> Any:
        return self.real.read_arrow(table)

    def close(self) -> None:
        self.real.close()

    def table_misfit(self, table: Any, known: Any) -> str | None:
        return self.real.table_misfit(table, known)

    def highest_cycle(self, tables: Any) -> int:
        return int(self.real.highest_cycle(tables))

    def check_tables(self, tables: Any) -> None:
        self.real.check_tables(tables)

    def saved_checkpoint(self) -> Any:
        return self.real.saved_checkpoint()

    def save_checkpoint(self, state: Any) -> None:
        self.real.save_checkpoint(state)

    def apply_one(self, cycle_id: int, changes: TableChanges, part: Any = None) -> tuple[bool, int, dict[str, int]]:
        applied, held, found = self.real.apply_one(cycle_id, changes, part)
        if not applied:
            return applied, held, found
        self.applied += 1
        if self.applied == self.after:
            raise Crash
        return applied, held, found

    def apply_cycle(
        self, cycle_id: int, changes: Mapping[str, TableChanges], position: Mapping[str, int], part: Any = None
    ) -> Any:
        return apply_tables(self, 1, cycle_id, changes, part)


@pytest.mark.parametrize("after_commits", [1, 4, 9])
def test_a_crash_between_table_commits_is_finished_by_the_next_run(
    tmp_path: Path, spark: Any, after_commits: int
) -> None:
    workload = generate_workload(tmp_path / "in", seed=11, transactions=150, file_size_mb=0.04, profile="demo")
    config = make_config(
        tmp_path, tmp_path / "in", process_intermediate_size_per_job=0.08, buffer_size_for_split_records=1024
    )
    with pytest.raises(Crash):
        Applier(config, spark, CrashingTarget(open_target(config), after_commits)).run()
    intent = CheckpointStore(config.work_dir).load_intent()
    assert intent is not None, "the crashed cycle's intent is recorded"
    summary = run(config, spark)
    assert summary.reports[0].cycle_id == intent.cycle_id and summary.reports[0].seqs == intent.seqs
    assert summary.reports[0].skipped_tables, "tables that had the cycle skip it"
    assert summary.checkpoint.applied_seq == workload.pairs
    assert_target_equals_reference(config, tmp_path / "in")


@pytest.mark.postgres
@pytest.mark.parametrize("after_tables", [1, 3])
def test_a_crash_inside_the_postgres_cycle_transaction_leaves_no_trace(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, pg_url: str, after_tables: int
) -> None:
    workload = generate_workload(tmp_path / "in", seed=14, transactions=150, file_size_mb=0.04, profile="demo")
    config = make_config(
        tmp_path,
        tmp_path / "in",
        ["target.type=postgres", f"target.url={pg_url}"],
        process_intermediate_size_per_job=0.08,
        buffer_size_for_split_records=1024,
    )
    run(config, spark, max_cycles=1)
    tables = sorted(CheckpointStore(config.work_dir).load().tables)
    before = {t: sorted(map(repr, r)) for t, r in target_tables(config, tables).items()}
    applied = {"n": 0}
    real_apply = PostgresTarget._apply_table

    def dying_apply(self: PostgresTarget, conn: Any, staged: Any) -> Any:
        found = real_apply(self, conn, staged)
        applied["n"] += 1
        if applied["n"] == after_tables:
            raise Crash
        return found

    monkeypatch.setattr(PostgresTarget, "_apply_table", dying_apply)
    with pytest.raises(Crash):
        run(config, spark, max_cycles=1)
    monkeypatch.setattr(PostgresTarget, "_apply_table", real_apply)
    after = {t: sorted(map(repr, r)) for t, r in target_tables(config, tables).items()}
    assert after == before, "nothing of the crashed cycle is visible"
    assert open_target(config).committed_cycle("any.table") == 1
    summary = run(config, spark)
    assert summary.reports[0].cycle_id == 2 and not summary.reports[0].skipped_tables
    assert summary.checkpoint.applied_seq == workload.pairs
    assert_target_equals_reference(config, tmp_path / "in")


def test_a_crash_before_the_checkpoint_is_finished_by_the_next_run(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, target_settings: list[str]
) -> None:
    workload = generate_workload(tmp_path / "in", seed=12, transactions=150, file_size_mb=0.04, profile="demo")
    config = make_config(
        tmp_path,
        tmp_path / "in",
        target_settings,
        process_intermediate_size_per_job=0.08,
        buffer_size_for_split_records=1024,
    )
    saves = {"n": 0}
    real_save = CheckpointStore.save

    def dying_save(self: CheckpointStore, checkpoint: Any) -> Any:
        saves["n"] += 1
        if saves["n"] == 2:
            raise Crash
        return real_save(self, checkpoint)

    monkeypatch.setattr(CheckpointStore, "save", dying_save)
    with pytest.raises(Crash):
        run(config, spark)
    monkeypatch.setattr(CheckpointStore, "save", real_save)
    assert CheckpointStore(config.work_dir).load().cycle_id == 1
    summary = run(config, spark)
    assert summary.reports[0].cycle_id == 2 and len(summary.reports[0].skipped_tables) > 0
    assert summary.checkpoint.applied_seq == workload.pairs
    assert_target_equals_reference(config, tmp_path / "in")


def _cycles_done(report: Path) -> int:
    return len(report.read_text().splitlines()) if report.exists() else 0


def test_sigkill_at_random_points_then_restart_reaches_the_uninterrupted_state(
    tmp_path: Path, target_settings: list[str]
) -> None:
    workload = generate_workload(
        tmp_path / "in", seed=13, transactions=300, file_size_mb=0.03, profile="long-transactions"
    )
    config_file = tmp_path / "applier.yaml"
    config_file.write_text(
        f"configuration_name: crash\nintermediate_dir: {tmp_path / 'in'}\noutput_dir: {tmp_path / 'out'}\n"
        f"target: {{path: {tmp_path / 'target'}}}\nspark: {{master: 'local[1]'}}\n"
        "apply: {process_intermediate_size_per_job: 0.05, buffer_size_for_split_records: 1024}\n"
    )
    report = tmp_path / "out" / "crash" / "cycles.jsonl"
    settings = [arg for setting in target_settings for arg in ("--set", setting)]
    command = [sys.executable, "-m", "applier.cli", "run", "--config", str(config_file), *settings]
    rng = random.Random(13)
    kills = 0
    stderr = tmp_path / "stderr.log"
    for _ in range(3):
        before = _cycles_done(report)
        with stderr.open("w") as err:
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        deadline = time.monotonic() + 300
        while _cycles_done(report) == before and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(rng.uniform(0.0, 2.5))  # somewhere inside a later cycle: reading, spilling, committing
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
        assert proc.wait() in (0, -signal.SIGKILL), stderr.read_text()[-3000:]
    assert kills >= 2, "the run must have been killed while working"
    # The last run finishes in larger cycles: a restart may plan differently, once the cycle under way is done.
    larger = ["--set", "apply.process_intermediate_size_per_job=2"]
    done = subprocess.run([*command, *larger], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    from applier.config import load_config

    config = load_config(config_file, target_settings)
    checkpoint = CheckpointStore(config.work_dir).load()
    assert checkpoint.applied_seq == workload.pairs
    assert_target_equals_reference(config, tmp_path / "in")
    assert not list(config.spill_dir.glob("*.spill")), "no spill file is left behind"
    cycle_ids = [json.loads(line)["cycle_id"] for line in report.read_text().splitlines()]
    assert max(cycle_ids) == checkpoint.cycle_id
