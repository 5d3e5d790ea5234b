"""The apply DAG in a real, running Airflow: REST triggers with params, and a backfill that recovers a target.

One Airflow (``airflow_server.running_airflow``: api-server, scheduler and
dag-processor on SQLite, LocalExecutor, a free loopback port) serves the
module. Its DAG runs monthly (``APPLIER_SCHEDULE``), so that the backfill has
past logical dates to re-run; on unpausing, the scheduler creates the run of
the latest month, which finds an empty intermediate folder (``APPLIER_CONFIG``)
and skips. Each test then points the Airflow Variable ``applier_config`` at a
configuration over its own generated workload, and removes it at the end.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from airflow_server import AirflowServer, iso, running_airflow
from applier.config import Config, load_config
from applier.engine.checkpoint import Checkpoint, CheckpointStore
from applier.engine.ledger import RunLedger
from applier.generate import generate_workload
from applier.intermediate.pairs import MIB, list_pairs
from applier.targets.delta import DeltaTarget
from applier_airflow.builders import run_key
from engine_support import assert_target_equals_reference
from reference.applier import canonical_rows, reference_apply

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

DAG_ID = "applier"
CONFIG_VARIABLE = "applier_config"
SCHEDULE = "0 0 1 * *"  # monthly: past logical dates to backfill, no new tick while the tests run


def month_start(moment: dt.datetime, months_back: int = 0) -> dt.datetime:
    """Midnight UTC on the first of ``moment``'s month, ``months_back`` months earlier: a tick of ``SCHEDULE``."""
    index = moment.year * 12 + moment.month - 1 - months_back
    return dt.datetime(index // 12, index % 12 + 1, 1, tzinfo=dt.UTC)


def write_config(root: Path, intermediate: Path, cycle_mib: float = 0) -> Path:
    """A configuration file over ``intermediate`` with output and Delta target under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    intermediate.mkdir(parents=True, exist_ok=True)
    path = root / "applier.yaml"
    path.write_text(
        "configuration_name: airflow_test\n"
        f"intermediate_dir: {intermediate}\n"
        f"output_dir: {root / 'out'}\n"
        "apply:\n"
        f"  process_intermediate_size_per_job: {cycle_mib}\n"
        "  buffer_size_for_split_records: 4096\n"
        "target:\n"
        "  type: delta\n"
        f"  path: {root / 'target'}\n"
    )
    return path


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    """The module's Airflow, its DAG parsed and unpaused, the latest month's scheduled run done."""
    base = tmp_path_factory.mktemp("airflow_server")
    idle = write_config(base / "idle", base / "idle" / "empty")
    (base / "home").mkdir()
    with running_airflow(base / "home", APPLIER_CONFIG=str(idle), APPLIER_SCHEDULE=SCHEDULE) as server:
        server.wait_for_dag(DAG_ID)
        server.set_paused(DAG_ID, False)

        def latest_month_handled() -> bool | None:
            dag = server.api("GET", f"/api/v2/dags/{DAG_ID}")
            next_run = dt.datetime.fromisoformat(dag["next_dagrun_run_after"])
            runs = server.dag_runs(DAG_ID)
            return True if next_run > dt.datetime.now(dt.UTC) and all(r["end_date"] for r in runs) else None

        server.wait("the scheduled run of the latest month", latest_month_handled, 300)
        for run in server.dag_runs(DAG_ID):
            assert run["state"] == "success", server.describe_run(DAG_ID, run["dag_run_id"])
        yield server


@pytest.fixture
def use_config(airflow: AirflowServer) -> Iterator[Any]:
    """Point the ``applier_config`` Variable at a test's configuration file; remove it afterwards."""

    def use(config_file: Path) -> Config:
        airflow.set_variable(CONFIG_VARIABLE, str(config_file))
        return load_config(config_file)

    yield use
    airflow.delete_variable(CONFIG_VARIABLE)


def canonical_target(config: Config, intermediate: Path) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """Every table's columns and rows in the reference's canonical form (NaN and decimals compare by value).

    Types come from the table definitions of the whole stream, by column name,
    so that a table still lacking a column added later reads too.
    """
    assert config.target.path is not None
    target = DeltaTarget(config.target.path, config.configuration_name)
    out: dict[str, tuple[list[str], list[list[Any]]]] = {}
    for name, ref in reference_apply(intermediate).items():
        table = target.read_arrow(name)
        if table is None:
            out[name] = ([], [])
            continue
        types = dict(zip(ref.columns, ref.types, strict=True))
        columns = [(column, types[column]) for column in table.column_names]
        out[name] = (table.column_names, canonical_rows(columns, [list(r.values()) for r in table.to_pylist()]))
    return out


def positions(checkpoint: Checkpoint) -> tuple[Any, ...]:
    """Where a checkpoint stands (all but the time it was written)."""
    return (
        checkpoint.cycle_id,
        checkpoint.applied_seq,
        checkpoint.applied_commit_lsn,
        checkpoint.restart_seq,
        checkpoint.last_lsn,
        checkpoint.row_counts,
    )


def delta_versions(config: Config) -> dict[Path, int]:
    """The current version of every Delta table under the target folder."""
    assert config.target.path is not None
    return {log.parent: DeltaTable(log.parent).version() for log in config.target.path.glob("*/*/_delta_log")}


def restore_tables(config: Config, versions: dict[Path, int]) -> list[str]:
    """Bring every table back to ``versions`` (``DeltaTable.restore``); drop tables that did not exist then."""
    changed = []
    for path, version in delta_versions(config).items():
        if path not in versions:
            shutil.rmtree(path)
        elif version != versions[path]:
            DeltaTable(path).restore(versions[path])
        else:
            continue
        changed.append(f"{path.parent.name}.{path.name}")
    return sorted(changed)


def test_an_invalid_param_is_refused_by_the_rest_api_and_creates_no_run(
    airflow: AirflowServer, use_config: Any, tmp_path: Path
) -> None:
    intermediate = tmp_path / "in"
    generate_workload(intermediate, seed=21, transactions=20, file_size_mb=0.02, profile="demo")
    config = use_config(write_config(tmp_path, intermediate))
    runs_before = [r["dag_run_id"] for r in airflow.dag_runs(DAG_ID)]
    refused = {
        "max_cycles": -1,
        "process_intermediate_size_per_job": "big",
        "buffer_size_for_split_records": 0,
        "plan_only": "yes",
    }
    for param, value in refused.items():
        status, answer = airflow.trigger(DAG_ID, {param: value})
        assert status == 400, f"{param}={value!r} was not refused: {status} {answer}"
        assert f"param {param}" in answer["detail"], answer
    assert [r["dag_run_id"] for r in airflow.dag_runs(DAG_ID)] == runs_before
    assert not config.work_dir.exists(), "no task ran"


def test_rest_trigger_applies_one_cycle_of_the_size_the_params_ask_for(
    airflow: AirflowServer, use_config: Any, tmp_path: Path
) -> None:
    intermediate = tmp_path / "in"
    workload = generate_workload(intermediate, seed=22, transactions=60, file_size_mb=0.02, profile="demo")
    # The file says: every available pair in one cycle, as many cycles as it takes.
    config = use_config(write_config(tmp_path, intermediate, cycle_mib=0))
    limit_mib = 0.05
    sizes = [p.size for p in list_pairs(intermediate).pairs]
    fitting = next(n for n in range(1, len(sizes) + 1) if n == len(sizes) or sum(sizes[: n + 1]) > limit_mib * MIB)
    assert fitting < workload.pairs - 1, "the workload must hold more than one cycle of that size"

    status, run = airflow.trigger(DAG_ID, {"max_cycles": 1, "process_intermediate_size_per_job": limit_mib})
    assert status == 200, run
    airflow.wait_for_run(DAG_ID, run["dag_run_id"])

    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]
    assert [(r["cycle_id"], r["seqs"]) for r in reports] == [(1, list(range(1, fitting + 1)))]
    assert reports[0]["bytes"] <= limit_mib * MIB
    checkpoint = CheckpointStore(config.work_dir).load()
    assert (checkpoint.cycle_id, checkpoint.applied_seq) == (1, fitting)
    assert_target_equals_reference(config, intermediate, through_seq=fitting)

    figures = airflow.xcom(DAG_ID, run["dag_run_id"], "report")
    assert (figures["cycles"], figures["first_seq"], figures["last_seq"]) == (1, 1, fitting)
    assert figures["validation"] == "passed"
    records = RunLedger(config.work_dir).records()
    assert [(r.run_key, r.status, [c.seqs for c in r.cycles]) for r in records] == [
        (figures["run_key"], "finished", [list(range(1, fitting + 1))])
    ]


