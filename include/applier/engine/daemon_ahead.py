"""Spark's Python daemon made ready ahead, when the executors run in the driver's JVM.

With a local master, Spark starts its Python daemon at a run's first Python
task, and both cores' first tasks wait for it: the interpreter's start and
the imports :mod:`applier.engine.spark_daemon` makes before forking workers
(pyspark's worker, pandas, pyarrow, the engine's task modules) took 0.6 s
here, most of a core, on the critical path of every run.

So, when a run starts its application with a local master, it first starts a
**zygote** (:func:`start`): a process of the same interpreter that makes
those imports while the driver's JVM starts, then waits. Its socket's path is
in the environment the JVM inherits (:data:`ENV`). When the JVM starts the
daemon module, that module (the **shim**, :func:`hand_over`) sends the
zygote its environment, path, arguments, folder and its standard streams
(the JVM's pipes, passed over the socket); the zygote takes them and runs
``pyspark.daemon`` as the shim would have. The shim then only waits for the
daemon's end and passes it the signals the JVM sends. The JVM talks to the
daemon through the same pipes and sockets as to one of its own.

The zygote serves one daemon, and only where it is the daemon Spark would
have started: it declines a request whose interpreter differs, or whose
environment differs from its own in anything but what Spark sets for its
Python processes (:data:`SPARK_SET`), and ends; the shim then starts the
daemon itself, as before. So does a shim that finds no zygote (an executor
on a cluster, a JVM started before the zygote, a second application of the
process). A zygote never asked ends when the driver does (it reads the
driver's end of a pipe).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

DAEMON_MODULE = "applier.engine.spark_daemon"
"""Spark's ``spark.python.daemon.module`` in the engine's defaults: the shim, when a zygote waits."""

ENV = "APPLIER_DAEMON_AHEAD"
"""The zygote's socket path, in the environment of the JVM and so of the daemon module it starts."""

SPARK_SET = ("SPARK_", "PYSPARK_", "_PYSPARK_", "PYTHON_WORKER_", "PYTHON_DAEMON_", "PYTHON_UNIX_DOMAIN_",
             "PYTHON_UDF_", "PYTHON_TRACEBACK_", "PYTHON_FAULTHANDLER_DIR", "PYTHONPATH", ENV)  # fmt: skip
"""Prefixes of the variables a daemon may have where the zygote has not, or has otherwise: Spark's and its
launcher's, read by pyspark when a task runs (and ``PYTHONPATH``, which the child takes as its ``sys.path``)."""

SHELL_SET = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})
"""Set by the shells between the driver and the daemon (spark-submit's scripts); nothing reads them."""

_zygote: subprocess.Popen[bytes] | None = None


