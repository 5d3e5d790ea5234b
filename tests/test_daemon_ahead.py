"""Spark's Python daemon forked from a zygote started ahead (local master), spoken to as Spark speaks to it."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from applier.engine import daemon_ahead
from applier.engine.daemon_ahead import ENV, _Signals, refusal, workers_env
from applier.engine.session import DEFAULTS

INCLUDE = str(Path(daemon_ahead.__file__).resolve().parents[2])


def _env(**extra: str) -> dict[str, str]:
    """An environment as the JVM gives the daemon: the workers' settings, the engine on the path."""
    # pytest's PYTEST_CURRENT_TEST changes between a fixture and its test
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "PYTEST_CURRENT_TEST")}
    return {**env, **workers_env({}), "PYTHONPATH": INCLUDE, **extra}


def _parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _ended(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    return process.wait(timeout=timeout)


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A zygote started as a run starts it, and its socket's path; told to end afterwards."""
    path = str(tmp_path / "socket")
    process = subprocess.Popen([sys.executable, "-m", "applier.engine.daemon_ahead", path], stdin=subprocess.PIPE,
                               env=_env(), cwd=tmp_path)  # fmt: skip
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert process.poll() is None and time.monotonic() < deadline, "the zygote did not listen"
        time.sleep(0.02)
    yield process, path
    if process.poll() is None:
        assert process.stdin is not None
        process.stdin.close()
        _ended(process)


def _shim(path: str, cwd: Path, **extra: str) -> subprocess.Popen[bytes]:
    """Spark's daemon module started as the JVM starts it, told where a zygote waits."""
    return subprocess.Popen([sys.executable, "-m", DEFAULTS["spark.python.daemon.module"], "pyspark.worker"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env(**{ENV: path}, **extra),
                            cwd=cwd)  # fmt: skip


def _port(shim: subprocess.Popen[bytes]) -> int:
    assert shim.stdout is not None
    data = shim.stdout.read(4)
    assert len(data) == 4, "no port from the daemon"
    port: int = struct.unpack("!i", data)[0]
    return port


def _worker_pid(port: int, secret: str | None = None) -> int:
    """Ask the daemon at ``port`` for a worker, as Spark's factory does: it answers with the forked worker's pid.

    With ``secret``, the worker is also asked to accept it (it compares it with its environment's).
    """
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        pid: int = struct.unpack("!i", connection.recv(4))[0]
        if secret is not None:
            connection.sendall(struct.pack("!i", len(secret)) + secret.encode())
            stream = connection.makefile("rb")
            (size,) = struct.unpack("!i", stream.read(4))
            assert stream.read(size) == b"ok", "the worker has the shim's secret"
    return pid


def test_the_zygote_becomes_the_daemon_spark_talks_to(
    zygote: tuple[subprocess.Popen[bytes], str], tmp_path: Path
) -> None:
    process, path = zygote
    shim = _shim(path, tmp_path, SPARK_REUSE_WORKER="1", PYTHON_WORKER_FACTORY_SECRET="s")  # Spark's own: allowed
    try:
        worker = _worker_pid(_port(shim), secret="s")  # the daemon took the shim's environment
        assert _parent_of(worker) == process.pid, "the worker was forked by the zygote, now the daemon"
        assert Path(f"/proc/{process.pid}/cwd").resolve() == tmp_path.resolve()
        assert shim.poll() is None, "the shim waits while the daemon lives"
    finally:
        assert shim.stdin is not None
        shim.stdin.close()  # as Spark stops its daemon: the daemon reads its stdin's end
    assert _ended(process) == 1, "pyspark's daemon ends so at its stdin's end"
    assert _ended(shim) == 0, "the shim ends with the daemon"


def test_a_shim_stopped_by_the_jvm_stops_the_daemon(
    zygote: tuple[subprocess.Popen[bytes], str], tmp_path: Path
) -> None:
    process, path = zygote
    shim = _shim(path, tmp_path)
    _port(shim)
    shim.terminate()  # Spark's factory destroys its daemon process: the shim passes the signal on
    # pyspark's daemon exits 1 on SIGTERM; one not yet past writing its port has no handler yet
    assert _ended(process) in (1, -signal.SIGTERM), "the daemon ended with the shim's signal"
    assert _ended(shim) == 0


def test_a_request_from_another_environment_is_refused_and_the_shim_starts_the_daemon_itself(
    zygote: tuple[subprocess.Popen[bytes], str], tmp_path: Path
) -> None:
    process, path = zygote
    shim = _shim(path, tmp_path, OMP_NUM_THREADS="4")  # an executor's setting the zygote was not started with
    try:
        worker = _worker_pid(_port(shim))
        assert _parent_of(worker) == shim.pid, "the shim is the daemon"
        assert _ended(process) == 0, "a zygote refused ends"
    finally:
        assert shim.stdin is not None
        shim.stdin.close()
    _ended(shim)


def test_a_shim_without_a_zygote_starts_the_daemon_itself(tmp_path: Path) -> None:
    shim = _shim(str(tmp_path / "none"), tmp_path)
    try:
        worker = _worker_pid(_port(shim))
        assert _parent_of(worker) == shim.pid
    finally:
        assert shim.stdin is not None
        shim.stdin.close()
    _ended(shim)


def test_the_zygote_ends_with_the_driver(zygote: tuple[subprocess.Popen[bytes], str]) -> None:
    process, _path = zygote
    assert process.stdin is not None
    process.stdin.close()  # the driver's end of its pipe: the driver gone
    assert _ended(process) == 0


def test_what_the_zygote_refuses() -> None:
    own = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "_": "/usr/bin/env"}
    request = {"executable": os.path.realpath(sys.executable), "prefix": sys.prefix, "env": dict(own)}
    assert refusal(request, own) is None
    spark_set = {"SPARK_HOME": "/s", "PYTHON_WORKER_FACTORY_SECRET": "x", "PYTHONPATH": "/p", "PYSPARK_PYTHON": "p"}
    assert refusal({**request, "env": {**own, **spark_set, "_": "/bin/bash"}}, own) is None
    assert (
        refusal({**request, "env": {**own, "OMP_NUM_THREADS": "2"}}, own) == "OMP_NUM_THREADS differs: '2' against '1'"
    )
    assert refusal({**request, "env": {"PATH": "/bin", "_": "x"}}, own) is not None, "a variable gone"
    assert "another interpreter" in str(refusal({**request, "executable": "/usr/bin/python2"}, own))
    assert "another interpreter" in str(refusal({**request, "prefix": "/usr"}, own)), "the same binary, another venv"


def test_the_workers_settings_are_spark_s() -> None:
    assert workers_env({}) == {"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0"),
                               "PYTHONUNBUFFERED": "YES"}  # fmt: skip
    conf = {"spark.task.cpus": "2", "spark.executorEnv.TZ": "UTC"}
    assert workers_env(conf)["OMP_NUM_THREADS"] == "2" and workers_env(conf)["TZ"] == "UTC"
    assert workers_env({"spark.executorEnv.OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"


@pytest.mark.parametrize(
    "conf",
    [
        {"spark.master": "spark://127.0.0.1:7077"},  # executors elsewhere start their own daemons
        {"spark.master": "local[2]", "spark.python.daemon.module": "pyspark.daemon"},  # an operator's daemon
        {"spark.master": "local[2]", "spark.pyspark.python": "/usr/bin/false"},  # another interpreter
    ],
)
def test_no_zygote_where_it_would_not_serve(conf: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(daemon_ahead, "_zygote", None)
    daemon_ahead.start({**DEFAULTS, **conf})
    assert daemon_ahead._zygote is None and ENV not in os.environ


def test_a_signal_before_the_daemon_is_known_is_passed_on_or_taken_as_before() -> None:
    taken: list[int] = []
    before = signal.signal(signal.SIGHUP, lambda signum, _frame: taken.append(signum))
    child = subprocess.Popen(["sleep", "60"])
    try:
        held = _Signals()
        os.kill(os.getpid(), signal.SIGTERM)  # Spark stopping its daemon while the shim still waits for the zygote
        held.forward_to(child.pid)
        assert child.wait(timeout=30) == -signal.SIGTERM, "passed on once the daemon is known"
        held.restore()
        declined = _Signals()
        os.kill(os.getpid(), signal.SIGHUP)
        assert not taken, "held while the zygote answers"
        declined.restore()  # the zygote declined: the shim is the daemon, and the signal is its own again
        assert taken == [signal.SIGHUP]
    finally:
        child.kill()
        signal.signal(signal.SIGHUP, before)


FAILING_ZYGOTE = """
import sys
from applier.engine import daemon_ahead
daemon_ahead.start({"spark.master": "local[1]", "spark.python.daemon.module": daemon_ahead.DAEMON_MODULE})
zygote = daemon_ahead._zygote
print(zygote is not None and zygote.wait(timeout=60) != 0)
"""


def test_a_zygote_that_cannot_listen_ends_without_a_word(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)  # a socket's path is at most 107 bytes
    deep.mkdir()
    env = {**_env(), "TMPDIR": str(deep)}
    done = subprocess.run([sys.executable, "-c", FAILING_ZYGOTE], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True", "the zygote started, and failed"
    assert done.stderr == "", "nothing of it reaches the driver's output"
