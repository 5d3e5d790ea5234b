"""The Spark cluster path: ``jobs/apply.py`` submitted to a standalone master reaches the local-mode target.

A Spark standalone master and one small worker are started on 127.0.0.1 (free
ports, logs and the worker's folder under the test's tmp folder) with the
venv's ``spark-class``; the apply job is submitted with
``spark-submit --master spark://127.0.0.1:<port>``. Driver, executors and the
test share one machine, so the intermediate files, the spill files and the
Delta target are at the same paths for all of them. The same workload applied
in local mode (the session fixture) and by the independent reference applier
must give the same tables.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from applier.config import Config, load_config
from applier.engine.checkpoint import CheckpointStore
from applier.generate import generate_workload
from applier.targets.delta import DeltaTarget
from engine_support import assert_target_equals_reference, run
from reference.applier import canonical_rows, reference_apply

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STARTUP_SECONDS = 120
SUBMIT_SECONDS = 600


@dataclass(frozen=True)
class StandaloneCluster:
    """A running standalone master with one worker.

    Attributes:
        master_url: ``spark://127.0.0.1:<port>``.
        status_url: the master's JSON status (workers, applications).
        work_dir: the worker's folder; each executor's logs are under ``app-*/<id>/``.
    """

    master_url: str
    status_url: str
    work_dir: Path


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spark_env() -> dict[str, str]:
    """The environment of the cluster's daemons and of spark-submit: loopback, the venv's Python."""
    return {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "SPARK_DAEMON_MEMORY": "512m",
    }


def master_status(status_url: str) -> dict[str, Any]:
    """The master's JSON status, or ``{}`` while it does not answer yet."""
    try:
        with urllib.request.urlopen(status_url, timeout=5) as response:
            data: dict[str, Any] = json.load(response)
            return data
    except (OSError, ValueError):
        return {}


def _start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a daemon in its own process group (so that stopping it takes its JVM too)."""
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=spark_env(), start_new_session=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it if it lingers."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    except ProcessLookupError:
        pass


def _wait_for(ready: Callable[[], bool], processes: dict[str, tuple[subprocess.Popen[bytes], Path]], what: str) -> None:
    """Poll ``ready()`` until true; fail with the daemons' logs if one dies or time runs out."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while not ready():
        for name, (process, log) in processes.items():
            if process.poll() is not None:
                pytest.fail(f"the Spark {name} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {name}:\n{log.read_text()[-2000:]}" for name, (_, log) in processes.items())
            pytest.fail(f"the Spark cluster was not {what} after {STARTUP_SECONDS}s:\n{logs}")
        time.sleep(1)


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    """A standalone master and one worker (1 core, 1 GiB) on 127.0.0.1, stopped even on failure."""
    base = tmp_path / "cluster"
    base.mkdir()
    # The master's REST submission server would take the fixed port 6066.
    properties = base / "spark-defaults.conf"
    properties.write_text("spark.master.rest.enabled false\n")
    port, master_ui, worker_ui = free_port(), free_port(), free_port()
    cluster = StandaloneCluster(
        master_url=f"spark://127.0.0.1:{port}",
        status_url=f"http://127.0.0.1:{master_ui}/json/",
        work_dir=base / "work",
    )
    spark_class = str(BIN / "spark-class")
    processes: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        master_log = base / "master.log"
        master = _start(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(master_ui),
                "--properties-file",
                str(properties),
            ],
            master_log,
        )
        processes["master"] = (master, master_log)
        _wait_for(lambda: master_status(cluster.status_url).get("status") == "ALIVE", processes, "alive")
        worker_log = base / "worker.log"
        worker = _start(
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                cluster.master_url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(worker_ui),
                "--work-dir",
                str(cluster.work_dir),
                "--properties-file",
                str(properties),
            ],
            worker_log,
        )
        processes["worker"] = (worker, worker_log)
        _wait_for(lambda: master_status(cluster.status_url).get("aliveworkers") == 1, processes, "given its worker")
        yield cluster
    finally:
        for process, _ in reversed(processes.values()):
            _stop(process)


def write_config(root: Path, intermediate: Path, executor_write_mb: str = "null", pg_url: str | None = None) -> Path:
    """A configuration file over ``intermediate`` with output and target under ``root`` (or ``pg_url``'s database).

    Small cycles and a tiny buffer, so that several cycles run and open
    transactions spill to files the executors must read; ``executor_write_mb``
    (``apply.executor_write_mb``): from what size a cycle's tables are written by the executors.
    """
    root.mkdir(parents=True, exist_ok=True)
    path = root / "applier.yaml"
    path.write_text(
        "configuration_name: cluster\n"
        f"intermediate_dir: {intermediate}\n"
        f"output_dir: {root / 'out'}\n"
        "apply:\n"
        "  process_intermediate_size_per_job: 0.15\n"
        "  buffer_size_for_split_records: 1024\n"
        f"  executor_write_mb: {executor_write_mb}\n"
        "target:\n"
        + (
            f"  type: delta\n  path: {root / 'target'}\n"
            if pg_url is None
            else f"  type: postgres\n  url: '{pg_url}'\n"
        )
    )
    return path


