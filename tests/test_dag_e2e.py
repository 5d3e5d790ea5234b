"""The apply DAG end to end with ``dag.test()``: real Airflow (SQLite), spark-submit, Delta, Great Expectations."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_support import DAGS_FOLDER, airflow_home  # noqa: F401  (airflow_home: session fixture)
from applier.config import Config, load_config
from applier.engine.checkpoint import CheckpointStore
from applier.engine.ledger import RunLedger
from applier.generate import generate_workload
from engine_support import assert_target_equals_reference
from webhook_support import Webhook

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

FIRST = dt.datetime(2026, 1, 1, 0, 5, tzinfo=dt.UTC)
DAMAGE = dt.datetime(2026, 2, 1, 0, 5, tzinfo=dt.UTC)
REPLAY = dt.datetime(2026, 3, 1, 0, 5, tzinfo=dt.UTC)
LATE = dt.datetime(2026, 4, 1, 0, 5, tzinfo=dt.UTC)
BROKEN = dt.datetime(2026, 5, 1, 0, 5, tzinfo=dt.UTC)
TASKS = ("plan", "apply", "validate", "report", "check_lag")
# Every param, as the trigger form sends them. In-process runs (dag.test) share the
# DAG's Param objects between runs, so a param left out would keep the last run's value.
PARAMS = {
    "max_cycles": None,
    "process_intermediate_size_per_job": None,
    "buffer_size_for_split_records": None,
    "plan_only": False,
    "skip_validation": False,
}


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 50 small pairs: a few cycles at 0.3 MiB each."""
    folder = tmp_path_factory.mktemp("workload")
    generate_workload(folder, seed=3, transactions=150, file_size_mb=0.03, profile="demo")
    return folder


@pytest.fixture(scope="module")
def applier_dag(airflow_home: Path, spark: Any) -> Any:  # noqa: F811
    """The DAG as the DAG processor parses it; ``spark`` is running so validation joins it."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=DAGS_FOLDER)
    assert bag.import_errors == {}
    return bag.get_dag("applier")


def write_config(folder: Path, intermediate: Path, max_lag_seconds: float | None = None) -> Path:
    path = folder / "applier.yaml"
    path.write_text(
        "configuration_name: e2e\n"
        f"intermediate_dir: {intermediate}\n"
        f"output_dir: {folder / 'out'}\n"
        f"target:\n  path: {folder / 'target'}\n"
        "spark:\n  master: local[2]\n"
        + (f"alert:\n  max_lag_seconds: {max_lag_seconds}\n" if max_lag_seconds is not None else "")
    )
    return path


def run_dag(
    dag: Any,
    config_path: Path,
    logical_date: dt.datetime,
    webhook: Webhook | None = None,
    env: dict[str, str | None] | None = None,
    **params: Any,
) -> Any:
    """One DAG run on ``config_path`` (named by APPLIER_CONFIG, as users do) with trigger-form params.

    ``webhook`` is the ``applier_alert`` connection for the run; ``env`` sets (or, with None, unsets) more variables.
    """
    mp = pytest.MonkeyPatch()
    mp.setenv("APPLIER_CONFIG", str(config_path))
    if webhook is not None:
        mp.setenv("AIRFLOW_CONN_APPLIER_ALERT", webhook.connection())
    for name, value in (env or {}).items():
        if value is None:
            mp.delenv(name, raising=False)
        else:
            mp.setenv(name, value)
    try:
        return dag.test(logical_date=logical_date, run_conf={**PARAMS, **params})
    finally:
        mp.undo()


def states(dag_run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


def xcom(dag_run: Any, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = XComModel.get_many(run_id=dag_run.run_id, dag_ids="applier", task_ids=task_id, key="return_value")
        row = session.scalars(query).one()
        return XComModel.deserialize_value(row)


def asset_events(dag_run: Any) -> dict[str, dict[str, Any]]:
    """The asset events the run emitted, by asset URI, with their extra."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(select(AssetEvent).where(AssetEvent.source_run_id == dag_run.run_id)).all()
        return {event.asset.uri: dict(event.extra) for event in events}


@pytest.fixture(scope="module")
def quiet_webhook() -> Iterator[Webhook]:
    """The alert webhook of the caught-up runs (the first run, the one with nothing new): it must hear nothing."""
    with Webhook() as hook:
        yield hook


