"""The extract DAG end to end with ``dag.test()``: real Airflow (SQLite), a real bounded batch from a real source."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from airflow_support import DAGS_FOLDER, airflow_home  # noqa: F401  (airflow_home: session fixture)
from applier.engine.runlock import RunLock
from extract_support import execute, extract_config, pair_rows, prepare

pytestmark = [pytest.mark.airflow, pytest.mark.postgres]
Source = tuple[str, str, str]
FIRST = dt.datetime(2026, 1, 1, 0, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def extract_dag(airflow_home: Path) -> Any:  # noqa: F811
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=DAGS_FOLDER)
    assert bag.import_errors == {}
    return bag.get_dag("applier_extract")


@pytest.fixture(scope="module")
def materialize_dag(airflow_home: Path) -> Any:  # noqa: F811
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=DAGS_FOLDER).get_dag("applier_materialize")


def run_dag(dag: Any, config_path: Path, logical_date: dt.datetime, conf: dict[str, Any] | None = None) -> Any:
    """One run on ``config_path``, named by APPLIER_CONFIG as users do."""
    mp = pytest.MonkeyPatch()
    mp.setenv("APPLIER_CONFIG", str(config_path))
    try:
        return dag.test(logical_date=logical_date, run_conf=conf or {"max_wal_mb": None})
    finally:
        mp.undo()


def states(dag_run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


def xcom(dag_run: Any, dag_id: str = "applier_extract", task_id: str = "extract") -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        query = XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_id, task_ids=task_id)
        return XComModel.deserialize_value(session.scalars(query).one())


def config_file(tmp_path: Path, source: Source, extra: str = "") -> Path:
    """The configuration file the DAGs find through APPLIER_CONFIG, on the test's source (``extra``: source lines)."""
    url, slot, publication = source
    path = tmp_path / "applier.yaml"
    path.write_text(
        f"configuration_name: ext\nintermediate_dir: {tmp_path / 'pairs'}\noutput_dir: {tmp_path / 'out'}\n"
        f"target:\n  path: {tmp_path / 'target'}\nsource:\n  url: '{url}'\n  slot: {slot}\n"
        f"  publication: {publication}\n{extra}"
    )
    return path


def test_a_run_extracts_a_bounded_batch_and_is_skipped_while_another_extractor_runs(
    extract_dag: Any, tmp_path: Path, logical_source: Source
) -> None:
    config_path = config_file(tmp_path, logical_source)
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    execute(config, "INSERT INTO t VALUES (1, 'a'), (2, 'b')", "UPDATE t SET v = 'c' WHERE id = 2")

    first = run_dag(extract_dag, config_path, FIRST)
    assert states(first) == {"extract": "success"}
    figures = xcom(first)
    assert {k: figures[k] for k in ("pairs", "transactions", "rows", "held_back")} == {
        "pairs": 1, "transactions": 2, "rows": 3, "held_back": False
    }  # fmt: skip
    assert [(r["op"], r["after"]) for r in pair_rows(config.intermediate_dir)] == [
        ("I", {"id": 1, "v": "a"}), ("I", {"id": 2, "v": "b"}), ("U", {"id": 2, "v": "c"})
    ]  # fmt: skip

    # A --follow extractor holds the folder: the scheduled batch changes nothing and is skipped, not failed.
    execute(config, "INSERT INTO t VALUES (3, 'd')")
    with RunLock(config.intermediate_dir, "ext", file_name=".extract.lock", activity="extracting into"):
        second = run_dag(extract_dag, config_path, FIRST + dt.timedelta(minutes=1))
    assert states(second) == {"extract": "skipped"}
    assert len(pair_rows(config.intermediate_dir)) == 3


def test_the_materialize_dag_copies_a_table_and_fails_naming_a_refusal(
    materialize_dag: Any, tmp_path: Path, logical_source: Source
) -> None:
    from applier.extract.subscriptions import Registry

    config_path = config_file(tmp_path, logical_source, "  include: [public.other]\n")
    config = extract_config(tmp_path, logical_source, "source.include=public.other")
    prepare(
        config,
        "CREATE TABLE other (id int PRIMARY KEY)",
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 5) g",
        "CREATE TABLE bag (v int)",
    )
    conf = {"table": "public.t", "mode": "incremental", "chunk_rows": 2}
    done = run_dag(materialize_dag, config_path, FIRST, conf)
    assert states(done) == {"subscribe": "success"}
    assert xcom(done, "applier_materialize", "subscribe") == {
        "table": "public.t", "mode": "incremental", "state": "activating", "copied_rows": 5, "recovering": False
    }  # fmt: skip
    inserts = [r for r in pair_rows(config.intermediate_dir) if r["table"] == "public.t" and r["op"] == "I"]
    assert sorted(r["after"]["id"] for r in inserts) == [1, 2, 3, 4, 5] and len({r["xid"] for r in inserts}) == 3

    refused = run_dag(materialize_dag, config_path, FIRST + dt.timedelta(minutes=1),
                      {"table": "public.bag", "mode": "nonatomic", "chunk_rows": None})  # fmt: skip
    assert states(refused) == {"subscribe": "failed"}
    assert Registry(config.intermediate_dir).load()["public.bag"].error == (
        "table public.bag has no primary key: subscribe it in atomic or incremental mode"
    )
