"""One run at a time: the run lock refuses a second run at once, names the holder, and dies with its holder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import psycopg
import pytest

from applier.config import Config, load_config
from applier.engine.runlock import Holder, RunLock
from applier.errors import RunLockedError
from applier.generate import generate_workload
from applier.targets import open_target
from engine_support import assert_target_equals_reference

# A process that takes a lock, says so, and sleeps until it is killed.
FOLDER_HOLDER = """
import sys, time
from pathlib import Path
from applier.engine.runlock import RunLock
RunLock(Path(sys.argv[1]), "test_cfg", run_key="child").acquire()
print("held", flush=True)
time.sleep(600)
"""
PG_HOLDER = """
import sys, time
from applier.targets.pg_lock import advisory_run_lock
with advisory_run_lock(sys.argv[1], "test_cfg", "the test server"):
    print("held", flush=True)
    time.sleep(600)
"""


@contextmanager
def holding_child(code: str, argument: str) -> Iterator[subprocess.Popen[str]]:
    """A child process that holds a lock (``code`` prints ``held`` once it does); killed afterwards."""
    child = subprocess.Popen([sys.executable, "-c", code, argument], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        yield child
    finally:
        child.kill()
        child.wait(timeout=60)


def test_a_second_lock_on_the_folder_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = RunLock(tmp_path, "test_cfg", run_key="k1")
    holder = first.acquire()
    try:
        with pytest.raises(RunLockedError) as caught:
            RunLock(tmp_path, "test_cfg").acquire()
    finally:
        first.release()
    message = str(caught.value)
    assert caught.value.exit_code == 6
    assert "\n" not in message
    assert f"host {socket.gethostname()}, pid {os.getpid()}, started {holder.started_at}, run key k1" in message
    assert f"configuration test_cfg ({tmp_path / 'run.lock'})" in message
    assert holder.started_at.endswith("Z") and holder.run_key == "k1"


def test_the_holder_is_written_into_the_lock_file_and_a_refusal_leaves_it(tmp_path: Path) -> None:
    with RunLock(tmp_path / "work", "test_cfg", run_key="k1") as lock:
        holder = Holder.parse((tmp_path / "work" / "run.lock").read_text())
        assert holder is not None and (holder.host, holder.pid, holder.run_key) == (
            socket.gethostname(),
            os.getpid(),
            "k1",
        )
        with pytest.raises(RunLockedError):
            RunLock(tmp_path / "work", "test_cfg").acquire()
        assert Holder.parse(lock.path.read_text()) == holder, "a refused run does not clear the holder"
    assert lock.path.read_text() == "", "a released lock names no holder"


def test_a_released_lock_is_taken_again(tmp_path: Path) -> None:
    with RunLock(tmp_path, "test_cfg", run_key="first"):
        pass
    with RunLock(tmp_path, "test_cfg", run_key="second") as again:
        assert again.held
        holder = Holder.parse(again.path.read_text())
        assert holder is not None and holder.run_key == "second"
    assert not again.held


def test_a_killed_holder_leaves_the_folder_lock_free_at_once(tmp_path: Path) -> None:
    with holding_child(FOLDER_HOLDER, str(tmp_path)) as child:
        with pytest.raises(RunLockedError) as caught:
            RunLock(tmp_path, "test_cfg").acquire()
        assert f"pid {child.pid}, started " in str(caught.value) and "run key child" in str(caught.value)
        child.kill()  # SIGKILL: no clean-up of any kind
        child.wait(timeout=60)
        with RunLock(tmp_path, "test_cfg", run_key="next") as lock:
            holder = Holder.parse(lock.path.read_text())
            assert holder is not None and (holder.pid, holder.run_key) == (os.getpid(), "next"), "stale text replaced"


def pg_config(tmp_path: Path, url: str) -> Config:
    return load_config(
        None,
        [
            "configuration_name=test_cfg",
            f"intermediate_dir={tmp_path / 'in'}",
            f"output_dir={tmp_path / 'out'}",
            "target.type=postgres",
            f"target.url={url}",
        ],
    )


@pytest.mark.postgres
def test_the_postgres_run_lock_is_exclusive_and_names_the_session_without_the_password(
    tmp_path: Path, pg_url: str
) -> None:
    config = pg_config(tmp_path, pg_url + " password=s3cret")  # trust auth: the password is not checked
    with open_target(config).run_lock():
        with pytest.raises(RunLockedError) as caught, open_target(config).run_lock():
            pass
        message = str(caught.value)
        assert caught.value.exit_code == 6 and "\n" not in message and "s3cret" not in message
        assert f"the session 'applier test_cfg run, pid {os.getpid()} on " in message
        assert "backend pid " in message and "connected since " in message
        assert "the PostgreSQL run lock of configuration test_cfg" in message
        with psycopg.connect(pg_url, autocommit=True) as other, other.transaction():
            row = other.execute("SELECT pg_try_advisory_xact_lock(hashtext('applier test_cfg'))").fetchone()
            assert row == (True,), "the run lock is not the lock a cycle's commit takes"
    with open_target(config).run_lock():
        pass


@pytest.mark.postgres
def test_a_killed_holder_leaves_the_postgres_run_lock_free(tmp_path: Path, pg_url: str) -> None:
    config = pg_config(tmp_path, pg_url)
    with holding_child(PG_HOLDER, pg_url) as child:
        with pytest.raises(RunLockedError) as caught, open_target(config).run_lock():
            pass
        assert f"pid {child.pid} on " in str(caught.value)
        child.kill()
        child.wait(timeout=60)
        # The server ends the session when it sees the connection drop; give it a generous while.
        deadline = time.monotonic() + 60
        while True:
            try:
                with open_target(config).run_lock():
                    break
            except RunLockedError:
                assert time.monotonic() < deadline, "the killed holder's advisory lock was never freed"
                time.sleep(0.1)


# ---------------------------------------------------------------------------------------- the CLI


def write_config(tmp_path: Path, intermediate: Path) -> Path:
    path = tmp_path / "applier.yaml"
    path.write_text(
        f"configuration_name: test_cfg\nintermediate_dir: {intermediate}\noutput_dir: {tmp_path / 'out'}\n"
        f"target: {{path: {tmp_path / 'target'}}}\nspark: {{master: 'local[1]'}}\n"
    )
    return path


def applier_run(config_file: Path, overrides: Sequence[str]) -> list[str]:
    """The ``applier run`` command line for ``config_file`` with ``--set`` overrides."""
    sets = [arg for override in overrides for arg in ("--set", override)]
    return [sys.executable, "-m", "applier.cli", "run", "--config", str(config_file), *sets]


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}


def assert_untouched(config: Config, tables: Sequence[str]) -> None:
    """Nothing of a run is in the work folder (but the lock file) or the target."""
    assert sorted(p.name for p in config.work_dir.iterdir()) == ["run.lock"]
    target = open_target(config)
    assert all(target.read_arrow(table) is None for table in tables)
    assert set(target.committed_cycles(tables).values()) == {0}


@pytest.mark.slow
@pytest.mark.spark
def test_applier_run_exits_6_while_the_lock_is_held_and_applies_once_it_is_released(
    tmp_path: Path, target_settings: list[str]
) -> None:
    workload = generate_workload(tmp_path / "in", seed=5, transactions=100, profile="demo")
    config_file = write_config(tmp_path, tmp_path / "in")
    config = load_config(config_file, target_settings)
    command = applier_run(config_file, target_settings)
    tables = sorted(workload.rows_per_table)
    # Each way a run can be held off, with what its refusal names.
    holders: list[tuple[Callable[[], AbstractContextManager[object]], str]] = [
        (lambda: RunLock(config.work_dir, "test_cfg", run_key="holder"), f"pid {os.getpid()}, started "),
    ]
    if config.target.type == "postgres":  # the target's lock alone: a run of the same target from another folder
        holders.append((lambda: open_target(config).run_lock(), f"'applier test_cfg run, pid {os.getpid()} on "))
    for hold, named in holders:
        with hold():
            refused = subprocess.run(command, capture_output=True, text=True, env=cli_env(), timeout=120)
        assert refused.returncode == 6, refused.stderr[-3000:]
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("applier: error: another run is applying this configuration")
        assert named in lines[0]
        assert_untouched(config, tables)
    done = subprocess.run(command, capture_output=True, text=True, env=cli_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_target_equals_reference(config, tmp_path / "in")


@pytest.mark.slow
@pytest.mark.spark
def test_two_runs_at_once_apply_each_cycle_once(tmp_path: Path, target_settings: list[str]) -> None:
    generate = ["generate", "--out", str(tmp_path / "in"), "--seed", "3", "--transactions", "200"]
    generated = subprocess.run(
        [sys.executable, "-m", "applier.cli", *generate],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert generated.returncode == 0, generated.stderr
    assert "shop.events" in generated.stdout, "the workload has the keyless table"
    config_file = write_config(tmp_path, tmp_path / "in")
    overrides = [*target_settings, "apply.process_intermediate_size_per_job=0.1"]
    config = load_config(config_file, overrides)
    command = applier_run(config_file, overrides)
    runs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=900) for run in runs]
    codes = [run.returncode for run in runs]
    tails = [(code, err[-3000:]) for code, (_, err) in zip(codes, outputs, strict=True)]
    assert set(codes) <= {0, 6} and 0 in codes, tails
    for code, (_, err) in zip(codes, outputs, strict=True):
        if code == 6:
            assert "is held by the run on host" in err
    # Without the lock both runs run the cycles (the ids repeat) and a cycle may land twice.
    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]
    cycle_ids = [r["cycle_id"] for r in reports]
    assert len(cycle_ids) > 1 and cycle_ids == list(range(1, len(cycle_ids) + 1)), "every cycle ran once, in order"
    assert_target_equals_reference(config, tmp_path / "in")
