"""The driver's JVM launched ahead: ``applier run`` starts it before it imports the engine, PySpark then joins it.

PySpark launches its JVM (``spark-submit pyspark-shell``) when the first
``SparkContext`` is made, after ``import pyspark`` (0.2 s) and, in a run,
after the engine's imports and checks: 0.4-0.5 s into the process, with the
JVM's second or so of start-up still ahead. :func:`launch` runs the same
command as soon as the configuration is read, while Python is still
importing; :meth:`LaunchedJvm.joined` later hands it to PySpark, which
connects to a running JVM when ``PYSPARK_GATEWAY_PORT`` and
``PYSPARK_GATEWAY_SECRET`` name it (as it does under spark-submit). On the
narrow benchmark workload in one cycle (``local[2]``) the application was
ready 0.2 s sooner and the run ended 0.27 s sooner (six runs each,
alternating).

A run may still end before it needs Spark (nothing to do, another run holds
the lock, a damaged state file, a refused pair): a JVM launched ahead and
never joined is stopped, and its output, held back until it was joined, is
dropped. So the JVM is launched only when a pair waits after the checkpoint,
and any doubt (no ``spark-submit`` found, a state file that cannot be read,
a process started by spark-submit itself) leaves the launch to PySpark, as
before. A launch that failed (no Java) is dropped too, and PySpark's own
launch then fails with its usual message.

The JVM's own output goes through this process (to hold it back), but the
JVM also holds this process's stdout and stderr open, unused, as PySpark's
JVM does by inheriting them: whoever reads a run's output to its end still
waits for the JVM, which outlives the Python driver by a moment (and writes
a class archive at its exit when asked to: ``make setup`` relies on that).

The command, environment and connection file follow
``pyspark.java_gateway.launch_gateway`` (the pinned PySpark's).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

from applier.engine import daemon_ahead
from applier.engine.jvm_archive import launcher_env

JOIN_TIMEOUT_S = 300.0
"""How long :meth:`LaunchedJvm.joined` waits for the JVM's connection file (Spark's own wait has no limit)."""


def spark_home() -> Path | None:
    """Where ``bin/spark-submit`` is: ``SPARK_HOME``, else the installed pyspark package (found, not imported)."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        spec = importlib.util.find_spec("pyspark")
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        home = locations[0] if locations else None
    return Path(home) if home and (Path(home) / "bin" / "spark-submit").is_file() else None


def launch(conf: Mapping[str, str]) -> LaunchedJvm | None:
    """Launch the driver's JVM with Spark properties ``conf``, as PySpark would; None when PySpark should.

    None under spark-submit (the JVM is there already), off POSIX, or without ``spark-submit``.
    """
    home = spark_home()
    if "PYSPARK_GATEWAY_PORT" in os.environ or os.name != "posix" or home is None:
        return None
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # as start_spark sets it
    command = [str(home / "bin" / "spark-submit")]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell"))
    # SPARK_HOME given, spark-submit need not run Python to find it; its launcher JVM starts archived.
    daemon_ahead.start(conf)  # the JVM inherits where it waits
    return LaunchedJvm(command, dict(conf), {"SPARK_HOME": str(home), **launcher_env()})


