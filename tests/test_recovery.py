"""Recovery: a restored target is refused by normal runs and brought back by replaying the runs since.

One recorded history (runs r1, r2, r3 of a few cycles each, with transactions
open across cycles) is built once; each test works on its own copy of the
Applier's files and the target.
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from applier.config import Config
from applier.engine.api import run_applier
from applier.engine.changes import TableChanges, arrow_schema
from applier.engine.checkpoint import Checkpoint, CheckpointStore
from applier.engine.ledger import LedgerCycle, RunLedger, RunRecord
from applier.engine.replay import plan_replay
from applier.errors import TargetError
from applier.generate import generate_workload
from applier.intermediate.schema import Column, TableDef
from applier.targets.delta import DeltaTarget
from applier.targets.delta_log import PathAnswer, commit_tags, cycle_on_path
from engine_support import assert_target_equals_reference, make_config, target_tables

SETTINGS = {"process_intermediate_size_per_job": 0.08, "buffer_size_for_split_records": 1024}


@dataclass
class History:
    """The files of three recorded runs, and what the target looked like along the way."""

    base: Path
    tables: list[str]
    versions_after_r1: dict[str, int]  # Delta version of each table after r1 (absent: not created yet)
    final_rows: dict[str, list[str]]  # every table after r3: the uninterrupted state


def _state(config: Config, tables: list[str]) -> dict[str, list[str]]:
    """Each table's rows as sorted text (row order is not part of a table; NaN compares as text)."""
    return {name: sorted(repr(row) for row in rows) for name, rows in target_tables(config, tables).items()}


def _versions(config: Config, tables: list[str]) -> dict[str, int]:
    assert config.target.path is not None
    target = DeltaTarget(config.target.path, config.configuration_name)
    paths = {t: str(target.table_path(t)) for t in tables}
    return {t: DeltaTable(p).version() for t, p in paths.items() if DeltaTable.is_deltatable(p)}


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> History:
    base = tmp_path_factory.mktemp("recovery")
    generate_workload(base / "in", seed=14, transactions=150, file_size_mb=0.04, profile="demo")
    config = make_config(base, base / "in", **SETTINGS)
    first = run_applier(config, spark=spark, max_cycles=2, run_key="r1")
    tables = sorted(first.checkpoint.tables)
    versions_after_r1 = _versions(config, tables)
    shutil.copytree(base / "target", base / "target-after-r1")
    second = run_applier(config, spark=spark, max_cycles=2, run_key="r2")
    third = run_applier(config, spark=spark, run_key="r3")
    assert [len(s.cycles) for s in (first, second, third)][:2] == [2, 2] and third.cycles
    reopened = [c for s in (second, third) for c in s.cycles if c.before["restart_seq"] <= c.before["applied_seq"]]
    assert reopened, "some replayed cycle must start with transactions open (a restart window to rebuild)"
    tables = sorted(third.checkpoint.tables)
    return History(base, tables, versions_after_r1, _state(config, tables))


def _copy(history: History, tmp_path: Path) -> Config:
    """A private copy of the Applier's files and the target, configured like the recorded runs."""
    shutil.copytree(history.base / "out", tmp_path / "out")
    shutil.copytree(history.base / "target", tmp_path / "target")
    return make_config(tmp_path, history.base / "in", **SETTINGS)


def _restore_to_r1(config: Config, history: History) -> None:
    """``DeltaTable.restore`` every table to its version after r1 (a table r1 had not created is dropped)."""
    assert config.target.path is not None
    target = DeltaTarget(config.target.path, config.configuration_name)
    for table in history.tables:
        path = target.table_path(table)
        version = history.versions_after_r1.get(table)
        if version is None:
            shutil.rmtree(path)
        elif DeltaTable(str(path)).version() != version:
            DeltaTable(str(path)).restore(version)


def _replay_and_compare(config: Config, spark: Any, history: History) -> None:
    checkpoint = CheckpointStore(config.work_dir).load()
    for key in ("r2", "r3"):
        summary = run_applier(config, spark=spark, run_key=key)
        assert summary.replay and summary.run_key == key
        assert any(o == "reapplied" for c in summary.cycles for o in c.tables.values())
        assert summary.checkpoint == checkpoint, "a replay never moves the checkpoint"
    assert CheckpointStore(config.work_dir).load_intent() is None
    assert _state(config, history.tables) == history.final_rows
    assert_target_equals_reference(config, history.base / "in")
    after = run_applier(config, spark=spark)
    assert after.reports == [] and after.checkpoint == checkpoint, "recovered: a normal run finds nothing to do"


