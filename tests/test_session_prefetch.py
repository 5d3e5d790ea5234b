"""A run that has work starts Spark in the background while it reads; one with nothing to do starts none."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from applier.engine.run import Applier
from applier.engine.session import LazySession
from applier.generate import generate_workload
from applier.targets import open_target
from engine_support import assert_target_equals_reference, make_config


def test_prefetch_starts_once_in_a_background_thread_and_get_waits_for_it() -> None:
    calls: list[str] = []
    release = threading.Event()

    def start() -> str:
        calls.append(threading.current_thread().name)
        release.wait(10)
        return "session"

    lazy = LazySession(start)
    assert not lazy.started
    lazy.prefetch()
    lazy.prefetch()  # already starting: no second start
    assert lazy.started
    release.set()
    assert lazy.get() == "session" and lazy.get() == "session"
    assert calls == ["spark-start"]


def test_a_failed_background_start_is_raised_by_get() -> None:
    def start() -> Any:
        raise RuntimeError("Java gateway process exited")

    lazy = LazySession(start)
    lazy.prefetch()
    with pytest.raises(RuntimeError, match="gateway"):
        lazy.get()


@pytest.mark.spark
def test_a_run_with_work_starts_spark_in_the_background_before_its_first_apply(tmp_path: Path, spark: Any) -> None:
    generate_workload(tmp_path / "in", seed=3, transactions=60, file_size_mb=0.05)
    config = make_config(tmp_path, tmp_path / "in")
    where: list[str] = []

    def start() -> Any:
        where.append(threading.current_thread().name)
        return spark

    Applier(config, LazySession(start), open_target(config)).run()
    assert where == ["spark-start"]
    assert_target_equals_reference(config, tmp_path / "in")
    again: list[str] = []
    Applier(config, LazySession(lambda: again.append("started")), open_target(config)).run()
    assert again == []  # caught up: no Spark


def test_the_modules_a_run_imports_before_spark_starts_leave_pandas_out() -> None:
    """pyarrow imports pandas (about 0.3 s) to check a list it is given: not before the JVM is on its way."""
    import subprocess
    import sys

    script = "import sys, applier.cli, applier.engine.run, applier.targets; print('pandas' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


RUN_WITHOUT_SQL = """
import json, sys
from pyspark.sql import SparkSession
from applier.config import load_config
from applier.engine.api import run_applier
from applier.engine.session import start_spark
from applier.generate import generate_workload

generate_workload(sys.argv[1], seed=3, transactions=120, file_size_mb=0.02, profile="demo")
config = load_config(None, sys.argv[2:])
summary = run_applier(config)
sql_before = SparkSession._instantiatedSession is not None
spark = start_spark(config)  # joins the run's application
rows = spark.range(3).count()  # SQL on demand, with the run's settings
zone = spark.session.conf.get("spark.sql.session.timeZone")
settings = [spark.conf is spark.conf, spark.conf.get("spark.sql.shuffle.partitions")]  # copied once, per cycle asked
print(json.dumps([summary.cycles_run, sql_before, rows, zone, settings]))
"""


def test_a_run_s_cycles_never_start_spark_sql_and_sql_starts_on_demand_with_the_run_s_settings(tmp_path: Path) -> None:
    """Creating the SQL session took 0.7-1.0 s of a run's start; a cycle's jobs are RDD jobs and need none."""
    import json
    import subprocess
    import sys

    settings = [
        "configuration_name=nosql",
        f"intermediate_dir={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        f"target.path={tmp_path / 'target'}",
        "apply.process_intermediate_size_per_job=0.05",
        "spark.master=local[1]",
    ]
    done = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_SQL, str(tmp_path / "in"), *settings],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    cycles, sql_before, rows, zone, settings = json.loads(done.stdout.strip().splitlines()[-1])
    assert cycles > 1 and not sql_before
    assert rows == 3 and zone == "UTC"
    assert settings == [True, "8"]  # the application's settings, copied from its JVM once
