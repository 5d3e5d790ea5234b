"""The apply and extract DAGs parse cleanly, look nothing up while parsing, and declare what the README says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_support import DAGS_FOLDER, airflow_env, airflow_home  # noqa: F401  (airflow_home: session fixture)
from applier.engine.session import driver_java_options

pytestmark = pytest.mark.airflow

# Parses a DAG folder in a fresh interpreter in which every Variable and
# Connection look-up records itself and raises, then prints what it saw.
PARSE_GUARDED = r"""
import json, sys

from airflow.models.connection import Connection as CoreConnection
from airflow.models.variable import Variable as CoreVariable
from airflow.sdk.bases.hook import BaseHook
from airflow.sdk.definitions.connection import Connection
from airflow.sdk.definitions.variable import Variable

lookups = []

def refusing(what):
    def lookup(cls, *args, **kwargs):
        lookups.append(f"{what}{args}")
        raise RuntimeError(f"{what} looked up while parsing")
    return classmethod(lookup)

Variable.get = refusing("Variable.get")
CoreVariable.get = refusing("Variable.get")
Connection.get = refusing("Connection.get")
BaseHook.get_connection = refusing("BaseHook.get_connection")
CoreConnection.get_connection_from_secrets = refusing("Connection.get_connection_from_secrets")

from airflow.dag_processing.dagbag import DagBag

bag = DagBag(dag_folder=sys.argv[1])
heavy = sorted(m for m in ("pyspark", "pyarrow", "deltalake", "great_expectations") if m in sys.modules)
schedules = {dag_id: str(dag.schedule) for dag_id, dag in bag.dags.items()}
print("PARSED " + json.dumps({"errors": bag.import_errors, "schedules": schedules, "lookups": lookups, "heavy": heavy}))
"""

LOOKING_UP_DAG = """
from datetime import datetime, UTC
from airflow.sdk import DAG, Variable
with DAG(dag_id="looks_up", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)):
    Variable.get("applier_config")
