"""The run ledger: record layout, run keys, continued attempts, intermediate retention and ``applier runs``."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from applier import cli
from applier.config import Config
from applier.engine.api import run_applier
from applier.engine.checkpoint import Checkpoint, CheckpointStore
from applier.engine.ledger import LedgerCycle, RunLedger, RunRecord, check_run_key, prunable_pairs, safe_file_name
from applier.errors import GapError, UsageError
from applier.generate import generate_workload
from applier.intermediate.pairs import pair_name
from conftest import REPO
from engine_support import make_config

SETTINGS = {"process_intermediate_size_per_job": 0.15, "buffer_size_for_split_records": 4096}
KEY = "scheduled__2026-11-21T10:00:00+00:00"
T0 = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)


# Run keys and records, no Spark.


def test_run_keys_map_to_distinct_safe_file_names_inside_the_ledger_folder(tmp_path: Path) -> None:
    keys = [KEY, "a/b", "a_b", "../../etc/passwd", "..", "x" * 250, "ключ 1", "manual__2026-11-21T10:00:00.5+00:00"]
    ledger = RunLedger(tmp_path)
    names = [safe_file_name(k) for k in keys]
    assert len(set(names)) == len(keys), "two keys never share a file"
    for key, name in zip(keys, names, strict=True):
        path = ledger.path(key)
        assert path.parent == tmp_path / "ledger" and path.name == name
        assert name.endswith(".json") and not name.startswith(".") and len(name) <= 82
        assert set(name[: -len(".json")]) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
    assert safe_file_name(KEY).startswith("scheduled__2026-11-21T10_00_00_00_00-")


@pytest.mark.parametrize("key", ["", "   ", "tab\there", "line\nbreak", "x" * 251])
def test_blank_unprintable_or_overlong_run_keys_are_refused(key: str) -> None:
    with pytest.raises(UsageError, match="run key") as refused:
        check_run_key(key)
    assert refused.value.exit_code == 2


def test_a_checkpoint_written_before_table_cycles_existed_still_loads(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_text(
        json.dumps({"cycle_id": 3, "applied_seq": 7, "applied_commit_lsn": 90, "restart_seq": 6, "last_lsn": 95,
                    "tables": {}, "row_counts": {"s.t": 4}, "committed_at": "2026-11-21T10:00:00+00:00"})
    )  # fmt: skip
    loaded = CheckpointStore(tmp_path).load()
    assert (loaded.cycle_id, loaded.restart_seq, loaded.table_cycles) == (3, 6, {})


def _cycle(cycle_id: int, seqs: list[int], restart_seq: int, committed_at: dt.datetime) -> LedgerCycle:
    before = Checkpoint(cycle_id=cycle_id - 1, applied_seq=seqs[0] - 1, restart_seq=restart_seq).to_json()
    after = Checkpoint(cycle_id=cycle_id, applied_seq=seqs[-1], restart_seq=seqs[-1] + 1).to_json()
    return LedgerCycle(cycle_id, seqs, before, after, committed_at.isoformat())


def test_retention_keeps_recent_cycles_pairs_their_restart_windows_and_everything_a_restart_needs() -> None:
    old, recent = T0 - dt.timedelta(hours=30), T0 - dt.timedelta(hours=2)
    records = [
        RunRecord("r1", "finished", "apply", old.isoformat(), cycles=[_cycle(1, [1, 2, 3], 1, old)]),
        # cycle 2 began with a transaction open since pair 3: its replay re-reads pair 3
        RunRecord("r2", "finished", "apply", recent.isoformat(), cycles=[_cycle(2, [4, 5], 3, recent)]),
        RunRecord("r3", "finished", "apply", old.isoformat(), cycles=[_cycle(3, [6, 7], 6, old)]),
    ]
    written = {seq: old for seq in range(1, 13)} | {10: T0 - dt.timedelta(minutes=5)}  # 8..12: no keyed run took them
    checkpoint = Checkpoint(cycle_id=5, applied_seq=12, restart_seq=11)
    cutoff = T0 - dt.timedelta(hours=24)
    assert prunable_pairs(written, checkpoint, records, cutoff) == [1, 2, 6, 7, 8, 9]
    assert prunable_pairs(written, checkpoint, records, T0) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert prunable_pairs(written, Checkpoint(cycle_id=5, applied_seq=12, restart_seq=2), records, T0) == [1]


# Recorded runs, with Spark.


@dataclass
class Recorded:
    base: Path
    config: Config
    pairs: int


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Recorded:
    base = tmp_path_factory.mktemp("ledger")
    workload = generate_workload(base / "in", seed=7, transactions=40, file_size_mb=0.03, profile="demo")
    config = make_config(base, base / "in", **SETTINGS)
    run_applier(config, spark=spark, max_cycles=2, run_key=KEY)
    run_applier(config, spark=spark, run_key="second")
    return Recorded(base, config, workload.pairs)


@pytest.mark.spark
def test_a_keyed_run_records_each_cycle_with_its_positions_before_and_after(recorded: Recorded) -> None:
    config = recorded.config
    path = RunLedger(config.work_dir).path(KEY)
    data = json.loads(path.read_text())
    assert {k: data[k] for k in ("run_key", "status", "mode", "attempts", "error")} == {
        "run_key": KEY, "status": "finished", "mode": "apply", "attempts": 1, "error": None,
    }  # fmt: skip
    assert dt.datetime.fromisoformat(data["started_at"]) <= dt.datetime.fromisoformat(data["finished_at"])
    assert "cycles" not in data, "the header holds no cycle; they are appended to their own file"
    cycles = [json.loads(line) for line in (path.parent / data["cycles_file"]).read_text().splitlines()]
    assert [c["cycle_id"] for c in cycles] == [1, 2]
    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]
    for cycle, report in zip(cycles, reports, strict=False):
        assert cycle["seqs"] == report["seqs"] and cycle["net_rows"] == report["net_rows"]
        assert cycle["before"]["cycle_id"] == cycle["cycle_id"] - 1 and cycle["after"]["cycle_id"] == cycle["cycle_id"]
        assert cycle["after"]["applied_seq"] == cycle["seqs"][-1] == report["applied_seq"]
        assert cycle["after"]["restart_seq"] == report["restart_seq"]
        assert set(cycle["tables"]) == set(report["net_rows"]) and set(cycle["tables"].values()) <= {"applied"}
        changed = {t for t, ops in report["net_rows"].items() if ops}
        assert {t for t, c in cycle["after"]["table_cycles"].items() if c == cycle["cycle_id"]} == changed
        for side in ("before", "after"):
            stored = path.parent / "definitions" / f"{cycle[side]['tables']}.json"
            assert stored.is_file(), "table definitions are stored once, by digest"
    assert any(c["tables"] for c in cycles), "the run changed tables"
    assert cycles[1]["before"] == cycles[0]["after"], "each cycle starts where the one before stopped"
    assert cycles[0]["seqs"][0] == 1
    second = RunLedger(config.work_dir).get("second")
    assert second is not None and second.cycles[0].cycle_id == 3
    assert second.cycles[-1].seqs[-1] == recorded.pairs
    last = CheckpointStore(config.work_dir).load()
    assert second.cycles[-1].after == last.to_json(), "the last cycle's record holds the checkpoint it wrote"
    assert [r.run_key for r in RunLedger(config.work_dir).records()] == [KEY, "second"]


class Crash(Exception):
    """A failure right after the ledger recorded a cycle, before its checkpoint."""


@pytest.mark.spark
def test_a_failed_attempt_is_continued_under_the_same_key_without_a_cycle_twice(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    generate_workload(tmp_path / "in", seed=8, transactions=40, file_size_mb=0.03, profile="demo")
    config = make_config(tmp_path, tmp_path / "in", **SETTINGS)
    real_save = CheckpointStore.save

    def failing_save(self: CheckpointStore, checkpoint: Checkpoint) -> Checkpoint:
        if checkpoint.cycle_id > 1 and checkpoint.cycle_id in checkpoint.table_cycles.values():
            raise Crash("disk full")  # the first cycle after the first that changed a table
        return real_save(self, checkpoint)

    monkeypatch.setattr(CheckpointStore, "save", failing_save)
    with pytest.raises(Crash):
        run_applier(config, spark=spark, run_key="k")
    monkeypatch.setattr(CheckpointStore, "save", real_save)
    failed = RunLedger(config.work_dir).get("k")
    assert failed is not None and failed.status == "failed" and failed.error == "Crash: disk full"
    crashed = CheckpointStore(config.work_dir).load().cycle_id + 1
    assert [c.cycle_id for c in failed.cycles] == list(range(1, crashed + 1)), "recorded before its checkpoint"
    summary = run_applier(config, spark=spark, run_key="k")
    assert not summary.replay and summary.reports[0].cycle_id == crashed
    record = RunLedger(config.work_dir).get("k")
    assert record is not None and (record.status, record.mode, record.attempts, record.error) == (
        "finished", "apply", 2, None,
    )  # fmt: skip
    ids = [c.cycle_id for c in record.cycles]
    assert ids == list(range(1, len(ids) + 1)) and ids[-1] == summary.checkpoint.cycle_id
    assert "skipped" in record.cycles[crashed - 1].tables.values(), "tables that had the cycle skip it on the re-run"
    assert [c.cycle_id for c in summary.cycles] == ids


@pytest.mark.spark
def test_retention_deletes_old_applied_pairs_and_a_replay_needing_one_names_it(
    recorded: Recorded, tmp_path: Path, spark: Any
) -> None:
    for folder in ("in", "out", "target"):
        shutil.copytree(recorded.base / folder, tmp_path / folder)
    config = make_config(tmp_path, tmp_path / "in", **SETTINGS, intermediate_retention_hours=1)
    checkpoint = CheckpointStore(config.work_dir).load()
    assert checkpoint.restart_seq > 3, "the workload leaves applied pairs before the restart position"
    now = dt.datetime.now(dt.UTC)
    kept = run_applier(config, spark=spark, run_key="at-once", clock=lambda: now)
    assert kept.pruned_pairs == [] and kept.reports == []
    later = run_applier(config, spark=spark, run_key="two-hours-later", clock=lambda: now + dt.timedelta(hours=2))
    assert later.pruned_pairs == list(range(1, checkpoint.restart_seq))
    left = sorted(int(p.stem) for p in (tmp_path / "in").glob("*.trn"))
    assert left == list(range(checkpoint.restart_seq, recorded.pairs + 1)), "a restart still has its pairs"
    record = RunLedger(config.work_dir).get("two-hours-later")
    assert record is not None and record.pruned_pairs == later.pruned_pairs
    assert run_applier(config, spark=spark).checkpoint == checkpoint, "the Applier still resumes"
    shutil.rmtree(tmp_path / "target")  # a replay of the first run would need its pairs again
    with pytest.raises(GapError) as gone:
        run_applier(config, spark=spark, run_key=KEY)
    assert gone.value.seq == 1 and gone.value.exit_code == 3
    assert pair_name(1) in str(gone.value) and "retention" in str(gone.value) and "two-hours-later" in str(gone.value)


@pytest.mark.spark
def test_run_key_on_the_command_line_and_the_job_replays_a_finished_run(
    recorded: Recorded, tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command and the job start their own session; here they get the test session, its settings untouched.
    monkeypatch.setattr("applier.engine.api.start_spark", lambda config, set_master=True: spark)
    for folder in ("out", "target"):
        shutil.copytree(recorded.base / folder, tmp_path / folder)
    config_file = tmp_path / "applier.yaml"
    config_file.write_text(
        f"configuration_name: test_cfg\nintermediate_dir: {recorded.base / 'in'}\noutput_dir: {tmp_path / 'out'}\n"
        f"target: {{path: {tmp_path / 'target'}}}\n"
    )
    cycle_id = CheckpointStore(tmp_path / "out" / "test_cfg").load().cycle_id
    assert cli.main(["run", "--config", str(config_file), "--run-key", KEY]) == 0
    out = capsys.readouterr().out
    assert f"replayed run {KEY}: 2 cycles, 0 table changes reapplied" in out
    assert f"checkpoint unchanged at cycle {cycle_id}" in out
    spec = importlib.util.spec_from_file_location("apply_job", REPO / "jobs" / "apply.py")
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    assert job.main(["--config", str(config_file), "--run-key", "second"]) == 0
    record = RunLedger(tmp_path / "out" / "test_cfg").get("second")
    assert record is not None and (record.mode, record.status, record.attempts) == ("replay", "finished", 2)


def test_applier_runs_lists_each_run_key_with_status_mode_cycles_and_pairs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "applier.yaml"
    config_file.write_text(
        f"configuration_name: c1\nintermediate_dir: {tmp_path / 'in'}\noutput_dir: {tmp_path / 'out'}\n"
        f"target: {{path: {tmp_path / 'target'}}}\n"
    )
    assert cli.main(["runs", "--config", str(config_file)]) == 0
    assert "no runs recorded" in capsys.readouterr().out
    ledger = RunLedger(tmp_path / "out" / "c1")
    start = T0.isoformat()
    ledger.save(RunRecord("r1", "finished", "apply", start, finished_at=start, cycles=[_cycle(1, [1, 2], 1, T0)]))
    failed = RunRecord("r2", "failed", "replay", (T0 + dt.timedelta(hours=1)).isoformat(), error="GapError: gone")
    failed.cycles = [_cycle(2, [3], 3, T0), _cycle(3, [4, 5], 4, T0)]
    ledger.save(failed)
    assert cli.main(["runs", "--config", str(config_file)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "key", "status", "mode", "cycles", "pairs", "started", "finished"]
    assert lines[1].split() == [
        "r1",
        "finished",
        "apply",
        "1",
        "1..2",
        "2026-11-21",
        "12:00:00",
        "2026-11-21",
        "12:00:00",
    ]
    assert lines[2].split() == ["r2", "failed", "replay", "2..3", "3..5", "2026-11-21", "13:00:00", "-"]
    assert lines[3] == "    error: GapError: gone"