def test_backfill_replays_the_recorded_cycles_onto_a_restored_target(
    airflow: AirflowServer, use_config: Any, tmp_path: Path
) -> None:
    now = dt.datetime.now(dt.UTC)
    months = [month_start(now, 2), month_start(now, 1)]
    start_date = dt.datetime.fromisoformat(airflow.api("GET", f"/api/v2/dags/{DAG_ID}/details")["start_date"])
    assert months[0] >= start_date, f"the DAG starts {start_date}: no two past months to backfill before {now}"
    intermediate = tmp_path / "in"
    generate_workload(intermediate, seed=23, transactions=60, file_size_mb=0.02, profile="demo")
    config = use_config(write_config(tmp_path, intermediate, cycle_mib=0.05))

    # Two runs of two cycles each, as the schedule would have made them.
    after_first: dict[Path, int] = {}
    for month in months:
        status, run = airflow.trigger(DAG_ID, {"max_cycles": 2, "skip_validation": True}, logical_date=month)
        assert status == 200, run
        airflow.wait_for_run(DAG_ID, run["dag_run_id"])
        after_first = after_first or delta_versions(config)
    uninterrupted = canonical_target(config, intermediate)
    checkpoint = CheckpointStore(config.work_dir).load()
    assert checkpoint.cycle_id == 4

    restored = restore_tables(config, after_first)
    assert restored, "the second run changed some table"
    assert canonical_target(config, intermediate) != uninterrupted

    airflow.cli(
        "backfill",
        "create",
        "--dag-id",
        DAG_ID,
        "--from-date",
        iso(months[0]),
        "--to-date",
        iso(months[-1]),
        "--reprocess-behavior",
        "completed",
        "--max-active-runs",
        "1",
        took_effect=lambda: bool(airflow.api("GET", f"/api/v2/backfills?dag_id={DAG_ID}")["backfills"]),
    )

    def backfill_done() -> dict[str, Any] | None:
        backfills = airflow.api("GET", f"/api/v2/backfills?dag_id={DAG_ID}")["backfills"]
        return dict(backfills[0]) if len(backfills) == 1 and backfills[0]["completed_at"] else None

    airflow.wait("the backfill's end", backfill_done, 900)
    runs = {dt.datetime.fromisoformat(r["logical_date"]): r for r in airflow.dag_runs(DAG_ID) if r["logical_date"]}
    for month in months:
        run = runs[month]
        assert (run["run_type"], run["state"]) == ("backfill", "success"), airflow.describe_run(
            DAG_ID, run["dag_run_id"]
        )

    assert canonical_target(config, intermediate) == uninterrupted
    assert positions(CheckpointStore(config.work_dir).load()) == positions(checkpoint)
    assert_target_equals_reference(config, intermediate, through_seq=checkpoint.applied_seq)
    ledger = {r.run_key: r for r in RunLedger(config.work_dir).records()}
    first, second = (ledger[run_key(month, run_id="")] for month in months)
    assert (first.mode, second.mode) == ("replay", "replay")
    assert {state for c in first.cycles for state in c.tables.values()} == {"verified"}
    reapplied = {t for c in second.cycles for t, state in c.tables.items() if state == "reapplied"}
    assert reapplied == set(restored)