"""


def parse_guarded(home: Path, dag_folder: Path, **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PARSE_GUARDED, str(dag_folder)],
        env={**airflow_env(home), "PATH": str(Path(sys.executable).parent), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("PARSED "))
    parsed: dict[str, Any] = json.loads(line.removeprefix("PARSED "))
    return parsed


@pytest.fixture(scope="module")
def bag(airflow_home: Path) -> Any:  # noqa: F811
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=DAGS_FOLDER)
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == ["applier", "applier_extract", "applier_materialize"]
    return bag


@pytest.fixture(scope="module")
def dag(bag: Any) -> Any:
    return bag.get_dag("applier")


@pytest.fixture(scope="module")
def extract_dag(bag: Any) -> Any:
    return bag.get_dag("applier_extract")


def test_the_dag_parses_without_lookups_or_heavy_imports(airflow_home: Path) -> None:  # noqa: F811
    parsed = parse_guarded(airflow_home, DAGS_FOLDER)
    schedules = {"applier": "*/5 * * * *", "applier_extract": "* * * * *", "applier_materialize": "None"}
    assert parsed == {"errors": {}, "schedules": schedules, "lookups": [], "heavy": []}


def test_the_parse_guard_catches_a_lookup_at_parse_time(airflow_home: Path, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "looks_up.py").write_text(LOOKING_UP_DAG)
    parsed = parse_guarded(airflow_home, tmp_path)
    assert parsed["lookups"] == ["Variable.get('applier_config',)"]
    assert list(parsed["errors"]) == [str(tmp_path / "looks_up.py")]
    assert "Variable.get looked up while parsing" in parsed["errors"][str(tmp_path / "looks_up.py")]


def test_the_schedule_comes_from_the_environment(airflow_home: Path) -> None:  # noqa: F811
    hourly = parse_guarded(airflow_home, DAGS_FOLDER, APPLIER_SCHEDULE="@hourly", APPLIER_EXTRACT_SCHEDULE="none")
    assert hourly["schedules"] == {"applier": "@hourly", "applier_extract": "None", "applier_materialize": "None"}
    none = parse_guarded(airflow_home, DAGS_FOLDER, APPLIER_SCHEDULE="none", APPLIER_EXTRACT_SCHEDULE="*/2 * * * *")
    assert none["schedules"] == {"applier": "None", "applier_extract": "*/2 * * * *", "applier_materialize": "None"}


def test_runs_are_serial_without_catchup_and_retried(dag: Any) -> None:
    assert dag.max_active_runs == 1
    assert dag.catchup is False
    assert dag.default_args["retries"] == 2
    assert all(task.retries == 2 for task in dag.tasks)
    assert set(dag.tags) == {"applier", "cdc", "delta"}
    assert "### The Applier" in dag.doc_md


def test_tasks_run_plan_apply_validate_report(dag: Any) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk import AssetAlias

    order = [t.task_id for t in dag.topological_sort()]
    assert sorted(order) == ["apply", "check_lag", "plan", "report", "validate"]
    assert order[:2] == ["plan", "apply"] and order.index("validate") < order.index("report")
    assert dag.get_task("plan").downstream_task_ids == {"apply"}
    assert dag.get_task("apply").downstream_task_ids == {"validate", "check_lag"}
    assert dag.get_task("validate").downstream_task_ids == {"report"}
    apply = dag.get_task("apply")
    assert isinstance(apply, SparkSubmitOperator)
    assert apply.spark_conn_id == "spark_default"
    assert apply.application == str(DAGS_FOLDER.parent / "jobs" / "apply.py")
    # The driver JVM starts before the job runs: its options must come with the submission.
    driver = apply.conf["spark.driver.extraJavaOptions"]
    assert driver.startswith("-Duser.timezone=UTC -XX:+UseParallelGC")
    assert driver == driver_java_options()  # and the class archive setup made (tests/test_jvm_archive.py)
    assert apply.conf["spark.executor.extraJavaOptions"] == "-Duser.timezone=UTC -XX:+UseParallelGC"
    assert dag.get_task("report").trigger_rule == "none_failed"
    assert dag.get_task("report").outlets == [AssetAlias("applier_target_tables")]


def test_the_lag_check_runs_every_run_beside_validate_and_report_and_notifies(dag: Any) -> None:
    from applier_airflow.base import skipped_downstream
    from applier_airflow.lag import ApplierLagOperator
    from applier_airflow.notifier import ApplierWebhookNotifier

    check = dag.get_task("check_lag")
    assert isinstance(check, ApplierLagOperator)
    assert check.upstream_task_ids == {"apply"} and check.downstream_task_ids == set()
    # Runs once apply is done, whatever became of it (skipped by plan, failed, skipped for the run lock).
    assert check.trigger_rule == "all_done"
    # A skip by plan or apply leaves it to that rule.
    assert sorted(t.task_id for t in skipped_downstream(dag.get_task("plan"))) == ["apply", "report", "validate"]
    assert sorted(t.task_id for t in skipped_downstream(dag.get_task("apply"))) == ["report", "validate"]
    # Both are leaves: a failed apply or validation fails the run whatever the check finds.
    assert {t.task_id for t in dag.leaves} == {"report", "check_lag"}
    (notifier,) = check.on_failure_callback
    assert isinstance(notifier, ApplierWebhookNotifier) and notifier.conn_id == "applier_alert"


def _serialized_params(dag: Any) -> Any:
    """The params as the scheduler and the REST API validate a trigger's conf against them."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag)).params


def test_params_default_to_no_override(dag: Any) -> None:
    assert _serialized_params(dag).validate() == {
        "max_cycles": None,
        "process_intermediate_size_per_job": None,
        "buffer_size_for_split_records": None,
        "plan_only": False,
        "skip_validation": False,
    }


