"""A compiled cycle: each table's net changes, held under the queue-memory budget until applied.

The compile job's executors write each table's net changes as chunk files in
the cycle's compile folder, ``<spill_dir>/<configuration_name>_--compiled/``
(:meth:`CompiledCycle.add_file`; a table's chunks may come from several
partitions). Chunks handed over in memory (:meth:`CompiledCycle.add`) wait in a
per-table buffer charged to the queue as ``tables``; when the queue is full the
largest buffers spool to ``<spill_dir>/<configuration_name>_<table id>.spill``
(:mod:`applier.engine.spill`). A target takes a table's changes with
``compiled[name]`` when it applies it, which charges them as ``compiled`` until
it calls :meth:`CompiledCycle.release`: the driver never holds the whole
compiled cycle at once, only the buffers that fit the budget and the tables
being applied.

Targets that apply several tables at once ask :meth:`CompiledCycle.admit`
first (flow control, as ER's full queue holds its sender back): a table is
taken only while what it adds keeps the queue within its budget, or when no
other table is being applied, so a table larger than the budget still goes,
alone.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from applier.engine.changes import TableChanges, arrow_schema, counted_table, split_keyed, typed
from applier.engine.identity import COUNT, NET_OP, chunk_stats
from applier.engine.queue import MemoryQueue
from applier.engine.spill import COMPILED_PART, SPILL_SUFFIX, append_spill, file_size, read_spill, safe_xid
from applier.intermediate.schema import TableDef


def table_id(name: str) -> str:
    """A table's name as a file-name part: letters and digits kept, other bytes as ``-XX``."""
    return safe_xid(name)


@dataclass
class _Buffer:
    chunks: list[pa.Table] = field(default_factory=list)
    memory_bytes: int = 0
    path: Path | None = None
    files: list[Path] = field(default_factory=list)
    outside_bytes: int = 0  # in memory once read: its chunk files' and what spooled
    stats: dict[str, int] = field(default_factory=lambda: {"I": 0, "U": 0, "D": 0})


