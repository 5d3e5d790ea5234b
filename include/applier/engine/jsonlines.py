"""JSON-lines files that only grow at the end: ``cycles.jsonl`` and the run ledger's cycle files.

A line is written whole with one ``write`` and ends with a newline, so a crash
in the middle of an append leaves at most a last line without its newline (a
*torn* line). Readers skip a torn line: it belongs to a write that never
completed. Reading the last lines reads the file backwards from its end, so it
costs the same however long the file has grown.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

_BLOCK = 65536


def encode_line(data: Any) -> bytes:
    """One JSON line: compact, keys sorted, ending with a newline."""
    return (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")


def append_line(path: Path, data: Any, *, durable: bool = True) -> int:
    """Append ``data`` as one line.

    Args:
        path: the file (created if missing).
        data: JSON-able.
        durable: fsync the file (and, when this append created it, its folder)
            before returning.

    Returns:
        The bytes written.
    """
    line = encode_line(data)
    created = not path.exists()
    with open(path, "ab") as fh:
        fh.write(line)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    if durable and created:
        _fsync_folder(path.parent)
    return len(line)


def read_lines(path: Path) -> Iterator[Any]:
    """Every complete line of ``path``, parsed, first to last, one at a time (none if it is missing).

    Raises:
        ValueError: a complete line is not JSON.
    """
    if not path.exists():
        return
    with open(path, "rb") as fh:
        for line in fh:
            if line.endswith(b"\n") and line.strip():
                yield json.loads(line)


def count_lines(path: Path) -> int:
    """How many complete, non-blank lines ``path`` holds (0 if it is missing)."""
    if not path.exists():
        return 0
    count = 0
    with open(path, "rb") as fh:
        for line in fh:
            count += line.endswith(b"\n") and bool(line.strip())
    return count


def last_lines(path: Path, n: int) -> list[Any]:
    """The last ``n`` complete lines of ``path``, parsed, in file order; read from the end.

    Raises:
        ValueError: one of those lines is not JSON.
    """
    if n < 1 or not path.exists():
        return []
    with open(path, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        tail = b""
        position = end
        while position > 0:
            step = min(_BLOCK, position)
            position -= step
            fh.seek(position)
            tail = fh.read(step) + tail
            if tail.count(b"\n") > n:
                break
    lines = tail.split(b"\n")
    complete = lines[:-1]  # the part after the last newline is empty or a torn line
    if position > 0:
        complete = complete[1:]  # the first piece may be the end of an earlier line
    return [json.loads(line) for line in [x for x in complete if x.strip()][-n:]]


def is_torn(path: Path) -> bool:
    """Whether ``path`` ends with a line without its newline (an append cut short)."""
    if not path.exists() or path.stat().st_size == 0:
        return False
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) != b"\n"


def replace_lines(path: Path, rows: Iterable[Any]) -> int:
    """Replace ``path`` with ``rows``, a line each: a temporary file, fsync, rename, fsync of the folder.

    ``rows`` may be read from ``path`` itself: the old file is read until the
    rename.

    Returns:
        The bytes written.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    written = 0
    with open(tmp, "wb") as fh:
        for row in rows:
            written += fh.write(encode_line(row))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_folder(path.parent)
    return written


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
