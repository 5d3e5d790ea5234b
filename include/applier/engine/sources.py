"""The compile job's input, read by the executors themselves: the read step of a cycle in Spark.

The driver hands Spark one small *task* per file to read, never the rows: a
pair's ``.dat`` (with its ``seq``), a committed transaction's spill file, or
the file of the committed rows that were still in memory. Each task carries
the commit lsn of the committed transactions it may hold (those of its pair
only, so a task's share stays small however many transactions the cycle
commits). An executor reads its file with pyarrow a batch at a time, gives
each row its transaction's commit lsn, keeps the committed rows (or, for a
pair whose images the job checks, every row, with a null commit lsn for the
others) and passes them to the next step in the same Python process
(:func:`applier.engine.events.event_batches`).

Read this way, the images go from the file to the events without crossing
into the JVM: Spark's own Parquet scan turned every image into a JVM row,
joined it with the commits there, then copied it into Arrow for Python. On
the narrow benchmark workload that path cost about 7 JVM CPU seconds warm and
20 on a fresh JVM (mostly compiling the scan and the conversion), against
about 2 s of pyarrow.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from applier.engine.buffers import BufferedTxn
from applier.engine.reading import CycleInput, pairs_holding, spill_inputs
from applier.engine.spill import read_spill
from applier.engine.worker_path import prepare_worker
from applier.intermediate.pairs import DAT_COLUMNS

BATCH_ROWS = 10_000
"""Rows per batch read from a file (Spark's own default for Arrow batches)."""

TASK_DDL = "path string, seq long, commits binary"
"""A read task: the file, its pair's ``seq`` (null for a file of buffered rows), its commits as Arrow IPC."""

DAT_DDL = "lsn long, xid string, `table` string, op string, before string, after string"
"""The ``.dat`` columns as Spark reads them."""

ROWS_DDL = f"{DAT_DDL}, commit_lsn long, seq long"
"""The rows the tasks yield: the ``.dat`` columns, the commit lsn and the pair's ``seq``."""

_COMMITS = pa.schema([("xid", pa.string()), ("commit_lsn", pa.int64())])


@dataclass(frozen=True)
class ReadTasks:
    """A compile job's input as read tasks (:func:`read_tasks`), in place of a DataFrame of its rows.

    Attributes:
        frame: the tasks (:data:`TASK_DDL`), one partition each.
        keep_all: the tasks' rows include those of transactions not committed
            here (pairs whose images the job checks).
    """

    frame: DataFrame
    keep_all: bool = False

    def rows(self) -> DataFrame:
        """The tasks' rows as a DataFrame (:data:`ROWS_DDL`), for a job other than the compile."""
        return self.frame.mapInArrow(functools.partial(task_rows, keep_all=self.keep_all), ROWS_DDL)


def read_tasks(
    spark: Any,
    cycle: CycleInput,
    taken: Mapping[str, BufferedTxn],
    memory_file: Path | None,
    *,
    checks: bool = False,
) -> ReadTasks | None:
    """The read tasks of a cycle's committed rows (None: no file holds one).

    The tasks read the pairs holding rows of the cycle's commits, the spill
    files of the committed transactions ``taken`` and ``memory_file`` (their
    rows that were still in memory). With ``checks``, they also read the
    pairs of :attr:`~applier.engine.reading.CycleInput.unchecked` and keep
    every row of a pair.
    """
    holding = {p.seq for p in pairs_holding(cycle, cycle.commits)}
    tasks: list[tuple[str, int | None, bytes]] = []
    for ref in cycle.pairs:
        if ref.seq in holding or (checks and ref.seq in cycle.unchecked):
            xids = cycle.xids_by_seq.get(ref.seq, set())
            tasks.append((str(ref.dat_path), ref.seq, _commits_ipc(cycle.commits, xids)))
    buffered = _commits_ipc(cycle.commits, taken)
    tasks.extend((str(path), None, buffered) for path in spill_inputs(taken, memory_file))
    if not tasks:
        return None
    return ReadTasks(spark.createDataFrame(tasks, TASK_DDL).repartition(len(tasks)), checks)


def _commits_ipc(commits: Mapping[str, int], xids: Collection[str]) -> bytes:
    """The commit lsn of those of ``xids`` that commit, as an Arrow IPC stream."""
    mine = sorted(x for x in xids if x in commits)
    table = pa.table([pa.array(mine, pa.string()), pa.array([commits[x] for x in mine], pa.int64())], schema=_COMMITS)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, _COMMITS) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def task_rows(tasks: Iterable[pa.RecordBatch], *, keep_all: bool = False) -> Iterator[pa.RecordBatch]:
    """The rows the read tasks of a partition hold, batch by batch, in the columns of :data:`ROWS_DDL`.

    Args:
        tasks: batches of read tasks (:data:`TASK_DDL`).
        keep_all: keep the rows of a pair's transactions not committed here
            too, with a null ``commit_lsn`` (a pair whose images are checked).
            Buffered rows are all committed.
    """
    prepare_worker()
    for batch in tasks:
        for path, seq, commits in zip(*(batch.column(i).to_pylist() for i in range(3)), strict=True):
            committed = pa.ipc.open_stream(commits).read_all()
            xids, lsns = committed.column("xid").combine_chunks(), committed.column("commit_lsn").combine_chunks()
            for rows in _file_batches(path, seq is not None):
                at = pc.index_in(rows.column("xid"), value_set=xids)
                rows = _with_columns(rows, pc.take(lsns, at), seq)
                yield rows if keep_all and seq is not None else rows.filter(pc.is_valid(at))


def _file_batches(path: str, pair: bool) -> Iterator[pa.RecordBatch]:
    if pair:
        yield from pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=list(DAT_COLUMNS))
    else:
        yield from read_spill(path)


def _with_columns(rows: pa.RecordBatch, commit_lsn: pa.Array, seq: int | None) -> pa.RecordBatch:
    columns = [rows.column(name) for name in DAT_COLUMNS]
    seqs = pa.nulls(rows.num_rows, pa.int64()) if seq is None else pa.repeat(pa.scalar(seq, pa.int64()), rows.num_rows)
    return pa.RecordBatch.from_arrays([*columns, commit_lsn, seqs], [*DAT_COLUMNS, "commit_lsn", "seq"])
