"""The rows of transactions still open after a cycle, on their way to the buffers.

The driver used to read them itself before the compile: each pair holding
such rows was decoded again for them. They are mostly the rows of the few
transactions begun at the cycle's very end, a few dozen rows at the end of
its last pair, and a Parquet file of one row group cannot be read from its
end: the pair was decoded whole, 0.05-0.13 CPU s a cycle on the 4x
workload, 7-14% of the driver's Python.

The executors decode those pairs anyway: the first compile job of a cycle
reads every row of the pairs whose images it checks. So each of its read
tasks also keeps the rows of the still-open transactions of its part of a
pair and writes them to a folder beside the spill files (:class:`Recorder`),
and the driver buffers them from there once the cycle is applied
(:func:`buffer_open_rows`). A pair that no task wrote whole (a cycle that
committed nothing, one compiled in the driver or checked there after a
refusal) is read here, a batch at a time, as before.

Nothing depends on the files surviving: a run stopped before it buffered
them rebuilds its open transactions by re-reading the pairs from its
restart point, as every restart does.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from applier.engine.buffers import TransactionBuffers
from applier.engine.cycle_input import CycleInput, pair_lookups
from applier.engine.part_files import part_path, temporary, written_parts
from applier.engine.reading import read_dat_rows
from applier.engine.spill import read_spill

PREFIX, SUFFIX = "open-", ".arrow"
"""Name a read task's file of open rows: ``open-<seq>-<part>-<parts>.arrow`` (Arrow IPC streams)."""


@dataclass(frozen=True)
class OpenRows:
    """Where a cycle's still-open rows are: which pairs hold them, and the folder the compile job writes them to.

    Attributes:
        xids: per pair holding such rows (by ``seq``, in order): its still-open xids.
        folder: where the compile job's read tasks write them (empty: nowhere, the driver reads them).
    """

    xids: Mapping[int, pa.Array] = field(default_factory=dict)
    folder: str = ""


def plan(cycle: CycleInput, still_open: Iterable[str], folder: Path | None = None) -> OpenRows:
    """The pairs of ``cycle`` holding rows of ``still_open``; ``folder`` (emptied here) receives them from Spark."""
    keys = pa.array(sorted(still_open), pa.string())
    found = {
        ref.seq: xids.filter(at.is_valid())
        for ref, (xids, at) in zip(cycle.pairs, pair_lookups(cycle, keys), strict=True)
        if at.null_count < len(at)
    }
    if folder is None:
        return OpenRows(found)
    shutil.rmtree(folder, ignore_errors=True)  # an earlier cycle's, or a stopped run's
    if found:
        folder.mkdir(parents=True, exist_ok=True)
    return OpenRows(found, str(folder))


class Recorder:
    """Writes a read task's still-open rows of part ``part`` of ``parts`` of pair ``seq`` to ``folder``, as they come.

    Each batch goes to the file as it is read (a task holds none of them);
    :meth:`close` moves the file into place, whole, even when it holds no
    row (the driver then knows the part was read). A task retried writes
    the same rows again; one that fails leaves only a temporary file.
    """

    def __init__(self, folder: str, seq: int, part: int, parts: int) -> None:
        self.path = part_path(folder, PREFIX, SUFFIX, seq, part, parts)
        self._temporary = temporary(self.path)
        self._sink: pa.NativeFile | None = None
        self._writer: ipc.RecordBatchStreamWriter | None = None

    def write(self, rows: pa.RecordBatch) -> None:
        if not rows.num_rows:
            return
        if self._writer is None:
            self._sink = pa.OSFile(str(self._temporary), "wb")
            self._writer = ipc.new_stream(self._sink, rows.schema)
        self._writer.write_batch(rows)

    def close(self) -> None:
        if self._writer is None or self._sink is None:
            self._temporary.write_bytes(b"")
        else:
            self._writer.close()
            self._sink.close()
        self._temporary.replace(self.path)


def buffer_open_rows(cycle: CycleInput, rows: OpenRows, buffers: TransactionBuffers) -> None:
    """Put the still-open rows of ``cycle``'s pairs into ``buffers``, pair by pair, in order.

    From the files of ``rows.folder`` for a pair all of whose parts a task
    wrote, else read from the pair. The folder's files are removed.
    """
    written = written_parts(Path(rows.folder), PREFIX, SUFFIX)[0] if rows.folder else {}
    refs = {ref.seq: ref for ref in cycle.pairs}
    for seq, xids in sorted(rows.xids.items()):
        files = written.get(seq)
        if files is None:
            kept = read_dat_rows(refs[seq].dat_path, xids)
        else:
            batches = [batch for path in files if path.stat().st_size for batch in read_spill(path)]
            kept = pa.Table.from_batches(batches) if batches else None
        if kept is not None:
            buffers.add(kept, seq=seq)
    if rows.folder:
        shutil.rmtree(rows.folder, ignore_errors=True)