class CompiledCycle(Mapping[str, TableChanges]):
    """Every touched table's net changes of one cycle, materialised one table at a time.

    Args:
        tables: the touched tables' definitions (the latest of the cycle).
        truncated: the tables the cycle empties first.
        queue: the queue-memory budget the buffers are charged to.
        spill_dir: where table buffers spool.
        configuration_name: prefix of spill file names.
    """

    # Two holders are equal only when they are one: a Mapping's == would read every table of both.
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __init__(
        self,
        tables: Mapping[str, TableDef],
        truncated: frozenset[str],
        queue: MemoryQueue,
        spill_dir: Path,
        configuration_name: str,
    ) -> None:
        self.tables = dict(tables)
        self.truncated = truncated
        self.queue = queue
        self.spill_dir = Path(spill_dir)
        self.configuration_name = configuration_name
        self._buffers = {name: _Buffer() for name in self.tables}
        self._in_flight: dict[str, int] = {}
        self._admitted: dict[str, int] = {}  # admitted (:meth:`admit`), not yet taken: the bytes each will add
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self.spill_created: list[dict[str, Any]] = []
        self.spill_removed: list[dict[str, Any]] = []
        self.file_bytes = 0
        self._closed = False
        self.folder = self.spill_dir / f"{configuration_name}_{COMPILED_PART}"
        # Several holders share the folder while a cycle's groups wait to be applied; the first clears
        # what a crash left, the last removes it.
        with _FOLDERS_LOCK:
            if not _LIVE.get(self.folder):
                shutil.rmtree(self.folder, ignore_errors=True)
            _LIVE[self.folder] = _LIVE.get(self.folder, 0) + 1
        self.folder.mkdir(parents=True, exist_ok=True)
        queue.register(self)

    # ------------------------------------------------------------------ filling

    def add_file(self, name: str, path: Path, nbytes: int, stats: Mapping[str, int]) -> None:
        """Take note of a chunk file the compile job wrote for ``name`` (nothing is read now).

        Args:
            name: the table.
            path: the chunk file, in :attr:`folder`.
            nbytes: the chunk's bytes in memory once read.
            stats: its net ``I``/``U``/``D`` rows.
        """
        buffer = self._buffers[name]
        buffer.files.append(path)
        buffer.outside_bytes += nbytes
        for op in ("I", "U", "D"):
            buffer.stats[op] += stats[op]
        self.file_bytes += nbytes

    def add(self, name: str, chunk: pa.Table) -> None:
        """Hold one chunk of ``name``'s net changes (from the compile job), spooling if the queue is full."""
        buffer = self._buffers[name]
        for op, n in chunk_stats(self.tables[name], chunk).items():
            buffer.stats[op] += n
        buffer.chunks.append(chunk)
        buffer.memory_bytes += chunk.nbytes
        self.queue.charge("tables", chunk.nbytes)
        self.queue.make_room()

    def spool_candidates(self) -> Iterator[tuple[int, str]]:
        return ((b.memory_bytes, name) for name, b in self._buffers.items() if b.memory_bytes)

    def spool(self, name: str) -> None:
        """Append ``name``'s chunks in memory to its spill file and free them."""
        buffer = self._buffers[name]
        if not buffer.chunks:
            return
        created = buffer.path is None
        if buffer.path is None:
            buffer.path = self.spill_dir / f"{self.configuration_name}_{table_id(name)}{SPILL_SUFFIX}"
        append_spill(buffer.path, buffer.chunks)
        if created:
            self.spill_created.append({"file": buffer.path.name, "bytes": file_size(buffer.path)})
        self.queue.release("tables", buffer.memory_bytes)
        self.queue.note_spooled("tables", name, buffer.path.name, buffer.memory_bytes)
        buffer.outside_bytes += buffer.memory_bytes
        buffer.chunks, buffer.memory_bytes = [], 0

    # ------------------------------------------------------------------ taking

    def admit(self, name: str) -> None:
        """Wait until taking ``name`` keeps the queue within its budget, or until no other table is being applied.

        What ``name`` adds is what it holds outside memory (chunk files, its
        spill file); tables admitted and not yet taken count as taken. Called
        by each thread of a target before it takes a table, never by one that
        holds a table it has not released (it would wait for itself).
        """
        adds = self._buffers[name].outside_bytes
        with self._room:
            while (self._in_flight or self._admitted) and (
                self.queue.held + sum(self._admitted.values()) + adds > self.queue.budget
            ):
                self._room.wait()
            self._admitted[name] = adds

    def __getitem__(self, name: str) -> TableChanges:
        """``name``'s net changes, read back from its spill file if it spooled; charged until :meth:`release`."""
        buffer = self._buffers[name]
        table = self.tables[name]
        parts: list[pa.Table] = []
        for path in [*buffer.files, *([buffer.path] if buffer.path is not None else [])]:
            parts.extend(pa.Table.from_batches([b]) for b in read_spill(path))
        parts.extend(buffer.chunks)
        changes = to_table_changes(table, name in self.truncated, parts)
        size = changes.upserts.nbytes + changes.deletes.nbytes + (changes.counted.nbytes if changes.counted else 0)
        self.queue.charge("compiled", size)
        with self._lock:
            self._in_flight[name] = self._in_flight.get(name, 0) + size
            self._admitted.pop(name, None)
        return changes

    def in_files(self, name: str) -> tuple[list[Path], int] | None:
        """``name``'s chunk files and spill file, and their bytes once read; None when some chunk is in memory.

        A table whose changes are all in files can be applied by a process
        that reads them itself (a Spark executor): nothing is charged here.
        """
        buffer = self._buffers[name]
        if buffer.chunks:
            return None
        return [*buffer.files, *([buffer.path] if buffer.path is not None else [])], buffer.outside_bytes

    def release(self, name: str) -> None:
        """The target is done with ``name``'s changes: they no longer count, nor do its buffered chunks."""
        with self._lock:
            size = self._in_flight.pop(name, 0)
            self._admitted.pop(name, None)
        self.queue.release("compiled", size)
        buffer = self._buffers[name]
        self.queue.release("tables", buffer.memory_bytes)
        buffer.chunks, buffer.memory_bytes = [], 0
        with self._room:
            self._room.notify_all()

    def __iter__(self) -> Iterator[str]:
        return iter(self._buffers)

    def __len__(self) -> int:
        return len(self._buffers)

    def stats(self, name: str) -> dict[str, int]:
        """``{"I", "U", "D", "T"}`` net rows of ``name`` (for a keyless table, copies inserted and deleted)."""
        return {**self._buffers[name].stats, "T": int(name in self.truncated)}

    def close(self) -> None:
        """Free every buffer and delete the spill files and chunk files (after the cycle committed, or failed)."""
        if self._closed:
            return
        self._closed = True
        for name in list(self._buffers):
            self.release(name)
            path = self._buffers[name].path
            if path is not None:
                size = file_size(path)
                path.unlink(missing_ok=True)
                self.spill_removed.append({"file": path.name, "bytes": size})
                self._buffers[name].path = None
            for chunk_file in self._buffers[name].files:
                chunk_file.unlink(missing_ok=True)
            self._buffers[name].files = []
        with _FOLDERS_LOCK:
            live = _LIVE.get(self.folder, 0)
            if live:
                _LIVE[self.folder] = live - 1
                if live == 1:
                    del _LIVE[self.folder]
                    shutil.rmtree(self.folder, ignore_errors=True)
        self.queue.unregister(self)


_LIVE: dict[Path, int] = {}  # holders not yet closed, per compile folder
_FOLDERS_LOCK = threading.Lock()


def admit(changes: Mapping[str, TableChanges], name: str) -> None:
    """Wait for room in a compiled cycle's queue before taking ``name`` (plain mappings, as in tests, need nothing)."""
    if isinstance(changes, CompiledCycle):
        changes.admit(name)


def release(changes: Mapping[str, TableChanges], name: str) -> None:
    """Tell a compiled cycle that ``name`` was applied (plain mappings, as in tests, need nothing)."""
    if isinstance(changes, CompiledCycle):
        changes.release(name)


def to_table_changes(table: TableDef, truncated: bool, parts: list[pa.Table]) -> TableChanges:
    """A table's :class:`TableChanges` from its chunks of net changes (``final_table``'s layout)."""
    schema = arrow_schema(table)
    if table.primary_key:
        layout = pa.schema([pa.field(NET_OP, pa.string()), *(f.with_nullable(True) for f in schema)])
    else:
        layout = pa.schema([*(f.with_nullable(True) for f in schema), pa.field(COUNT, pa.int64())])
    # A chunk the compile wrote is in the layout already: a cast of each of its columns to its own type cost
    # a 1,000-table cycle about a second of its Delta writes.
    laid_out = [p if p.schema.equals(layout) else p.cast(layout) for p in parts]
    result = pa.concat_tables(laid_out) if laid_out else layout.empty_table()
    counted: pa.Table | None = None
    new: pa.Array | None = None
    if table.primary_key:
        upserts, deletes, stats, new = split_keyed(result, schema, table.primary_key)
    else:
        counted, stats = counted_table(result, schema)
        upserts, deletes = typed(schema.empty_table(), schema), pa.table({})
    stats["T"] = int(truncated)
    return TableChanges(table, truncated, upserts, deletes, counted, stats, new)