def submit(cluster: StandaloneCluster, config_file: Path) -> subprocess.CompletedProcess[str]:
    """``spark-submit --master <cluster> jobs/apply.py --config FILE``, sized to the one small worker."""
    command = [
        str(BIN / "spark-submit"),
        "--master",
        cluster.master_url,
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.cores.max=1",
        "--conf",
        "spark.driver.memory=1g",
        str(REPO / "jobs" / "apply.py"),
        "--config",
        str(config_file),
    ]
    return subprocess.run(command, env=spark_env(), capture_output=True, text=True, timeout=SUBMIT_SECONDS, check=False)


def canonical_target(config: Config, intermediate: Path) -> dict[str, list[list[Any]]]:
    """Every table's rows in the reference's canonical form (NaN and decimals compare by value)."""
    assert config.target.path is not None
    target = DeltaTarget(config.target.path, config.configuration_name)
    out: dict[str, list[list[Any]]] = {}
    for name, ref in reference_apply(intermediate).items():
        table = target.read_arrow(name)
        rows = [] if table is None else [list(r.values()) for r in table.to_pylist()]
        out[name] = canonical_rows(list(zip(ref.columns, ref.types, strict=True)), rows)
    return out


def test_apply_job_on_a_standalone_cluster_reaches_the_local_mode_target(
    tmp_path: Path, spark_cluster: StandaloneCluster, spark: Any
) -> None:
    intermediate = tmp_path / "in"
    workload = generate_workload(intermediate, seed=7, transactions=150, file_size_mb=0.05, profile="demo")
    on_cluster = load_config(write_config(tmp_path / "cluster-run", intermediate, executor_write_mb="0"))
    local = load_config(write_config(tmp_path / "local-run", intermediate))

    result = submit(spark_cluster, tmp_path / "cluster-run" / "applier.yaml")
    assert result.returncode == 0, f"spark-submit exited {result.returncode}:\n{result.stderr[-4000:]}"
    run(local, spark)

    # The application ran on the cluster: the master lists it finished and its executor ran the tasks.
    apps = master_status(spark_cluster.status_url).get("completedapps", [])
    assert [(a["name"], a["state"]) for a in apps] == [("applier-cluster", "FINISHED")]
    executor_logs = list(spark_cluster.work_dir.glob("app-*/*/stderr"))
    assert executor_logs, f"no executor ran under {spark_cluster.work_dir}"
    assert any("Finished task" in log.read_text() for log in executor_logs), "the executor finished no task"

    cluster_point, local_point = CheckpointStore(on_cluster.work_dir).load(), CheckpointStore(local.work_dir).load()
    assert cluster_point.applied_seq == workload.pairs
    assert cluster_point.cycle_id > 1, "small cycles: several cycles ran on the cluster"
    assert (cluster_point.cycle_id, cluster_point.applied_seq, cluster_point.applied_commit_lsn) == (
        local_point.cycle_id,
        local_point.applied_seq,
        local_point.applied_commit_lsn,
    )
    assert cluster_point.row_counts == local_point.row_counts
    reports = [json.loads(line) for line in (on_cluster.work_dir / "cycles.jsonl").read_text().splitlines()]
    assert any(r["spill_created"] for r in reports), "a tiny buffer spills: executors read spill files"
    # The first cycle's .dat files are read by the driver while Spark starts, the later ones' by the executors,
    # as the application's master (spark-submit's --master) says; in local mode, by the driver.
    assert [r["dat_read_by_executors"] for r in reports] == [False] + [True] * (len(reports) - 1)
    # Every cycle's Delta tables were committed by the cluster's executors; in local mode, by default, by the driver.
    assert {step for r in reports for steps in r["table_seconds"].values() for step in steps} == {"apply_on_executor"}
    local_reports = [json.loads(line) for line in (local.work_dir / "cycles.jsonl").read_text().splitlines()]
    assert {step for r in local_reports for steps in r["table_seconds"].values() for step in steps} == {"apply"}
    assert not any(r["dat_read_by_executors"] for r in local_reports)

    assert canonical_target(on_cluster, intermediate) == canonical_target(local, intermediate)
    assert_target_equals_reference(on_cluster, intermediate)
    assert_target_equals_reference(local, intermediate)


@pytest.mark.postgres
def test_on_a_cluster_the_executors_load_postgresql_staging_and_the_target_equals_the_reference(
    tmp_path: Path, spark_cluster: StandaloneCluster, pg_url: str
) -> None:
    intermediate = tmp_path / "in"
    generate_workload(intermediate, seed=11, transactions=120, file_size_mb=0.05, profile="demo")
    config_file = write_config(tmp_path / "cluster-run", intermediate, executor_write_mb="0", pg_url=pg_url)
    result = submit(spark_cluster, config_file)
    assert result.returncode == 0, f"spark-submit exited {result.returncode}:\n{result.stderr[-4000:]}"
    config = load_config(config_file)
    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]
    assert len(reports) > 1
    # Every cycle's staging tables were loaded by the cluster's executor, over connections of their own.
    assert {step for r in reports for steps in r["table_seconds"].values() for step in steps} == {"load_on_executor"}
    assert all(r["load_batches"] == [] for r in reports if r["table_seconds"])
    assert_target_equals_reference(config, intermediate)
