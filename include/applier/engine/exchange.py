"""The compile's shuffle, in Arrow files: the events go from one Python worker to another without becoming JVM rows.

Spark's own shuffle took each event batch the Python workers handed back,
made it JVM rows, wrote and read them as its shuffle files, then made them
Arrow again for the Python step after it: on the narrow benchmark workload
the JVM spent about 1.8 CPU s in the first step and 2 s in the second, on
two cores the Python workers needed, for data that is Arrow on both sides.

Here the first step's task writes its events to one Arrow IPC file in the
exchange folder (:func:`write`), each batch holding one partition's events
(:func:`partition_of`: a table's identities with one salt always meet in one
partition), and hands back only where each partition's batches are. A
second Spark job runs a task per partition that received events; it reads
its batches from every file (:func:`read`) and nets them. The folder must be
one every executor reaches, as the chunk files' is. A task run again
rewrites its file whole under the same name, and the driver takes the
locations the job's successful attempts returned.
"""

from __future__ import annotations

import os
import shutil
import uuid
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from applier.engine.part_files import temporary

FOLDER = "exchange"
"""The exchange's folder, inside the compile's."""

LOCATIONS = pa.schema([("partition", pa.int32()), ("path", pa.string()), ("batches", pa.list_(pa.int32()))])
"""What a first-step task hands back (:func:`write`'s dicts, as Arrow): per partition, its file and which of
its batches hold that partition's events."""
LOCATIONS_DDL = "`partition` int, `path` string, `batches` array<int>"
""":data:`LOCATIONS` as Spark's DDL (the output of a ``mapInArrow`` that writes the exchange)."""


_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")
"""LZ4, as Spark's shuffle: the wide benchmark cycle's events took 421 MiB on disk against 1,021 uncompressed
(its pairs 311 MiB), for a cost within the runs' noise (33.1 and 34.7 s against 34.5 and 32.0)."""


def partition_of(events: pa.RecordBatch, partitions: int) -> np.ndarray:
    """Each event's partition: its table's CRC-32 plus its salt, modulo ``partitions`` (the same in every process).

    A busy table's salts go to consecutive partitions, so its identities spread evenly.
    """
    tables = events.column("table").dictionary_encode()
    names = tables.dictionary.to_pylist()
    base = np.fromiter((zlib.crc32(name.encode()) for name in names), dtype=np.int64, count=len(names))
    salts = events.column("salt").to_numpy(zero_copy_only=False).astype(np.int64)
    partition: np.ndarray = (base[tables.indices.to_numpy(zero_copy_only=False)] + salts) % partitions
    return partition


def write(folder: str, partitions: int, events: Iterable[pa.RecordBatch]) -> Iterator[dict[str, Any]]:
    """The events of one task written to one file of ``folder``, a batch per partition; their :data:`LOCATIONS`.

    The file is named after the task's partition in the job, so an attempt
    run again replaces it; it is moved into place whole once written.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    task = str(context.partitionId()) if context is not None else uuid.uuid4().hex  # outside Spark: tests
    path = Path(folder, f"{task}.arrow")
    batches: dict[int, list[int]] = {}
    writer: pa.RecordBatchFileWriter | None = None
    written = 0
    staged = temporary(path)
    try:
        for batch in events:
            if not batch.num_rows:
                continue
            if writer is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                writer = pa.ipc.new_file(str(staged), batch.schema, options=_OPTIONS)
            where = partition_of(batch, partitions)
            for partition in np.unique(where).tolist():
                writer.write_batch(batch.filter(pa.array(where == partition)))
                batches.setdefault(partition, []).append(written)
                written += 1
    except BaseException:
        if writer is not None:
            writer.close()
            staged.unlink(missing_ok=True)
        raise
    if writer is None:
        return
    writer.close()
    os.replace(staged, path)
    for partition, indices in sorted(batches.items()):
        yield {"partition": partition, "path": str(path), "batches": indices}


def by_partition(locations: Iterable[Mapping[str, Any]]) -> list[list[tuple[str, list[int]]]]:
    """The first step's :data:`LOCATIONS`, per partition that received events (in partition order)."""
    found: dict[int, list[tuple[str, list[int]]]] = {}
    for row in locations:
        found.setdefault(int(row["partition"]), []).append((str(row["path"]), list(row["batches"])))
    return [sorted(found[p]) for p in sorted(found)]


def read(where: Sequence[tuple[str, Sequence[int]]]) -> Iterator[pa.RecordBatch]:
    """One partition's events: the given batches of each file."""
    for path, batches in where:
        with pa.OSFile(path) as source:
            reader = pa.ipc.open_file(source)
            for index in batches:
                yield reader.get_batch(index)


def remove(folder: str | Path) -> None:
    """Remove the exchange's files (the compile is done with them, or failed)."""
    shutil.rmtree(folder, ignore_errors=True)
