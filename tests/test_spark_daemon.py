"""Spark's Python workers import the installed pyspark, not Spark's zip of it, and have no JAR on their path."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pyspark
import pytest

from applier.engine.session import DEFAULTS
from applier.engine.spark_daemon import PRELOADED, without_bundled_pyspark

INSTALLED = Path(pyspark.__file__).resolve().parent
BUNDLED = INSTALLED / "python" / "lib" / "pyspark.zip"


def test_the_installed_pyspark_ships_the_zip_spark_puts_first_on_its_workers_path() -> None:
    assert BUNDLED.is_file()
    assert "pyspark/daemon.py" in zipfile.ZipFile(BUNDLED).namelist()
    assert not any(name.endswith(".pyc") for name in zipfile.ZipFile(BUNDLED).namelist()), "sources only"


def test_the_installed_pyspark_s_own_zips_leave_the_path_and_nothing_else_does() -> None:
    py4j = INSTALLED / "python" / "lib" / f"py4j-{importlib.metadata.version('py4j')}-src.zip"
    assert py4j.is_file(), "pyspark pins the py4j it bundles"
    older = str(py4j.with_name("py4j-0.10.1-src.zip"))  # not the installed version: stays
    path = [str(BUNDLED), str(py4j), older, *sys.path]
    assert without_bundled_pyspark(path) == [older, *sys.path]


def test_a_zip_of_another_installation_or_the_only_pyspark_stays(tmp_path: Path) -> None:
    other = tmp_path / "spark" / "python" / "lib" / "pyspark.zip"
    other.parent.mkdir(parents=True)
    with zipfile.ZipFile(other, "w") as made:
        made.writestr("pyspark/__init__.py", "")
    path = [str(other), *sys.path]
    assert without_bundled_pyspark(path) == path, "another Spark's pyspark: Spark's path as it made it"
    alone = [str(BUNDLED), str(tmp_path)]
    assert without_bundled_pyspark(alone) == alone, "no pyspark but the zip's: it stays"


WORKER_PYSPARK = """
import json, sys
import pyarrow as pa
from applier.config import load_config
from applier.engine.session import start_spark

from applier.engine.spark_daemon import PRELOADED

def where(batches):
    import os
    import pyspark
    jars = [p for p in sys.path if p.endswith(".jar")]
    found = ",".join(name for name in PRELOADED if name in sys.modules)  # before this task made an array
    for _ in batches:
        yield pa.RecordBatch.from_pydict({"file": [pyspark.__file__], "jars": [len(jars)], "found": [found],
                                          "daemon": [os.getppid()]})

from applier.engine import daemon_ahead
spark = start_spark(load_config(None, sys.argv[1:]))
zygote = daemon_ahead._zygote.pid if daemon_ahead._zygote is not None else None
found = spark.range(1, numPartitions=1).mapInArrow(where, "file string, jars long, found string, daemon long")
print(json.dumps([*found.collect()[0], zygote]))
"""


@pytest.mark.parametrize("daemon", ["default", "pyspark.daemon"])
def test_a_run_s_workers_import_pyspark_from_the_installed_package(tmp_path: Path, daemon: str) -> None:
    settings = [
        "configuration_name=daemon",
        f"intermediate_dir={tmp_path}",
        f"output_dir={tmp_path / 'out'}",
        f"target.path={tmp_path / 'target'}",
        "spark.master=local[1]",
    ]
    if daemon != "default":
        settings.append(f"spark.conf.spark.python.daemon.module={daemon}")  # Spark's own, for contrast
    done = subprocess.run(
        [sys.executable, "-c", WORKER_PYSPARK, *settings], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    file, jars, found, daemon_pid, zygote = json.loads(done.stdout.strip().splitlines()[-1])
    imported = Path(file)
    if daemon == "default":
        assert DEFAULTS["spark.python.daemon.module"] == "applier.engine.spark_daemon"
        assert imported.resolve().parent == INSTALLED, imported
        assert jars == 0, "Spark's JAR left the path before the worker was forked"
        assert found.split(",") == list(PRELOADED), "the daemon imported them before it forked the worker"
        assert zygote is not None and daemon_pid == zygote, "the daemon is the zygote started ahead (daemon_ahead)"
    else:
        assert "pyspark.zip" in imported.parts, imported
        assert jars > 0
        assert "applier.engine.netting" not in found.split(","), found
        assert zygote is None, "no zygote for an operator's daemon"
