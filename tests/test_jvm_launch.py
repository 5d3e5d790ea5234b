"""``applier run`` launches its driver's JVM ahead of PySpark, and PySpark joins that JVM; one never joined is unheard.

Each JVM here is real (``spark-submit pyspark-shell`` from the installed
pyspark); a run that joins one does so in a fresh process, as ``applier run``
does, since this test process may hold a Spark application already.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from applier.config import load_config
from applier.engine.jvm_launch import launch
from applier.engine.runlock import RunLock
from applier.engine.session import application_conf
from applier.errors import RunLockedError, UsageError
from applier.generate import generate_workload


def _settings(tmp_path: Path) -> list[str]:
    return [
        "configuration_name=ahead",
        f"intermediate_dir={tmp_path / 'in'}",
        f"output_dir={tmp_path / 'out'}",
        f"target.path={tmp_path / 'target'}",
        "spark.master=local[1]",
    ]


JOIN = """
import json, sys
from applier.config import load_config
from applier.engine.jvm_launch import launch
from applier.engine.session import application_conf, start_spark

config = load_config(None, sys.argv[1:])
jvm = launch(application_conf(config))
app = start_spark(config, jvm=jvm)
context = app.sparkContext
print(json.dumps({
    "launched": jvm.process.pid,
    "serving": context._jvm.java.lang.ProcessHandle.current().pid(),
    "kept": context._gateway.proc is jvm.process,
    "sum": context.parallelize(range(10), 2).sum(),
}))
"""


def test_pyspark_joins_the_jvm_launched_ahead_and_its_output_comes_through(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", JOIN, *_settings(tmp_path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["serving"] == found["launched"], "the application runs in the JVM launched ahead"
    assert found["kept"] and found["sum"] == 45
    assert "log4j" in done.stderr, "what the JVM printed before it was joined was held back, then passed on"


AGAIN = """
import json, sys
from applier.config import load_config
from applier.engine.jvm_launch import launch
from applier.engine.session import application_conf, start_spark

config = load_config(None, sys.argv[1:])
first = start_spark(config).sparkContext
serving = first._jvm.java.lang.ProcessHandle.current().pid()
first.stop()  # PySpark keeps its JVM for the next context of this process
jvm = launch(application_conf(config))
again = start_spark(config, jvm=jvm).sparkContext
print(json.dumps({
    "same": again._jvm.java.lang.ProcessHandle.current().pid() == serving,
    "dropped": jvm.process.poll() is not None,
}))
"""


def test_a_process_that_has_its_jvm_already_stops_the_one_launched_ahead(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", AGAIN, *_settings(tmp_path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"same": True, "dropped": True}


def test_a_jvm_never_joined_is_stopped_and_unheard(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    jvm = launch(application_conf(load_config(None, _settings(tmp_path))))
    assert jvm is not None
    with jvm.joined({"spark.app.name": "another configuration"}) as joined:
        assert not joined, "settings other than the launch's: PySpark launches its own JVM"
    assert jvm.process.poll() is not None, "the JVM launched ahead was stopped"
    jvm.drop()  # again: nothing
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_a_jvm_that_cannot_start_is_dropped_without_a_word(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", "/nonexistent/java-home")
    settings = application_conf(load_config(None, _settings(tmp_path)))
    jvm = launch(settings)
    assert jvm is not None
    with jvm.joined(settings) as joined:
        assert not joined, "PySpark then launches one itself, and fails as it always did"
    assert jvm.process.poll() is not None
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_under_spark_submit_nothing_is_launched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # spark-submit started this Python: its JVM is there
    assert launch(application_conf(load_config(None, _settings(tmp_path)))) is None


def _applier_run(tmp_path: Path, settings: list[str]) -> tuple[subprocess.CompletedProcess[str], str]:
    """``applier run`` of ``settings`` (its output read to the end), then the pids still running its JVM."""
    (tmp_path / "applier.yaml").write_text("".join(line.replace("=", ": ", 1) + "\n" for line in settings[:3]))
    overrides = [arg for setting in settings[3:] for arg in ("--set", setting)]
    done = subprocess.run(
        [sys.executable, "-m", "applier.cli", "run", "--config", str(tmp_path / "applier.yaml"), *overrides],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    name = settings[0].split("=", 1)[1]
    left = subprocess.run(["pgrep", "-f", f"spark.app.name=applier-{name}"], capture_output=True, text=True)
    return done, left.stdout


def test_a_run_refused_after_the_launch_prints_its_one_line_and_leaves_no_jvm(tmp_path: Path) -> None:
    generate_workload(tmp_path / "in", seed=4, transactions=30, file_size_mb=0.02)  # a pair waits: the JVM launches
    settings = ["configuration_name=refused_ahead", *_settings(tmp_path)[1:]]
    config = load_config(None, settings)
    with RunLock(config.work_dir, config.configuration_name):  # and the run is refused before it needs Spark
        done, left = _applier_run(tmp_path, settings)
    assert done.returncode == RunLockedError.exit_code, done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("applier: error: "), done.stderr
    assert left == "", "the JVM launched ahead was stopped before the run ended"


def test_whoever_reads_a_run_s_output_to_its_end_waits_for_its_jvm_too(tmp_path: Path) -> None:
    # The JVM outlives the Python driver by a moment (it writes a class archive then, say), as PySpark's does.
    generate_workload(tmp_path / "in", seed=6, transactions=30, file_size_mb=0.02)
    done, left = _applier_run(tmp_path, ["configuration_name=ahead_eof", *_settings(tmp_path)[1:]])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cycle 1:" in done.stderr and "log4j" in done.stderr, "the JVM's lines and the run's"
    assert left == "", "the output ended with the JVM, not before it"


LAUNCHED_FIRST = """
import json, sys
from applier.engine import jvm_launch

def launch(conf):  # records what the process had imported when the run launched its JVM; launches none
    print(json.dumps({key: key in sys.modules for key in ("pyarrow", "applier.commands", "applier.engine.api")}))
    return None

jvm_launch.launch = launch
from applier.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_run_launches_its_jvm_before_the_imports_of_its_commands_and_engine(tmp_path: Path) -> None:
    generate_workload(tmp_path / "in", seed=5, transactions=30, file_size_mb=0.02)  # a pair waits: the JVM launches
    settings = ["configuration_name=first", *_settings(tmp_path)[1:]]
    (tmp_path / "applier.yaml").write_text("".join(line.replace("=", ": ", 1) + "\n" for line in settings[:3]))
    overrides = [arg for setting in settings[3:] for arg in ("--set", setting)]
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHED_FIRST, "run", "--config", str(tmp_path / "applier.yaml"), *overrides],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    imported = json.loads(done.stdout.splitlines()[0])
    assert imported == {"pyarrow": False, "applier.commands": False, "applier.engine.api": False}, imported


@pytest.mark.parametrize("problem", [RuntimeError("unexpected"), UsageError("a bad setting")])
def test_the_launch_ahead_never_fails_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, problem: Exception
) -> None:
    from applier import run_ahead

    def failing(*_args: object) -> None:
        raise problem

    monkeypatch.setattr(run_ahead, "load_config", failing)
    args = argparse.Namespace(config=tmp_path / "a.yaml", overrides=[], max_cycles=None)
    assert run_ahead.launch_for(args) is None, "the run meets the problem itself, in its words"