class LaunchedJvm:
    """A driver JVM started ahead of PySpark, its output held back until PySpark joins it.

    Args:
        command: the ``spark-submit`` command line.
        conf: the Spark properties it was given (PySpark's must be the same to join it).
        extra_env: set in its environment besides this process's.
    """

    def __init__(self, command: list[str], conf: dict[str, str], extra_env: Mapping[str, str]) -> None:
        self.conf = conf
        self._folder = tempfile.mkdtemp(prefix="applier-jvm-")
        self._info = Path(self._folder) / "connection"
        env = {**os.environ, "SPARK_CONNECT_MODE": "0", "_PYSPARK_DRIVER_CONN_INFO_PATH": str(self._info), **extra_env}
        self._joined = False
        self._dropped = False
        self._lock = threading.Lock()
        self._held: list[tuple[str, str]] = []  # (sink, line) until joined
        # The JVM also holds this process's own stdout and stderr, unused, as PySpark's JVM holds them: whoever
        # reads them to their end (a scheduler's task, a pipe) still waits for the JVM's exit, which outlives
        # this process by a moment (a class archive is written then, say).
        held = _duplicates(sys.__stdout__, sys.__stderr__)
        try:
            # stdin stays open: the JVM ends when it reads its end (this process gone), as PySpark arranges.
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                pass_fds=held,
                preexec_fn=_ignore_sigint,  # Ctrl-C stops the run, which stops its JVM
            )
        finally:
            for fd in held:
                os.close(fd)
        self._relays = [self._relay(self.process.stdout, "stdout"), self._relay(self.process.stderr, "stderr")]

    def _relay(self, source: IO[bytes] | None, sink: str) -> threading.Thread:
        thread = threading.Thread(target=self._forward, args=(source, sink), name=f"jvm-{sink}", daemon=True)
        thread.start()
        return thread

    def _forward(self, source: IO[bytes] | None, sink: str) -> None:
        """Copy the JVM's lines to this process's ``sink`` once joined; hold them until then, drop them if dropped."""
        assert source is not None
        for raw in iter(source.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            with self._lock:
                if self._joined:
                    _write(sink, line)
                elif not self._dropped:
                    self._held.append((sink, line))

    @contextlib.contextmanager
    def joined(self, conf: Mapping[str, str]) -> Iterator[bool]:
        """While PySpark makes its context: whether it may join this JVM (then named in the environment).

        False (and the JVM stopped) when ``conf`` differs from the launch's or the JVM
        failed to start: PySpark launches its own then.
        """
        port_secret = self._connection() if dict(conf) == self.conf else None
        if port_secret is None:
            self.drop()
            yield False
            return
        os.environ["PYSPARK_GATEWAY_PORT"], os.environ["PYSPARK_GATEWAY_SECRET"] = port_secret
        with self._lock:  # what it printed so far comes out now, the rest as it comes
            self._joined = True
            for sink, line in self._held:
                _write(sink, line)
            self._held.clear()
        try:
            yield True
        finally:
            del os.environ["PYSPARK_GATEWAY_PORT"], os.environ["PYSPARK_GATEWAY_SECRET"]
            shutil.rmtree(self._folder, ignore_errors=True)

    def _connection(self) -> tuple[str, str] | None:
        """The gateway's port and secret, once the JVM wrote them; None if it ended (or hung) first."""
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while not self._info.is_file():
            if self.process.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        with open(self._info, "rb") as info:  # PySpark's format: an int, then a length and UTF-8
            port, length = struct.unpack("!ii", info.read(8))
            return str(port), info.read(length).decode("utf-8")

    def drop(self) -> None:
        """Stop the JVM if PySpark never joined it, its output dropped; nothing once joined."""
        with self._lock:
            if self._joined or self._dropped:
                return
            self._dropped = True
            self._held.clear()
        with contextlib.suppress(OSError):
            self.process.kill()
        self.process.wait()
        for relay in self._relays:
            relay.join(timeout=5)
        shutil.rmtree(self._folder, ignore_errors=True)


def _duplicates(*streams: IO[str] | None) -> tuple[int, ...]:
    """Duplicates of the streams' descriptors, those that have one."""
    found = []
    for stream in filter(None, streams):
        with contextlib.suppress(OSError, ValueError):  # closed, or not a file
            found.append(os.dup(stream.fileno()))
    return tuple(found)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _write(sink: str, line: str) -> None:
    stream = getattr(sys, sink)  # looked up each time: a caller may have replaced it
    with contextlib.suppress(OSError, ValueError):  # the run's own output closed at its exit
        stream.write(line)
        stream.flush()