def start(conf: Mapping[str, str]) -> None:
    """Start the zygote for an application of Spark properties ``conf``, once per process, when it applies.

    It applies with a local master, this interpreter as the workers', and
    :data:`DAEMON_MODULE` as Spark's daemon.
    Call it before the driver's JVM starts: the JVM inherits :data:`ENV`.
    """
    global _zygote
    master = conf.get("spark.master", "")
    if _zygote is not None or os.name != "posix" or not (master == "local" or master.startswith("local[")):
        return
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # under spark-submit: its JVM started without this environment
        return
    if conf.get("spark.python.daemon.module") != DAEMON_MODULE or not _same_interpreter(conf):
        return
    folder = tempfile.mkdtemp(prefix="applier-daemon-")
    path = os.path.join(folder, "socket")
    env = {**os.environ, **workers_env(conf)}
    try:
        # Its own output goes nowhere (as the daemon it takes the shim's): a zygote that fails is silent.
        _zygote = subprocess.Popen([sys.executable, "-m", __name__, path], stdin=subprocess.PIPE, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return
    os.environ[ENV] = path
    atexit.register(_stop, _zygote, folder)


def workers_env(conf: Mapping[str, str]) -> dict[str, str]:
    """What Spark sets in its Python workers' environment beside the executor's own, for properties ``conf``.

    ``spark.executorEnv.*``; ``OMP_NUM_THREADS`` as ``spark.task.cpus`` unless set so
    (SPARK-42613); the hash seed PySpark fixes (0 unless set); unbuffered output.
    """
    env = {
        key[len("spark.executorEnv.") :]: value for key, value in conf.items() if key.startswith("spark.executorEnv.")
    }
    env.setdefault("OMP_NUM_THREADS", conf.get("spark.task.cpus", "1"))
    return {**env, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0"), "PYTHONUNBUFFERED": "YES"}


def _same_interpreter(conf: Mapping[str, str]) -> bool:
    """Whether Spark's workers run this interpreter (``spark.pyspark.python``, ``PYSPARK_PYTHON``, or ``python3``)."""
    python = conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or "python3"
    found = shutil.which(python)
    return found is not None and os.path.realpath(found) == os.path.realpath(sys.executable)


def _stop(process: subprocess.Popen[bytes], folder: str) -> None:
    """The zygote told to end (its pipe closed: a daemon by then ends with its JVM), and its folder removed."""
    global _zygote
    if process.stdin is not None:
        process.stdin.close()  # not waited for: as a daemon, it ends after its JVM, which outlives this process
    shutil.rmtree(folder, ignore_errors=True)
    os.environ.pop(ENV, None)
    _zygote = None


# ---------------------------------------------------------------------------
# The shim: Spark's daemon module, handing its place over


def hand_over() -> None:
    """Have the zygote become the daemon in this process's place, then wait for its end and exit; else return.

    Returns (and the caller starts the daemon itself) when there is no
    zygote, or it declined. Never returns once the zygote is the daemon.
    """
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        return
    signals = _Signals()  # from here on, none of the JVM's is lost: passed on, or taken as it would have been
    with connection:
        try:
            connection.connect(path)
            request = {"executable": os.path.realpath(sys.executable), "prefix": sys.prefix, "env": dict(os.environ),
                       "path": sys.path, "argv": sys.argv, "cwd": os.getcwd()}  # fmt: skip
            payload = json.dumps(request).encode()
            socket.send_fds(connection, [struct.pack("!I", len(payload)) + payload], [0, 1, 2])
            reply = connection.makefile("rb").readline().split()
        except OSError:
            reply = []
        if len(reply) != 2 or reply[0] != b"ok":
            signals.restore()
            return
        signals.forward_to(int(reply[1]))
        while True:
            try:
                if not connection.recv(64):  # the daemon's end: every holder of its end of the connection gone
                    break
            except InterruptedError:
                continue
            except OSError:
                break
    os._exit(0)


class _Signals:
    """The shim's handling of the signals Spark may send its daemon: held until the daemon is known, then passed."""

    NUMBERS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self._daemon: int | None = None
        self._held: list[int] = []
        self._before = {number: signal.signal(number, self._handle) for number in self.NUMBERS}

    def _handle(self, signum: int, _frame: object) -> None:
        if self._daemon is None:
            self._held.append(signum)
        else:
            with contextlib.suppress(OSError):  # the daemon gone already
                os.kill(self._daemon, signum)

    def forward_to(self, daemon: int) -> None:
        """Pass the held signals, and every later one, to ``daemon``."""
        self._daemon = daemon
        held, self._held = self._held, []
        for signum in held:
            self._handle(signum, None)

    def restore(self) -> None:
        """The handlers as they were; a signal held is raised again, to be taken as it would have been."""
        for number, handler in self._before.items():
            signal.signal(number, handler)
        for signum in self._held:
            signal.raise_signal(signum)


# ---------------------------------------------------------------------------
# The zygote


def serve(path: str) -> None:
    """Listen at ``path``, make the daemon's imports, then become the daemon of the first shim that asks.

    Ends without one when stdin ends first (the driver gone) or the shim's request is refused.
    """
    from applier.engine import spark_daemon

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    own = dict(os.environ)
    spark_daemon.prepare(sys.path)
    while True:
        ready = select.select([0, listener.fileno()], [], [])[0]
        if listener.fileno() in ready:
            break
        if not os.read(0, 4096):
            return
    connection, _ = listener.accept()
    listener.close()
    try:
        request, streams = _receive(connection)
    except (OSError, ValueError):
        return
    if refusal(request, own) is not None:
        connection.sendall(b"no\n")
        return
    _become_daemon(request, streams, connection)


def refusal(request: Mapping[str, Any], own: Mapping[str, str]) -> str | None:
    """Why this process would not be the daemon the shim's ``request`` would start; None: it would."""
    if request.get("executable") != os.path.realpath(sys.executable) or request.get("prefix") != sys.prefix:
        return f"another interpreter: {request.get('executable')} in {request.get('prefix')}"
    env: Mapping[str, str] = request.get("env", {})
    for key in sorted(set(env) | set(own)):
        if env.get(key) != own.get(key) and not key.startswith(SPARK_SET) and key not in SHELL_SET:
            return f"{key} differs: {env.get(key)!r} against {own.get(key)!r}"
    return None


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, streams, _flags, _address = socket.recv_fds(connection, 1 << 16, 3)
    if len(streams) != 3 or len(data) < 4:
        for fd in streams:
            os.close(fd)
        raise ValueError("not a daemon's request")
    (size,) = struct.unpack("!I", data[:4])
    body = bytearray(data[4:])
    while len(body) < size:
        more = connection.recv(size - len(body))
        if not more:
            break
        body += more
    return json.loads(bytes(body)), streams


def _become_daemon(request: Mapping[str, Any], streams: list[int], connection: socket.socket) -> None:
    """Take the shim's streams, environment, path and arguments, and run ``pyspark.daemon`` as it would have."""
    import runpy

    from applier.engine import spark_daemon

    code = 1
    try:
        for target, fd in enumerate(streams):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv[:] = request["argv"]
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a daemon Spark starts
        spark_daemon.prepare(request["path"], preload_modules=False)
        os.register_at_fork(after_in_child=connection.close)  # a worker does not hold the shim's wait
        connection.sendall(f"ok {os.getpid()}\n".encode())
        runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        os._exit(code)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver's Ctrl-C is the driver's; its end ends this
    serve(sys.argv[1])