@pytest.fixture(scope="module")
def first_run(
    applier_dag: Any, workload: Path, tmp_path_factory: pytest.TempPathFactory, quiet_webhook: Webhook
) -> tuple[Config, Any]:
    """The whole workload applied by one DAG run, in 0.3 MiB cycles (a trigger-form param).

    Its lag threshold is 1 s, although the workload's source times are months old: once caught up, nothing waits.
    """
    config_path = write_config(tmp_path_factory.mktemp("first"), workload, max_lag_seconds=1)
    dag_run = run_dag(applier_dag, config_path, FIRST, quiet_webhook, process_intermediate_size_per_job=0.3)
    return load_config(config_path), dag_run


def test_a_dag_run_applies_the_workload_like_the_reference_applier(
    first_run: tuple[Config, Any], workload: Path
) -> None:
    config, dag_run = first_run
    assert states(dag_run) == dict.fromkeys(TASKS, "success")
    assert str(dag_run.state) == "success"
    assert_target_equals_reference(config, workload)


def test_the_plan_param_and_the_run_ledger_agree(first_run: tuple[Config, Any], workload: Path) -> None:
    config, dag_run = first_run
    plan = xcom(dag_run, "plan")
    pairs = len(list(workload.glob("*.trn")))
    assert (plan["run_key"], plan["applied_seq"], plan["replay"]) == ("20260101T000500Z", 0, False)
    assert plan["pairs"] == pairs
    assert len(plan["cycles"]) > 1, "0.3 MiB per cycle (the param) makes several cycles; the file says 0 (one)"
    record = RunLedger(config.work_dir).get("20260101T000500Z")
    assert record is not None and record.status == "finished"
    assert [(c.seqs[0], c.seqs[-1]) for c in record.cycles] == [(c["first_seq"], c["last_seq"]) for c in plan["cycles"]]


def test_validation_passed_and_its_results_are_kept(first_run: tuple[Config, Any]) -> None:
    config, dag_run = first_run
    validation = xcom(dag_run, "validate")
    assert validation["success"] is True
    assert sorted(validation["tables"]) == sorted(load_tables(config))
    assert all(t["success"] and t["expectations"] > 0 for t in validation["tables"].values())
    assert Path(validation["json_path"]).is_file()
    assert Path(validation["data_docs_path"]).is_file()


def load_tables(config: Config) -> list[str]:
    from applier.engine.checkpoint import CheckpointStore

    return sorted(CheckpointStore(config.work_dir).load().tables)


def test_the_report_gives_the_figures_and_an_asset_event_per_changed_table(first_run: tuple[Config, Any]) -> None:
    config, dag_run = first_run
    report = xcom(dag_run, "report")
    record = RunLedger(config.work_dir).get("20260101T000500Z")
    assert record is not None
    assert report["cycle_ids"] == [c.cycle_id for c in record.cycles]
    assert report["validation"] == "passed"
    assert report["changed_tables"] == load_tables(config)
    assert config.target.path is not None
    uris = {t: (config.target.path / t.replace(".", "/")).as_uri() for t in load_tables(config)}
    assert report["assets"] == uris
    events = asset_events(dag_run)
    assert sorted(events) == sorted(uris.values())
    orders = events[uris["shop.orders"]]
    assert (orders["run_key"], orders["table"], orders["net_rows"]) == (
        "20260101T000500Z",
        "shop.orders",
        report["net_rows"]["shop.orders"],
    )


def test_a_caught_up_run_passes_the_lag_check_however_old_its_last_commit(
    first_run: tuple[Config, Any], quiet_webhook: Webhook
) -> None:
    _, dag_run = first_run
    check = xcom(dag_run, "check_lag")
    assert (check["configuration"], check["max_lag_seconds"], check["over"]) == ("e2e", 1.0, False)
    assert (check["lag_seconds"], check["oldest_unapplied_seq"], check["backlog_pairs"]) == (0.0, None, 0)
    assert check["last_applied_seconds"] > 86400, "the workload's source times are months old: an idle source"
    assert quiet_webhook.received == []


def test_a_run_with_nothing_new_skips_apply_validate_and_report_and_still_checks_the_lag(
    first_run: tuple[Config, Any], applier_dag: Any, quiet_webhook: Webhook
) -> None:
    config, _ = first_run
    config_path = Path(config.work_dir).parents[1] / "applier.yaml"
    dag_run = run_dag(applier_dag, config_path, FIRST + dt.timedelta(minutes=5), quiet_webhook)
    assert states(dag_run) == {
        "plan": "success",
        "apply": "skipped",
        "validate": "skipped",
        "report": "skipped",
        "check_lag": "success",
    }
    assert xcom(dag_run, "plan")["nothing_new"] is True
    check = xcom(dag_run, "check_lag")
    assert (check["lag_seconds"], check["backlog_pairs"], check["over"]) == (0.0, 0, False)
    assert quiet_webhook.received == []