GOOD_CONF = {
    "max_cycles": 0,
    "process_intermediate_size_per_job": 0.5,
    "buffer_size_for_split_records": 1,
    "plan_only": True,
    "skip_validation": True,
}
BAD_CONF = [
    {"max_cycles": -1},
    {"max_cycles": 1.5},
    {"max_cycles": "3"},
    {"process_intermediate_size_per_job": -0.1},
    {"process_intermediate_size_per_job": "1"},
    {"buffer_size_for_split_records": 0},
    {"buffer_size_for_split_records": 2.5},
    {"plan_only": "yes"},
    {"skip_validation": 1},
]


def test_params_accept_good_values(dag: Any) -> None:
    assert _serialized_params(dag).deep_merge(GOOD_CONF).validate() == GOOD_CONF


@pytest.mark.parametrize("conf", BAD_CONF, ids=lambda c: "-".join(f"{k}={v!r}" for k, v in c.items()))
def test_params_refuse_bad_values_naming_the_param(dag: Any, conf: dict[str, Any]) -> None:
    from airflow.exceptions import ParamValidationError

    (name,) = conf
    with pytest.raises(ParamValidationError, match=f"Invalid input for param {name}"):
        _serialized_params(dag).deep_merge(conf).validate()


def test_the_submit_operator_keeps_a_users_jvm_options_and_other_conf() -> None:
    from applier_airflow.operators import ApplierSubmitOperator

    conf = {"spark.driver.extraJavaOptions": "-Xss4m", "spark.sql.shuffle.partitions": "4"}
    submit = ApplierSubmitOperator(task_id="apply", conf=conf)
    assert submit.conf == {
        "spark.driver.extraJavaOptions": "-Xss4m",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC -XX:+UseParallelGC",
        "spark.sql.shuffle.partitions": "4",
    }


def test_the_extract_dag_runs_one_serial_batch_a_minute(extract_dag: Any) -> None:
    from applier_airflow.operators import ApplierExtractOperator

    assert (extract_dag.max_active_runs, extract_dag.catchup) == (1, False)
    assert [type(t) for t in extract_dag.tasks] == [ApplierExtractOperator]
    assert extract_dag.get_task("extract").retries == 1
    assert set(extract_dag.tags) == {"applier", "cdc", "extract"}
    assert "### Extract" in extract_dag.doc_md
    assert _serialized_params(extract_dag).validate() == {"max_wal_mb": None}
    assert _serialized_params(extract_dag).deep_merge({"max_wal_mb": 0.5}).validate() == {"max_wal_mb": 0.5}


@pytest.mark.parametrize("value", [0, -1, "8"])
def test_the_extract_dag_refuses_a_bad_max_wal_mb(extract_dag: Any, value: Any) -> None:
    from airflow.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match="Invalid input for param max_wal_mb"):
        _serialized_params(extract_dag).deep_merge({"max_wal_mb": value}).validate()


def test_the_materialize_dag_is_triggered_with_a_table_a_mode_and_chunk_rows(bag: Any) -> None:
    from airflow.exceptions import ParamValidationError

    from applier_airflow.materialize import ApplierSubscribeOperator

    dag = bag.get_dag("applier_materialize")
    assert (dag.max_active_runs, dag.catchup, type(dag.timetable).__name__) == (1, False, "NullTimetable")
    assert [type(t) for t in dag.tasks] == [ApplierSubscribeOperator] and dag.get_task("subscribe").retries == 0
    assert "### Materialize" in dag.doc_md
    params = _serialized_params(dag)
    chosen = {"table": "public.orders", "mode": "nonatomic", "chunk_rows": 5000}
    assert params.deep_merge(chosen).validate() == chosen
    for bad in ({"table": "orders"}, {"mode": "fast"}, {"chunk_rows": 0}):
        with pytest.raises(ParamValidationError, match=f"Invalid input for param {next(iter(bad))}"):
            _serialized_params(dag).deep_merge(bad).validate()


def test_the_validate_task_links_the_data_docs_the_view_serves(dag: Any) -> None:
    from applier_airflow.links import DataDocsLink

    (link,) = dag.get_task("validate").operator_extra_links
    assert isinstance(link, DataDocsLink) and link.name == "Data Docs"
    assert link.get_link(dag.get_task("validate"), ti_key=None).endswith("/applier/docs/index.html")
