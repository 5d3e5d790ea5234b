"""Failures a user meets before any work: one line on stderr, the documented exit code, no traceback, no Spark.

Every command here runs with ``JAVA_HOME`` pointing nowhere: a command that
started Spark would fail with a Java gateway error instead of its own answer,
so each test also proves that no JVM was started. Their seconds are measured
by hand (README, "Pre-Spark checks"), not asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from applier.exits import run_command
from applier.generate import generate_workload

APPLIER = [sys.executable, "-m", "applier.cli"]
NO_JAVA = {**os.environ, "JAVA_HOME": "/nonexistent/java-home"}


def applier(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APPLIER, *map(str, args)], capture_output=True, text=True, timeout=120, env=NO_JAVA)


def write_config(tmp_path: Path, intermediate: Path, target: str = "") -> Path:
    path = tmp_path / "applier.yaml"
    target = target or f"target: {{path: {tmp_path / 'target'}}}"
    path.write_text(
        f"configuration_name: fast\nintermediate_dir: {intermediate}\noutput_dir: {tmp_path / 'out'}\n{target}\n"
    )
    return path


def assert_one_line(done: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The command exited ``code`` with exactly one line on stderr, naming ``words``, and no traceback."""
    lines = done.stderr.splitlines()
    assert done.returncode == code, done.stderr
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "java" not in done.stderr.lower()
    assert lines[0].startswith("applier: error: ")
    for word in words:
        assert word in lines[0]
    return lines[0]


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    """A small generated workload of several pairs, nothing applied."""
    generate_workload(tmp_path / "in", seed=5, transactions=60, file_size_mb=0.02)
    return tmp_path / "in"


def cut_in_half(dat: Path) -> None:
    os.truncate(dat, dat.stat().st_size // 2)


@pytest.mark.parametrize("command", ["run", "plan", "status"])
def test_a_missing_intermediate_dir_is_one_line_with_exit_code_2(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "no" / "such"
    done = applier(command, "--config", write_config(tmp_path, missing))
    assert_one_line(done, 2, "intermediate_dir", str(missing), "does not exist")


def test_a_delta_root_that_is_a_file_is_refused_with_exit_code_2(tmp_path: Path, workload: Path) -> None:
    (tmp_path / "root").write_text("not a folder")
    config = write_config(tmp_path, workload, f"target: {{path: {tmp_path / 'root' / 'tables'}}}")
    assert_one_line(applier("run", "--config", config), 2, "target.path", "is not a folder")


@pytest.mark.postgres
def test_a_wrong_database_is_one_line_with_exit_code_4(tmp_path: Path, workload: Path) -> None:
    from pg_support import database_url

    url = database_url("applier_no_such_database")
    done = applier("run", "--config", write_config(tmp_path, workload, f'target: {{type: postgres, url: "{url}"}}'))
    assert_one_line(done, 4, "applier_no_such_database")


def test_an_unknown_table_to_validate_is_one_line_with_exit_code_2(tmp_path: Path, workload: Path) -> None:
    done = applier("validate", "--config", write_config(tmp_path, workload), "--table", "shop.nosuch")
    assert_one_line(done, 2, "shop.nosuch", "not in the checkpoint")


def test_a_run_with_nothing_to_do_starts_no_jvm(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    done = applier("run", "--config", write_config(tmp_path, tmp_path / "in"))
    assert done.returncode == 0, done.stderr
    assert "nothing to do" in done.stdout
    assert "Spark not started" in done.stderr and "Traceback" not in done.stderr


def test_a_run_whose_next_pair_was_cut_in_half_is_refused_with_exit_code_3(tmp_path: Path, workload: Path) -> None:
    cut_in_half(workload / "000000000001.dat")
    done = applier("run", "--config", write_config(tmp_path, workload))
    assert_one_line(done, 3, "000000000001.dat", "header says", "[bytes-mismatch]")


def test_plan_flags_a_pair_cut_in_half_and_plans_only_the_pairs_before_it(tmp_path: Path, workload: Path) -> None:
    cut_in_half(workload / "000000000003.dat")
    done = applier(
        "plan", "--config", write_config(tmp_path, workload), "--set", "apply.process_intermediate_size_per_job=0"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("1 cycles after pair 0") and lines[1].strip().startswith("cycle 1: pairs 1..2 ")
    assert lines[2].strip().startswith("then REFUSED pair 3: ") and "[bytes-mismatch]" in lines[2]


def test_status_flags_a_pair_cut_in_half_and_what_it_blocks(tmp_path: Path, workload: Path) -> None:
    cut_in_half(workload / "000000000002.dat")
    config = write_config(tmp_path, workload)
    done = applier("status", "--config", config)
    assert done.returncode == 0, done.stderr
    assert "REFUSED pair 2: " in done.stdout and "BLOCKED by pair 2: " in done.stdout


@pytest.mark.parametrize("reader", ["head -1", "head -n 0"])
def test_status_piped_into_head_is_quiet_and_exits_0(tmp_path: Path, workload: Path, reader: str) -> None:
    config = write_config(tmp_path, workload)
    command = " ".join([*APPLIER, "status", "--config", str(config)])
    done = subprocess.run(
        ["bash", "-c", f"{command} | {reader}; exit ${{PIPESTATUS[0]}}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=NO_JAVA,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout == ("" if reader == "head -n 0" else "configuration fast: cycle 0, committed never\n")


def test_an_unexpected_error_is_one_line_naming_its_traceback_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("APPLIER_TRACEBACK", raising=False)

    def handler(args: object) -> int:
        raise KeyError("a bug")

    assert run_command(handler, None, "status") == 1
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and line.startswith(
        "applier: unexpected error: KeyError: 'a bug'; the traceback is in "
    )
    written = Path(line.rsplit(" ", 1)[1].strip())
    assert written.parent == tmp_path and "Traceback (most recent call last)" in written.read_text()


def test_these_tests_would_see_spark_start(tmp_path: Path, workload: Path) -> None:
    """The control: under ``JAVA_HOME`` pointing nowhere, a run with work fails as soon as it starts Spark."""
    done = subprocess.run(
        [*APPLIER, "run", "--config", str(write_config(tmp_path, workload))],
        capture_output=True,
        text=True,
        timeout=120,
        env={**NO_JAVA, "TMPDIR": str(tmp_path)},  # where the traceback file goes
    )
    assert done.returncode == 1
    assert "applier: unexpected error: PySparkRuntimeError: [JAVA_GATEWAY_EXITED]" in done.stderr
    assert "Traceback" not in done.stderr and len(list(tmp_path.glob("applier-run-*.traceback"))) == 1