def test_a_misspelt_conf_key_fails_the_plan_naming_it(first_run: tuple[Config, Any], applier_dag: Any) -> None:
    config, _ = first_run
    config_path = Path(config.work_dir).parents[1] / "applier.yaml"
    dag_run = run_dag(applier_dag, config_path, FIRST + dt.timedelta(minutes=7), max_cyclez=1)
    assert states(dag_run)["plan"] == "failed"
    assert states(dag_run)["apply"] in ("skipped", "upstream_failed")  # dag.test() marks what it never ran


def deliver(dats: list[Path], folder: Path) -> None:
    for dat in dats:
        shutil.copy(dat, folder)
        shutil.copy(dat.with_suffix(".trn"), folder)


def test_re_running_a_logical_date_replays_its_recorded_cycles_and_changes_nothing(
    applier_dag: Any, workload: Path, tmp_path: Path
) -> None:
    intermediate = tmp_path / "in"
    intermediate.mkdir()
    deliver(sorted(workload.glob("*.dat"))[:12], intermediate)
    config_path = write_config(tmp_path, intermediate)
    original = run_dag(applier_dag, config_path, REPLAY, skip_validation=True, process_intermediate_size_per_job=0.1)
    assert states(original)["apply"] == "success"
    record = RunLedger(tmp_path / "out" / "e2e").get("20260301T000500Z")
    assert record is not None and record.status == "finished"
    recorded = [c.cycle_id for c in record.cycles]
    assert len(recorded) > 1

    # The same logical date again, as a backfill with --reprocess-behavior completed runs it.
    again = run_dag(applier_dag, config_path, REPLAY)
    assert states(again) == dict.fromkeys(TASKS, "success")
    plan = xcom(again, "plan")
    assert (plan["replay"], plan["replay_cycles"], plan["cycles"]) == (True, recorded, [])
    report = xcom(again, "report")
    assert (report["mode"], report["cycle_ids"], report["validation"]) == ("replay", recorded, "passed")
    assert report["changed_tables"] == [], "the target already held every cycle: verified, not changed"
    assert asset_events(again) == {}
    assert_target_equals_reference(load_config(config_path), intermediate)


def tables_in_pairs(pairs: list[Path]) -> set[str]:
    return {t for dat in pairs for t in pq.read_table(dat, columns=["table"]).column("table").to_pylist()}


def test_a_damaged_table_fails_validation_naming_it(
    applier_dag: Any, workload: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    dats = sorted(workload.glob("*.dat"))
    early, late = dats[:-5], dats[-5:]
    intermediate = tmp_path / "in"
    intermediate.mkdir()
    deliver(early, intermediate)
    config_path = write_config(tmp_path, intermediate)
    before = run_dag(applier_dag, config_path, DAMAGE, skip_validation=True)
    assert states(before) == {
        "plan": "success",
        "apply": "success",
        "validate": "skipped",
        "report": "success",
        "check_lag": "success",
    }
    assert xcom(before, "report")["validation"] == "skipped"

    damaged = "shop.orders"
    assert damaged in tables_in_pairs(late), "the next run must change the damaged table"
    table_path = str(tmp_path / "target" / "shop" / "orders")
    write_deltalake(table_path, DeltaTable(table_path).to_pyarrow_table().slice(0, 1), mode="append")
    deliver(late, intermediate)
    capfd.readouterr()
    after = run_dag(applier_dag, config_path, DAMAGE + dt.timedelta(minutes=5))
    output = capfd.readouterr()

    assert states(after) == {
        "plan": "success",
        "apply": "success",
        "validate": "failed",
        "report": "upstream_failed",
        "check_lag": "success",
    }
    assert str(after.state) == "failed", "a lag check that passed does not hide the failed validation"
    failure = next(line for line in (output.out + output.err).splitlines() if "validation failed:" in line)
    assert f"{damaged}: expect_column_values_to_be_unique" in failure or f"{damaged}: expect_compound" in failure
    assert "expect_table_row_count_to_equal" in failure


def oldest_waiting_commit(intermediate: Path, applied_seq: int) -> tuple[int, str]:
    """The pair and source time of the first commit event after pair ``applied_seq``, read from the .trn files."""
    for trn in sorted(intermediate.glob("*.trn")):
        if int(trn.name[:12]) > applied_seq:
            for line in trn.read_text().splitlines()[1:]:
                event = json.loads(line)
                if event["record"] == "commit":
                    return int(trn.name[:12]), event["ts"]
    raise AssertionError(f"no commit after pair {applied_seq}")


def assert_alert_tells_the_files(payload: dict[str, Any], intermediate: Path, applied_seq: int, dag_run: Any) -> None:
    """The posted alert names the configuration, the threshold, and the oldest waiting commit the files hold."""
    seq, ts = oldest_waiting_commit(intermediate, applied_seq)
    waiting = [trn for trn in intermediate.glob("*.trn") if int(trn.name[:12]) > applied_seq]
    checked_at = dt.datetime.fromisoformat(payload["checked_at"])
    age = (checked_at - dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))).total_seconds()
    assert (payload["alert"], payload["configuration"], payload["max_lag_seconds"]) == ("replication_lag", "e2e", 1.0)
    assert (payload["oldest_unapplied_seq"], payload["oldest_unapplied_commit_ts"]) == (seq, ts)
    assert payload["lag_seconds"] == pytest.approx(age, abs=0.001) and payload["over"] is True
    assert payload["backlog_pairs"] == len(waiting)
    assert (payload["dag_id"], payload["task_id"], payload["run_id"]) == ("applier", "check_lag", dag_run.run_id)
    assert payload["text"].startswith(
        f"lag alert: configuration e2e: oldest unapplied commit (pair {seq}, source time {ts}) is "
    )
    assert "over alert.max_lag_seconds 1 s" in payload["text"] and "\n" not in payload["text"]


