"""How a command ends for its user: one line on stderr and the documented exit code, whatever happened.

- An :class:`~applier.errors.ApplierError` is its message on one line and its exit code (2 to 8).
- Output piped into a program that stops reading (``applier status | head -1``)
  ends the command quietly with exit code 0: the reader had what it wanted.
- Anything else is a bug: one line naming the exception and the file its
  traceback was written to (in the temporary folder, ``$TMPDIR`` or ``/tmp``),
  exit code 1. ``APPLIER_TRACEBACK=1`` prints the traceback on stderr instead.
- Ctrl-C: ``applier: interrupted``, exit code 130.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from applier.errors import ApplierError

INTERRUPTED = 130


def error_line(error: ApplierError) -> str:
    """The one line an Applier error is shown as."""
    return "applier: error: " + " ".join(str(error).split())


def run_command(handler: Callable[[Any], int], args: Any, command: str) -> int:
    """Run ``handler(args)`` and return its exit code, reporting any failure on one line of stderr.

    Args:
        handler: the command's function.
        args: its parsed arguments.
        command: its name, in the traceback file's name.
    """
    try:
        code = handler(args)
        sys.stdout.flush()  # a broken pipe shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        silence_stdout()
        return 0
    except ApplierError as e:
        _stderr(error_line(e))
        return e.exit_code
    except KeyboardInterrupt:
        _stderr("applier: interrupted")
        return INTERRUPTED
    except Exception as e:
        return report_unexpected(e, command)


def report_unexpected(error: BaseException, command: str) -> int:
    """Write an unexpected error's traceback to a file and show one line naming it; return exit code 1."""
    text = "".join(traceback.format_exception(error))
    what = " ".join(f"{type(error).__name__}: {error}".split())
    if os.environ.get("APPLIER_TRACEBACK") == "1":
        _stderr(text.rstrip())
        return 1
    try:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        path = Path(tempfile.gettempdir()) / f"applier-{command}-{stamp}-{os.getpid()}.traceback"
        path.write_text(text, encoding="utf-8")
        where = f"the traceback is in {path}"
    except OSError as e:
        where = f"its traceback could not be written ({e.strerror}); APPLIER_TRACEBACK=1 prints it"
    _stderr(f"applier: unexpected error: {what}; {where}")
    return 1


def flush_stdout() -> None:
    """Flush standard output; a reader that went away silences it instead of a traceback at exit."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()


def silence_stdout() -> None:
    """Point standard output at ``/dev/null``, so that nothing more is written to a closed pipe (not even at exit)."""
    # Without a file descriptor (stdout replaced, as under pytest) nothing is flushed to a pipe either.
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _stderr(line: str) -> None:
    with contextlib.suppress(OSError):  # BrokenPipeError too: stderr's reader went away
        print(line, file=sys.stderr, flush=True)
