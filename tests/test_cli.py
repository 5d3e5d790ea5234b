"""The `applier` command as a user runs it: help, exit codes, one-line errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import spec_dir
from handmade import good_first_pair

APPLIER = [sys.executable, "-m", "applier.cli"]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APPLIER, *map(str, args)], capture_output=True, text=True, timeout=300)


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "applier"
    assert script.exists()
    assert subprocess.run([script, "--help"], capture_output=True, text=True).returncode == 0


@pytest.mark.parametrize("command", [[], ["generate"], ["check"], ["plan"]])
def test_every_command_has_help_with_the_exit_codes(command: list[str]) -> None:
    done = run(*command, "--help")
    assert done.returncode == 0
    assert "usage: applier" in done.stdout and "3  refused intermediate file" in done.stdout


def test_a_configuration_error_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    config = tmp_path / "a.yaml"
    config.write_text("configuration_name: a\nintermediate_dir: in\noutput_dir: out\ntarget: {path: t}\n")
    done = run("plan", "--config", config, "--set", "apply.process_intermediate_size_per_job=-3")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "apply.process_intermediate_size_per_job" in done.stderr and "-3" in done.stderr


def test_usage_errors_exit_2() -> None:
    assert run("nonsense").returncode == 2
    assert run("plan").returncode == 2  # --config missing


def test_a_refused_pair_exits_3_and_is_named(tmp_path: Path) -> None:
    folder = spec_dir() / "vectors" / "invalid" / "sha-mismatch"
    shutil.copytree(folder, tmp_path / "in")
    done = run("check", tmp_path / "in")
    assert done.returncode == 3
    assert "000000000002.dat" in done.stderr and "sha256" in done.stderr


def test_check_summarises_a_good_directory(tmp_path: Path) -> None:
    good_first_pair(tmp_path)
    done = run("check", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1 pairs ok" in done.stdout and "1 committed" in done.stdout and "1 open" in done.stdout
    assert "bank.accounts: 3 rows" in done.stdout


def test_plan_lists_the_cycles_of_the_backlog(tmp_path: Path) -> None:
    good_first_pair(tmp_path / "in")
    shutil.copy(tmp_path / "in" / "000000000001.dat", tmp_path / "in" / "000000000002.dat")
    config = tmp_path / "a.yaml"
    config.write_text("configuration_name: a\nintermediate_dir: in\noutput_dir: out\ntarget: {path: t}\n")
    done = run("plan", "--config", config)
    assert done.returncode == 0, done.stderr
    assert "1 cycles after pair 0" in done.stdout and "cycle 1: pairs 1..1" in done.stdout


ENTRY = """
import atexit, gc, sys
atexit.register(lambda: print(f"frozen at exit: {gc.get_freeze_count() > 0}"))
from applier.cli import entry
sys.argv = ["applier", *sys.argv[1:]]
entry()
"""


@pytest.mark.parametrize("vector", [None, "sha-mismatch"])
def test_the_command_exits_with_its_code_and_output_and_its_heap_frozen(tmp_path: Path, vector: str | None) -> None:
    if vector is None:
        good_first_pair(tmp_path)
    else:
        shutil.copytree(spec_dir() / "vectors" / "invalid" / vector, tmp_path, dirs_exist_ok=True)
    done = subprocess.run([sys.executable, "-c", ENTRY, "check", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == (0 if vector is None else 3), done.stderr
    assert ("1 pairs ok" in done.stdout) == (vector is None), "the command's own output, flushed"
    assert done.stdout.rstrip().endswith("frozen at exit: True"), "the collector skips the heap at the teardown"
    assert "Traceback" not in done.stderr