def test_a_run_left_behind_fails_the_lag_check_posts_the_alert_and_keeps_its_asset_events(
    applier_dag: Any, workload: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    intermediate = tmp_path / "in"
    intermediate.mkdir()
    deliver(sorted(workload.glob("*.dat"))[:12], intermediate)
    config_path = write_config(tmp_path, intermediate, max_lag_seconds=1)
    capfd.readouterr()
    with Webhook() as hook:
        # One small cycle of several: the rest, committed months ago at the source, waits.
        dag_run = run_dag(
            applier_dag,
            config_path,
            LATE,
            hook,
            skip_validation=True,
            max_cycles=1,
            process_intermediate_size_per_job=0.1,
        )
    output = capfd.readouterr()

    assert states(dag_run) == {
        "plan": "success",
        "apply": "success",
        "validate": "skipped",
        "report": "success",
        "check_lag": "failed",
    }
    assert str(dag_run.state) == "failed"
    report = xcom(dag_run, "report")
    assert report["assets"], "the cycle changed tables"
    assert sorted(asset_events(dag_run)) == sorted(report["assets"].values()), "the alert costs no asset event"
    applied_seq = CheckpointStore(load_config(config_path).work_dir).load().applied_seq
    assert 0 < applied_seq < 12
    (payload,) = hook.received
    assert_alert_tells_the_files(payload, intermediate, applied_seq, dag_run)
    assert any(line.rstrip().endswith(payload["text"]) for line in (output.out + output.err).splitlines())


def test_a_failed_apply_still_checks_the_lag_and_alerts(
    applier_dag: Any, workload: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    intermediate = tmp_path / "in"
    intermediate.mkdir()
    deliver(sorted(workload.glob("*.dat"))[:3], intermediate)
    config_path = write_config(tmp_path, intermediate, max_lag_seconds=1)
    capfd.readouterr()
    # The apply task fails without a retry when its Spark connection is not defined; a refusing webhook is logged.
    with Webhook(status=500) as hook:
        dag_run = run_dag(applier_dag, config_path, BROKEN, hook, env={"AIRFLOW_CONN_SPARK_DEFAULT": None})
    captured = capfd.readouterr()
    output = captured.out + captured.err

    assert states(dag_run) == {
        "plan": "success",
        "apply": "failed",
        "validate": "upstream_failed",
        "report": "upstream_failed",
        "check_lag": "failed",
    }
    (payload,) = hook.received
    assert_alert_tells_the_files(payload, intermediate, 0, dag_run)
    assert payload["last_applied_commit_ts"] is None and payload["backlog_pairs"] == 3
    assert "connection spark_default is not defined" in output
    assert "refused the alert: HTTP 500" in output
