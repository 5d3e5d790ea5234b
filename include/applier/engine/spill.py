"""Spill files: rows that left the queue memory for disk, read back as a stream.

A spill file is a sequence of Arrow IPC streams, one per spool: each spool
appends a whole stream (schema, batches, end marker) and closes the file, so
nothing stays open between spools (thousands of spooled transactions cost
no file handles and no writer buffers) and a file is read back batch by batch,
never whole (:func:`read_spill`). Names:

- ``<configuration_name>_<safe xid>.spill``: an open transaction's rows;
- ``<configuration_name>_<table id>.spill``: a compiled table waiting to be applied;
- ``<configuration_name>_--committed.spill``: the rows of the transactions a
  cycle commits that were still in memory, handed to Spark as one file;
- ``<configuration_name>_--compiled/``: a folder of the chunk files the
  compile job writes (each table's net changes), removed with the cycle;
- ``<configuration_name>_--open/``: a folder where the compile job writes the
  rows of the transactions still open after the cycle, for the buffers
  (:mod:`applier.engine.open_rows`), emptied once they are buffered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.ipc as ipc

SPILL_SUFFIX = ".spill"
COMMITTED_PART = "--committed"
"""The name part of the file of a cycle's committed rows from memory (``safe_xid`` never yields it)."""
COMPILED_PART = "--compiled"
"""The name part of the folder where the compile job writes a cycle's chunk files."""
OPEN_PART = "--open"
"""The name part of the folder where the compile job writes a cycle's still-open rows."""
# Longer encodings are replaced by a hash so that a file name stays far below 255 bytes.
_MAX_SAFE_LENGTH = 120
# "--" never occurs in an escaped name ("-" is always followed by two hex digits),
# so hashed names cannot collide with escaped ones.
_HASHED_PREFIX = "--"


def safe_xid(xid: str) -> str:
    """Encode an xid (or a table name) for a file name, so that no two share one name.

    Letters and digits are kept; every other UTF-8 byte (``_`` and ``-``
    included) becomes ``-XX`` in upper-case hex. The result holds no ``_``, so
    ``<configuration_name>_<safe xid>`` splits unambiguously at its last ``_``
    even though configuration names may contain ``_``. An encoding longer than
    120 characters is replaced by ``--`` and the SHA-256 hex of the xid.

    Args:
        xid: the source transaction id, any string.

    Returns:
        A name part made of ``[A-Za-z0-9-]`` only (empty for an empty xid).
    """
    parts: list[str] = []
    for char in xid:
        if char.isascii() and char.isalnum():
            parts.append(char)
        else:
            parts.extend(f"-{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
    encoded = "".join(parts)
    if len(encoded) > _MAX_SAFE_LENGTH:
        return _HASHED_PREFIX + hashlib.sha256(xid.encode("utf-8", "surrogatepass")).hexdigest()
    return encoded


class SpillEvent(NamedTuple):
    """A spill file was created or removed; ``bytes`` is its size on disk at that moment."""

    kind: str  # "created" | "removed"
    name: str
    bytes: int


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def append_spill(path: Path, tables: Iterable[pa.Table]) -> int:
    """Append ``tables`` (one schema) to the spill file ``path`` as one IPC stream; returns bytes written."""
    sink = pa.BufferOutputStream()
    writer: ipc.RecordBatchStreamWriter | None = None
    for table in tables:
        if writer is None:
            writer = ipc.new_stream(sink, table.schema)
        writer.write_table(table)
    if writer is None:
        return 0
    writer.close()
    data = sink.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as out:
        out.write(data)
    return int(data.size)


def read_spill(path: Path | str) -> Iterator[pa.RecordBatch]:
    """The batches of a spill file, stream after stream, one batch in memory at a time."""
    with pa.memory_map(str(path)) as source:
        while source.tell() < source.size():
            yield from ipc.open_stream(source)


def spill_segments(path: Path | str) -> int:
    """How many spools wrote to a spill file (its IPC streams)."""
    count = 0
    with pa.memory_map(str(path)) as source:
        while source.tell() < source.size():
            for _ in ipc.open_stream(source):
                pass
            count += 1
    return count
