"""The driver JVM's class archive: made by setup, used by every session, never a crash when damaged."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from applier.config import load_config
from applier.engine.jvm_archive import (
    ENV,
    archive_options,
    archive_path,
    launcher_archive_path,
    launcher_env,
    launcher_options,
    make_archive,
    make_launcher_archive,
    usable,
)
from applier.engine.jvm_launch import spark_home
from applier.engine.session import (
    CLUSTER_DRIVER_JVM_OPTIONS,
    DRIVER_JVM_OPTIONS,
    JVM_OPTIONS,
    driver_java_options,
    spark_conf,
)


def test_the_options_name_the_archive_only_when_it_is_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "classes.jsa"
    monkeypatch.setenv(ENV, str(archive))
    assert archive_options() == "" and driver_java_options() == DRIVER_JVM_OPTIONS
    archive.write_bytes(b"made")
    assert f"-XX:SharedArchiveFile={archive}" in driver_java_options().split()
    assert driver_java_options().startswith(DRIVER_JVM_OPTIONS)
    monkeypatch.setenv(ENV, "off")
    assert archive_path() is None and driver_java_options() == DRIVER_JVM_OPTIONS


def test_spark_submit_s_launcher_jvm_compiles_with_c1_and_maps_its_archive_when_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "spark-driver-x.jsa"))
    monkeypatch.delenv("SPARK_LAUNCHER_OPTS", raising=False)
    launcher = launcher_archive_path()
    assert launcher == tmp_path / "spark-launcher-x.jsa"
    assert launcher_options() == "-XX:TieredStopAtLevel=1" and launcher_env() == {
        "SPARK_LAUNCHER_OPTS": launcher_options()
    }
    launcher.write_bytes(b"made")
    assert f"-XX:SharedArchiveFile={launcher}" in launcher_options().split()
    monkeypatch.setenv("SPARK_LAUNCHER_OPTS", "-Xmx64m")  # an operator's own: kept
    assert launcher_env() == {}


def test_the_launcher_archive_is_made_by_one_spark_submit_and_maps(tmp_path: Path) -> None:
    home = spark_home()
    assert home is not None
    assert make_launcher_archive(tmp_path / "launcher.jsa", home)
    assert usable(tmp_path / "launcher.jsa")


def test_a_driver_whose_executors_are_elsewhere_keeps_a_small_young_generation_and_compiles_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "off")
    assert driver_java_options("spark://127.0.0.1:7077") == f"{DRIVER_JVM_OPTIONS} {CLUSTER_DRIVER_JVM_OPTIONS}"
    assert driver_java_options("local[2]") == driver_java_options() == DRIVER_JVM_OPTIONS  # its executors are in it
    where = [f"intermediate_dir={tmp_path}", f"output_dir={tmp_path}", f"target.path={tmp_path}"]
    config = load_config(None, ["configuration_name=c", *where, "spark.master=spark://127.0.0.1:7077"])
    given = spark_conf(config)["spark.driver.extraJavaOptions"].split()
    assert set(CLUSTER_DRIVER_JVM_OPTIONS.split()) <= set(given)


def test_setup_made_this_installations_archive_and_a_damaged_copy_is_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    made = archive_path()
    assert made is not None and made.is_file(), "make setup makes the archive (python -m applier.engine.jvm_archive)"
    assert made.parent == Path(sys.prefix) / "share" / "cdc-applier"
    assert usable(made)
    launcher = launcher_archive_path()
    assert launcher is not None and launcher.is_file() and usable(launcher), "and spark-submit's launcher's"
    truncated = tmp_path / "truncated.jsa"
    with made.open("rb") as whole:
        truncated.write_bytes(whole.read(made.stat().st_size // 3))
    monkeypatch.chdir(tmp_path)
    assert not usable(truncated)  # a JVM given it dies (SIGBUS): make_archive never moves such a file into place
    assert list(tmp_path.iterdir()) == [truncated], "the crashed JVM's report is not left behind"


def test_a_session_starts_its_jvm_with_the_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    made = archive_path()
    assert made is not None and made.is_file()
    probe = (
        "from applier.config import load_config\n"
        "from applier.engine.session import start_spark\n"
        f"spark = start_spark(load_config({str(tmp_path / 'config.yaml')!r}))\n"
        "bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()\n"
        "print(list(bean.getInputArguments()))\n"
    )
    (tmp_path / "config.yaml").write_text(
        f"configuration_name: probe\nintermediate_dir: {tmp_path}\noutput_dir: {tmp_path / 'out'}\n"
        f"target:\n  type: delta\n  path: {tmp_path / 'target'}\nspark:\n  master: local[1]\n",
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if k != ENV}
    shown = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert f"-XX:SharedArchiveFile={made}" in shown.stdout
    assert "warning" not in shown.stdout.lower() and "[cds" not in shown.stderr


def test_an_archive_is_not_made_when_the_run_that_makes_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # the generating step fails
    assert not make_archive(tmp_path / "never.jsa", JVM_OPTIONS)
    assert not (tmp_path / "never.jsa").exists()
