"""One run at a time: an exclusive lock on a configuration's work folder.

Two runs of one configuration would race on ``checkpoint.json`` and
``intent.json``, delete each other's spill files and apply a cycle twice (a
keyless table would then hold duplicate rows). So a run takes
``<work_dir>/run.lock`` with ``flock(LOCK_EX | LOCK_NB)`` before it changes
anything, and holds it to its end; a second run is refused at once with
:class:`~applier.errors.RunLockedError` naming the holder.

The holder (host, pid, start time in UTC, run key) is written into the file
once the lock is taken. The kernel releases an ``flock`` when its process
dies, however it dies, so a lock left by a killed run never blocks: the next
run takes it and overwrites the stale holder text. The file descriptor is
not inherited by programs the run starts (Python opens it close-on-exec), so
a JVM outliving its driver does not keep the lock.

A target that keeps state outside the folder adds a lock of its own
(:meth:`applier.targets.Target.run_lock`): the PostgreSQL target holds an
advisory lock for its checkpoint row, for runs whose folders differ.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

from applier.errors import RunLockedError

LOCK_FILE = "run.lock"
# A holder writes its name right after taking the lock: a refused run waits this long for it.
_NAME_WAIT_SECONDS = 0.5


@dataclass(frozen=True)
class Holder:
    """The run that holds a lock, as written into the lock file.

    Attributes:
        host: the host name of the machine the run is on.
        pid: the run's process id on that host.
        started_at: when it took the lock, ISO 8601 in UTC.
        run_key: the run's key in the run ledger, if it has one.
    """

    host: str
    pid: int
    started_at: str
    run_key: str | None = None

    def describe(self) -> str:
        """The holder in words, on one line: ``the run on host h, pid 12, started 2026-…Z, run key k``."""
        key = f", run key {self.run_key}" if self.run_key else ""
        return " ".join(f"the run on host {self.host}, pid {self.pid}, started {self.started_at}{key}".split())

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The holder a lock file names; None when it is empty or not a holder record."""
        try:
            data = json.loads(text)
            return cls(str(data["host"]), int(data["pid"]), str(data["started_at"]), data.get("run_key"))
        except (ValueError, TypeError, KeyError):
            return None


class RunLock:
    """The exclusive run lock of one configuration's work folder.

    Use it as a context manager (taken on entry, released on exit), or call
    :meth:`acquire` and :meth:`release`. Two ``RunLock`` objects exclude each
    other even in one process: each opens the file on its own.

    Args:
        work_dir: the configuration's work folder (``config.work_dir``), created if missing.
        configuration_name: named in the refusal.
        run_key: the run's key, written into the holder record.
        file_name: the lock file's name in ``work_dir`` (``applier extract`` locks its
            intermediate folder with a name readers ignore).
        activity: what the holder does, in the refusal (``applying``, ``extracting into``).
    """

    def __init__(
        self,
        work_dir: Path,
        configuration_name: str,
        *,
        run_key: str | None = None,
        file_name: str = LOCK_FILE,
        activity: str = "applying",
    ) -> None:
        self.path = Path(work_dir) / file_name
        self.configuration_name = configuration_name
        self.run_key = run_key
        self.activity = activity
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> Holder:
        """Take the lock and write this run as its holder.

        Returns:
            The holder record written into the lock file.

        Raises:
            RunLockedError: another run holds the lock (the message names it);
                nothing was changed.
            RuntimeError: this object holds the lock already.
        """
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this object")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Opened without truncating: the holder's text must survive a refused open.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(self.describe_lock(), self._holder_text(), self.activity) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        holder = Holder(socket.gethostname(), os.getpid(), _now_iso(), self.run_key)
        _overwrite(fd, json.dumps(asdict(holder)) + "\n")
        return holder

    def release(self) -> None:
        """Clear the holder record and release the lock (nothing when it is not held)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # a holder text in an unlocked file can only be a killed run's
        finally:
            os.close(fd)  # closing the last descriptor releases the flock

    def describe_lock(self) -> str:
        """The lock in words: ``the run lock of configuration c (/…/run.lock)``."""
        kind = "run lock" if self.activity == "applying" else f"lock for {self.activity}"
        return f"the {kind} of configuration {self.configuration_name} ({self.path})"

    def _holder_text(self) -> str:
        """The holder named in the lock file, waiting briefly for one that has just taken the lock."""
        deadline = time.monotonic() + _NAME_WAIT_SECONDS
        while True:
            try:
                holder = Holder.parse(self.path.read_text(errors="replace"))
            except OSError:
                holder = None
            if holder is not None:
                return holder.describe()
            if time.monotonic() >= deadline:
                return "a run that has not written its name into the lock file"
            time.sleep(0.05)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()


def running_holder(work_dir: Path, file_name: str = LOCK_FILE) -> Holder | None:
    """The run holding the lock now, as its file names it; None when no run holds it.

    Read without touching the lock (taking it even for a moment would refuse a
    run starting then). A released lock's file is empty; a killed run's still
    names it, so a holder on this host counts only while its process lives.
    One on another host (a shared folder) is taken at its word.
    """
    try:
        holder = Holder.parse((Path(work_dir) / file_name).read_text(errors="replace"))
    except OSError:
        return None
    if holder is None or (holder.host == socket.gethostname() and not _alive(holder.pid)):
        return None
    return holder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _overwrite(fd: int, text: str) -> None:
    """Replace the file's content with ``text`` and flush it to disk."""
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, text.encode())
    os.fsync(fd)


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
