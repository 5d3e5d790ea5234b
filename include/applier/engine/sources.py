"""The compile job's input, read by the executors themselves: the read step of a cycle in Spark.

The driver hands Spark small *tasks*, never the rows: each reads a file, or
a part of a pair's rows when a cycle has few pairs for its cores: a pair's
``.dat`` (with its ``seq``), a committed transaction's spill file, or the
file of the committed rows that were still in memory. Each task carries
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
import itertools
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from applier.engine import open_rows
from applier.engine.buffers import BufferedTxn
from applier.engine.cycle_input import COMMITS, CycleInput
from applier.engine.image_checks import Refused
from applier.engine.measuring import record_lengths
from applier.engine.reading import spill_inputs
from applier.engine.session import task_per_number
from applier.engine.spill import read_spill
from applier.engine.touches import longest_images, merge_longest
from applier.engine.worker_path import prepare_worker
from applier.intermediate.pairs import DAT_COLUMNS
from applier.intermediate.reader import DIGEST_MISMATCH, digest_mismatch

T = TypeVar("T")

BATCH_ROWS = 10_000
"""Rows per batch read from a file (Spark's own default for Arrow batches)."""

SPILL_GROUPS_PER_CORE = 2
"""Spark tasks that read a cycle's spill files per core of the application, at most.

The cycle committing the 4,000-open benchmark workload's transactions read
a spill file for each spooled one: that cycle took 127 s with a Spark task
per file, 25 s in groups, 6.9 s in groups with their small batches joined
(:func:`_coalesced`; 10.6 s for the same pairs in one cycle).
"""

PART_BYTES = 4 * 1024 * 1024
"""The least of a pair's bytes (``.dat`` and ``.trn``) worth a read task of its own: a small pair is one task."""

TASKS_PER_CORE = 4
"""Read tasks a cycle is cut into per core of the application, at least, when it has few files.

A task's cost is mostly compiling its rows, so tasks of equal rows balance:
a cycle of seven pairs on eight cores would leave a core idle. A pair cut into
parts costs a little more decoding (each part decodes the file's row groups
up to its end; reading is a few percent of the stage). On the narrow
benchmark workload (seven pairs, two cores) the stage took the same time
in 7 or 14 tasks.
"""


class ReadTask(NamedTuple):
    """A file to read, or a part of one: its pair's ``seq`` (None for a file of buffered rows), which
    part of its rows (``part`` of ``parts``), and the commit lsn of the transactions it may hold.
    ``digest``: the sha256 the whole file must have, checked before its rows are read (one part of a
    pair whose images the job checks; empty: none to check). ``still_open``: the xids of the pair's
    transactions still open after the cycle, whose rows the task writes out for the buffers (None: none)."""

    path: str
    seq: int | None
    part: int
    parts: int
    commits: pa.Table
    digest: str = ""
    still_open: pa.Array | None = None


DAT_DDL = "lsn long, xid string, `table` string, op string, before string, after string"
"""The ``.dat`` columns as Spark reads them."""

ROWS_DDL = f"{DAT_DDL}, commit_lsn long, seq long"
"""The rows the tasks yield: the ``.dat`` columns, the commit lsn and the pair's ``seq``."""


@dataclass(frozen=True)
class ReadTasks:
    """A compile job's input as read tasks (:func:`read_tasks`), in place of a DataFrame of its rows.

    Attributes:
        spark: the session.
        tasks: the read tasks, in groups; a group runs as one Spark task (:meth:`numbers`).
        keep_all: the tasks' rows include those of transactions not committed
            here (pairs whose images the job checks).
        measure_into: a folder where each task reading a pair writes the
            longest image per table of every row it read
            (:func:`~applier.engine.measuring.record_lengths`); empty: none.
        open_into: a folder where each task with ``still_open`` xids writes
            their rows (:class:`~applier.engine.open_rows.Recorder`); empty: none.
    """

    spark: Any
    tasks: tuple[tuple[ReadTask, ...], ...]
    keep_all: bool = False
    measure_into: str = ""
    open_into: str = ""

    def numbers(self) -> DataFrame:
        """The groups' numbers, one per partition: a ``mapInArrow`` over it runs each group as a Spark task.

        (The tasks themselves go with the mapped function; Spark broadcasts a large one.)
        """
        numbers: DataFrame = self.spark.range(len(self.tasks), numPartitions=len(self.tasks))
        return numbers

    def collect(self, function: Callable[[Iterator[pa.RecordBatch]], Iterable[T]]) -> list[T]:
        """What ``function`` yields over each group's rows (:func:`task_rows`), a Spark task per group, collected.

        An RDD job over the groups' numbers (:func:`~applier.engine.session.task_per_number`):
        a run whose jobs are all of this kind never starts Spark SQL's
        machinery. ``function`` yields small picklable values (where its output went).
        """
        return task_per_number(self.spark.sparkContext, len(self.tasks), self._reading(function))

    def rows(self) -> DataFrame:
        """The tasks' rows as a DataFrame (:data:`ROWS_DDL`), for a job other than the compile."""
        return self.numbers().mapInArrow(functools.partial(_numbered, self._reading(iter)), ROWS_DDL)

    def _reading(
        self, function: Callable[[Iterator[pa.RecordBatch]], Iterable[T]]
    ) -> Callable[[Iterable[int]], Iterable[T]]:
        """``function`` over the rows of the numbered groups (the function a Spark task runs)."""
        return functools.partial(_read_then, self.tasks, self.keep_all, self.measure_into, self.open_into, function)


def _numbered(
    read: Callable[[Iterable[int]], Iterable[pa.RecordBatch]], batches: Iterable[pa.RecordBatch]
) -> Iterable[pa.RecordBatch]:
    return read(number for batch in batches for number in batch.column(0).to_pylist())


def _read_then(
    tasks: Sequence[Sequence[ReadTask]],
    keep_all: bool,
    measure_into: str,
    open_into: str,
    function: Callable[[Iterator[pa.RecordBatch]], Iterable[T]],
    numbers: Iterable[int],
) -> Iterable[T]:
    return function(task_rows(tasks, numbers, keep_all=keep_all, measure_into=measure_into, open_into=open_into))


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
    pairs of :attr:`~applier.engine.cycle_input.CycleInput.unchecked` and keep
    every row of a pair, and the first part of each pair of
    :attr:`~applier.engine.cycle_input.CycleInput.digests` checks its digest;
    and the rows of the transactions still open after the cycle
    (:attr:`~applier.engine.cycle_input.CycleInput.open_after`) are written out by
    the tasks reading their pairs.
    """
    commits = cycle.pair_commits
    pairs = [ref for ref in cycle.pairs if commits[ref.seq].num_rows or (checks and ref.seq in cycle.unchecked)]
    spills = spill_inputs(taken, memory_file)
    if not pairs and not spills:
        return None
    cores = spark.sparkContext.defaultParallelism
    parts = -(-TASKS_PER_CORE * cores // max(1, len(pairs)))
    still_open = cycle.open_after if checks and cycle.open_after is not None else None
    groups: list[tuple[ReadTask, ...]] = []
    for ref in pairs:
        cut = max(1, min(parts, ref.size // PART_BYTES))
        digest = cycle.digests.get(ref.seq, "") if checks else ""
        mine = commits[ref.seq]
        xids = still_open.xids.get(ref.seq) if still_open is not None and still_open.folder else None
        path = str(ref.dat_path)
        groups.extend((ReadTask(path, ref.seq, part, cut, mine, "" if part else digest, xids),) for part in range(cut))
    # Spill files, one per spooled transaction (thousands when thousands were open), are read in a few groups.
    buffered = commits_of(cycle.commits, taken)
    spilled = [ReadTask(str(path), None, 0, 1, buffered) for path in spills]
    slices = min(len(spilled), SPILL_GROUPS_PER_CORE * cores)
    groups.extend(tuple(spilled[i::slices]) for i in range(slices))
    return ReadTasks(spark, tuple(groups), checks, open_into=still_open.folder if still_open is not None else "")


def commits_of(commits: Mapping[str, int], xids: Collection[str]) -> pa.Table:
    """The ``xid, commit_lsn`` of those of ``xids`` that commit."""
    mine = sorted(filter(commits.__contains__, xids))
    lsns = list(map(commits.__getitem__, mine))
    return pa.table([pa.array(mine, pa.string()), pa.array(lsns, pa.int64())], schema=COMMITS)


def task_rows(
    tasks: Sequence[Sequence[ReadTask]],
    numbers: Iterable[int],
    *,
    keep_all: bool = False,
    measure_into: str = "",
    open_into: str = "",
) -> Iterator[pa.RecordBatch]:
    """The rows the read tasks of a partition hold, batch by batch, in the columns of :data:`ROWS_DDL`.

    Args:
        tasks: every read task of the job, in groups.
        numbers: the numbers of the groups to read here.
        keep_all: keep the rows of a pair's transactions not committed here
            too, with a null ``commit_lsn`` (a pair whose images are checked).
            Buffered rows are all committed.
        measure_into: where a task reading a pair records its rows' longest
            images, once it has read them all (see :class:`ReadTasks`).
        open_into: where a task with ``still_open`` xids writes their rows,
            once it has read them all (see :class:`ReadTasks`).
    """
    prepare_worker()
    groups = (tasks[number] for number in numbers)
    read = functools.partial(_task_rows, keep_all=keep_all, measure_into=measure_into, open_into=open_into)
    yield from _coalesced(rows for group in groups for task in group for rows in read(task))


def _task_rows(task: ReadTask, *, keep_all: bool, measure_into: str, open_into: str) -> Iterator[pa.RecordBatch]:
    if task.digest and task.seq is not None and (mismatch := digest_mismatch(task.path, task.digest)) is not None:
        raise Refused(task.seq, mismatch, DIGEST_MISMATCH)
    xids, lsns = task.commits.column("xid").combine_chunks(), task.commits.column("commit_lsn").combine_chunks()
    longest: dict[str, int] | None = {} if measure_into and task.seq is not None else None
    still_open = None
    if open_into and task.still_open is not None and task.seq is not None:
        still_open = open_rows.Recorder(open_into, task.seq, task.part, task.parts)
    for rows in _coalesced(_file_batches(task.path, task.seq is not None, task.part, task.parts)):
        if longest is not None:  # every row of the pair, kept or not: the cycle's longest images
            merge_longest(longest, longest_images(rows))
        if still_open is not None:
            still_open.write(rows.filter(pc.is_in(rows.column("xid"), value_set=task.still_open)))
        at = pc.index_in(rows.column("xid"), value_set=xids)
        rows = _with_columns(rows, pc.take(lsns, at), task.seq)
        yield rows if keep_all and task.seq is not None else rows.filter(pc.is_valid(at))
    if longest is not None and task.seq is not None:
        record_lengths(measure_into, task.seq, task.part, task.parts, longest)
    if still_open is not None:
        still_open.close()


def _coalesced(batches: Iterable[pa.RecordBatch], rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """``batches`` in order, those next to each other joined up to ``rows`` rows (a larger batch stays whole).

    Each spool of a spill file is a batch, often of a few rows, and so is a
    small spill file: every batch costs the next steps a few dozen Arrow calls
    and a lookup of its transactions, whatever its rows.
    """
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        if pending and (held + batch.num_rows > rows or batch.schema != pending[0].schema):
            yield _joined(pending)
            pending, held = [], 0
        pending.append(batch)
        held += batch.num_rows
    if pending:
        yield _joined(pending)


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    joined = pa.Table.from_batches(batches).combine_chunks().to_batches() if len(batches) > 1 else batches
    return joined[0] if joined else batches[0]


def _file_batches(path: str, pair: bool, part: int, parts: int) -> Iterator[pa.RecordBatch]:
    """The rows of part ``part`` of ``parts`` of a file (that share of its rows), batch by batch.

    Only the row groups reaching into the part are decoded (a spill file is read whole: it has one part).
    """
    if not pair:
        yield from read_spill(path)
        return
    source = pq.ParquetFile(path)
    low, high = part * source.metadata.num_rows // parts, (part + 1) * source.metadata.num_rows // parts
    sizes = [source.metadata.row_group(i).num_rows for i in range(source.num_row_groups)]
    starts = list(itertools.accumulate(sizes, initial=0))
    groups = [i for i, size in enumerate(sizes) if starts[i] < high and starts[i] + size > low]
    at = starts[groups[0]] if groups else 0
    for rows in source.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=list(DAT_COLUMNS)):
        first, end = max(at, low), min(at + rows.num_rows, high)
        if first < end:
            yield rows.slice(first - at, end - first)
        at += rows.num_rows
        if at >= high:
            return


def _with_columns(rows: pa.RecordBatch, commit_lsn: pa.Array, seq: int | None) -> pa.RecordBatch:
    columns = [rows.column(name) for name in DAT_COLUMNS]
    seqs = pa.nulls(rows.num_rows, pa.int64()) if seq is None else pa.repeat(pa.scalar(seq, pa.int64()), rows.num_rows)
    return pa.RecordBatch.from_arrays([*columns, commit_lsn, seqs], [*DAT_COLUMNS, "commit_lsn", "seq"])