@pytest.mark.spark
@pytest.mark.slow
def test_tables_restored_to_an_earlier_version_are_refused_then_recovered_by_replaying_the_runs_since(
    history: History, tmp_path: Path, spark: Any
) -> None:
    config = _copy(history, tmp_path)
    _restore_to_r1(config, history)
    with pytest.raises(TargetError) as refused:
        run_applier(config, spark=spark)
    message = str(refused.value)
    assert "restored" in message and "README 'Recovery'" in message and "r2, r3" in message
    assert any(f"table {t} holds cycle 2, the checkpoint recorded cycle" in message for t in history.tables)
    assert refused.value.exit_code == 4
    with pytest.raises(TargetError, match="replay the runs before r3 first"):
        run_applier(config, spark=spark, run_key="r3")
    _replay_and_compare(config, spark, history)
    record = RunLedger(config.work_dir).get("r2")
    assert record is not None and record.mode == "replay" and record.status == "finished" and record.attempts == 2


@pytest.mark.spark
@pytest.mark.slow
def test_table_folders_replaced_by_a_backup_copy_are_recovered_by_replaying_the_runs_since(
    history: History, tmp_path: Path, spark: Any
) -> None:
    config = _copy(history, tmp_path)
    shutil.rmtree(tmp_path / "target")
    shutil.copytree(history.base / "target-after-r1", tmp_path / "target")
    with pytest.raises(TargetError, match="restored to an earlier state"):
        run_applier(config, spark=spark)
    _replay_and_compare(config, spark, history)


@pytest.mark.spark
def test_replaying_a_run_on_an_untouched_target_verifies_every_table_and_writes_nothing(
    history: History, tmp_path: Path, spark: Any
) -> None:
    config = _copy(history, tmp_path)
    versions = _versions(config, history.tables)
    checkpoint = CheckpointStore(config.work_dir).load()
    summary = run_applier(config, spark=spark, run_key="r2")
    assert summary.replay and summary.reports == [], "nothing is re-run"
    assert [c.cycle_id for c in summary.cycles] == [3, 4]
    assert {o for c in summary.cycles for o in c.tables.values()} == {"verified"}
    assert _versions(config, history.tables) == versions, "no new Delta version"
    assert CheckpointStore(config.work_dir).load() == checkpoint
    assert _state(config, history.tables) == history.final_rows


# Restore detection in the Delta target (delta-rs, no Spark).

ITEMS = TableDef("s.items", (Column("id", "bigint", False), Column("v", "string", True)), ("id",))


def _upsert(n: int) -> TableChanges:
    schema = arrow_schema(ITEMS)
    return TableChanges(
        table=ITEMS,
        truncate=False,
        upserts=pa.Table.from_pylist([{"id": n, "v": f"c{n}"}], schema=schema),
        deletes=pa.schema([schema.field("id")]).empty_table(),
        counted=None,
        stats={"I": 1, "U": 0, "D": 0, "T": 0},
    )


def _ids(target: DeltaTarget) -> list[int]:
    table = target.read_arrow(ITEMS.name)
    assert table is not None
    return sorted(table["id"].to_pylist())


def test_committed_cycle_follows_restores_and_a_restored_away_cycle_is_applied_again(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, "cfg")
    path = str(target.table_path(ITEMS.name))
    for cycle in range(1, 6):
        target.apply(cycle, _upsert(cycle))  # cycle 1's commit creates the table: version n holds cycle n + 1
    DeltaTable(path).restore(2)
    assert DeltaTable(path).transaction_version("cfg") == 5, "the spike's finding: RESTORE keeps the app transaction"
    assert target.committed_cycle(ITEMS.name) == 3
    DeltaTable(path).optimize.compact()
    assert target.committed_cycle(ITEMS.name) == 3, "a commit that changes no row is walked past"
    before = DeltaTable(path).version()
    target.apply(4, _upsert(4))
    assert DeltaTable(path).version() == before + 1 and target.committed_cycle(ITEMS.name) == 4
    target.apply(4, _upsert(4))
    assert DeltaTable(path).version() == before + 1, "a cycle the table holds is still skipped"
    assert _ids(target) == [1, 2, 3, 4]
    DeltaTable(path).restore(0)
    assert target.committed_cycle(ITEMS.name) == 1 and _ids(target) == [1]


def test_committed_cycle_follows_a_restore_to_a_moment_and_a_backup_copy(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path / "live", "cfg")
    path = target.table_path(ITEMS.name)
    for cycle in (1, 2):
        target.apply(cycle, _upsert(cycle))
    shutil.copytree(path, tmp_path / "backup")
    time.sleep(0.01)  # commit timestamps are milliseconds: the moment must fall between two commits
    moment = dt.datetime.now(dt.UTC)
    time.sleep(0.01)
    target.apply(3, _upsert(3))
    DeltaTable(str(path)).restore(moment)
    assert target.committed_cycle(ITEMS.name) == 2 and _ids(target) == [1, 2]
    target.apply(3, _upsert(3))
    shutil.rmtree(path)
    shutil.copytree(tmp_path / "backup", path)
    assert target.committed_cycle(ITEMS.name) == 2 and _ids(target) == [1, 2]


def _entry(operation: str, cycle: int | None = None, **params: str) -> dict[str, Any]:
    return {"operation": operation, "operationParameters": params, **(commit_tags("cfg", cycle) if cycle else {})}


def test_the_history_walk_follows_restores_passes_commits_without_row_changes_and_stops_at_untagged_writes() -> None:
    history = {
        0: _entry("CREATE TABLE"),
        1: _entry("WRITE"),  # written before commits were tagged: its app transaction answers
        2: _entry("MERGE", 7),
        3: _entry("MERGE", 8),
        4: _entry("RESTORE", version="2"),
        5: _entry("ADD COLUMN"),
        6: _entry("RESTORE", version="1"),
        7: _entry("OPTIMIZE"),
    }
    assert cycle_on_path(history, 5, "cfg", complete=True) == PathAnswer(7, 2)
    assert cycle_on_path(history, 7, "cfg", complete=True) == PathAnswer(None, 1)
    assert cycle_on_path(history, 3, "other", complete=True) == PathAnswer(None, 3), "another app's commit"
    newest = {v: e for v, e in history.items() if v >= 5}
    assert cycle_on_path(newest, 7, "cfg", complete=False).needs_older
    with pytest.raises(ValueError, match="names version 9"):
        cycle_on_path({0: _entry("CREATE TABLE"), 1: _entry("RESTORE", version="9")}, 1, "cfg", complete=True)


def _recorded(cycle_id: int, before: dict[str, int], after: dict[str, int]) -> LedgerCycle:
    return LedgerCycle(
        cycle_id,
        [cycle_id],
        Checkpoint(cycle_id=cycle_id - 1, table_cycles=before).to_json(),
        Checkpoint(cycle_id=cycle_id, table_cycles=after).to_json(),
        "2026-11-21T10:00:00+00:00",
        tables=dict.fromkeys(after, "applied"),
    )


def test_a_replay_plan_verifies_tables_holding_a_cycle_reapplies_those_where_it_found_them_and_refuses_the_rest() -> (
    None
):
    # cycle 5 changed a and b; cycle 6 changed a and left c (last changed in 2) as it was
    record = RunRecord("r", "finished", "apply", "2026-11-21T10:00:00+00:00")
    record.cycles = [_recorded(5, {"a": 4, "b": 3}, {"a": 5, "b": 5}), _recorded(6, {"a": 5, "c": 2}, {"a": 6, "c": 2})]
    assert plan_replay(record, {"a": 6, "b": 5, "c": 2}) == [
        {"a": "verified", "b": "verified"},
        {"a": "verified", "c": "verified"},
    ]
    assert plan_replay(record, {"a": 4, "b": 9, "c": 2}) == [
        {"a": "reapplied", "b": "verified"},
        {"a": "reapplied", "c": "verified"},
    ]
    with pytest.raises(TargetError, match="table b holds cycle 1, but cycle 5 of run r starts from cycle 3"):
        plan_replay(record, {"a": 4, "b": 1, "c": 2})
    with pytest.raises(TargetError, match="table c holds cycle 1, but cycle 6 of run r starts from cycle 2"):
        plan_replay(record, {"a": 6, "b": 5, "c": 1})
