"""Reading a cycle's pairs in the driver: checking them and sorting out transactions.

The driver reads each pair once with pyarrow, checks it (reader and stream
validator), and learns which transactions commit, roll back or stay open.
Rows of transactions still open at the end of the cycle go to the buffers
(:mod:`applier.engine.open_rows`); Spark's executors read the ``.dat`` files
themselves for the committed ones (:mod:`applier.engine.sources`).

The row images, the costly part of the checks, are left to Spark's executors,
which check them in the compile job as they decode them anyway
(:attr:`CycleInput.unchecked`), and so is the ``.dat``'s sha256, which each
executor checks on the file it reads (:attr:`CycleInput.digests`: hashing every
byte of every pair was a tenth of the driver's CPU in a cycle, on one core
whatever the executors); a cycle that runs no compile job has them
checked here (:func:`check_in_driver`). A refusal found that late comes as a
:class:`~applier.errors.LateImageRefusal`: the run then re-reads from its
checkpoint with the driver checking (``read_cycle(check_rows=True)``), so the
refused pair cuts the cycle as it does at reading.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from applier.engine.buffers import BufferedTxn
from applier.engine.checking import PairChecker
from applier.engine.checkpoint import Checkpoint
from applier.engine.cycle_input import NO_XIDS, CycleInput, pairs_holding
from applier.engine.touches import longest_images, merge_longest, truncate_rows
from applier.errors import GapError, IntermediateFileError, LateImageRefusal
from applier.intermediate.events import begin_times
from applier.intermediate.pairs import DAT_COLUMNS, PairRef, list_pairs, pair_name
from applier.intermediate.reader import Pair, digest_first, read_pair
from applier.intermediate.row_facts import DatFacts
from applier.intermediate.stream import StreamValidator, TableAdmission

log = logging.getLogger("applier")

DatReader = Callable[[list[PairRef], bool], Mapping[int, DatFacts | IntermediateFileError]]
"""Reads pairs' ``.dat`` files for the driver, measuring their images if asked: seq -> what each holds, or its refusal.

(:func:`applier.engine.dat_facts.read_dat_facts`, on Spark's executors.)
"""

MEASURING_THREADS = 1
"""Threads that measure a cycle's row images while the driver reads its pairs (:func:`read_cycle`).

On the wide workload (six 64 MB pairs) reading took 4.5 s with the images
measured in turn, peaking at 718 MiB; 2.9 s with one thread beside it; two
threads gained nothing more and each held a batch of images (955 MiB).
"""


def _note_pair(into: CycleInput, pair: Pair) -> None:
    """Record what ``pair`` holds per transaction and table, and its events.

    The counts and the xids with rows stay in Arrow (:attr:`CycleInput.counts`,
    :attr:`CycleInput.xids_by_seq`); the work per transaction is at C speed
    where it can be; the xids the cycle keeps as Python strings (its commits)
    are the ``.trn`` events' own: one object whichever map names them.
    """
    into.pairs.append(pair.ref)
    into.rows_read += pair.facts.count
    if pair.facts.count:
        counted = pair.touches.select(["xid", "table", "rows"])
        into.counts.append(counted)
        into.xids_by_seq[pair.seq] = pc.unique(counted["xid"]).cast(pa.string())  # a .dat may hold large strings
        by_table = counted.group_by("table", use_threads=False).aggregate([("rows", "sum")])
        into.table_rows.update(dict(zip(by_table["table"].to_pylist(), by_table["rows_sum"].to_pylist(), strict=True)))
    else:
        into.xids_by_seq[pair.seq] = NO_XIDS
    into.truncates.extend(truncate_rows(pair.facts.truncates))
    into.autocorrect.update(pair.autocorrect)
    events = pair.tally
    if events.committed:
        into.commits.update(events.committed)
        into.commit_ends.append((max(events.committed.values()), pair.seq))
    into.rollbacks.update(events.rolled_back)
    begun_at = into.begun_at
    for xid in begun_at.keys() & events.ended.keys():  # begun in an earlier pair
        del begun_at[xid]
    begun_at.update(begin_times(pair.events, events.begun, events.still_open))


def longest_images_in(dat_path: Path, batch_rows: int = 8_192) -> dict[str, int]:
    """:func:`~applier.engine.touches.longest_images` of a ``.dat`` file, read a batch at a time.

    The driver measures a pair's images (for the groups' size estimate)
    without holding them: a wide pair's images take several times its file
    size once decoded.
    """
    longest: dict[str, int] = {}
    for batch in pq.ParquetFile(dat_path).iter_batches(batch_size=batch_rows, columns=["table", "before", "after"]):
        merge_longest(longest, longest_images(batch))
    return longest


def _checked_by_worker(check: Future[None] | None) -> bool:
    """Whether a worker checked the pair's images; its refusal, if any, is raised here.

    A worker that died (a broken pool) is not a verdict on the pair: the
    driver then checks the pair itself.
    """
    if check is None:
        return False
    try:
        check.result()
    except IntermediateFileError:
        raise
    except Exception as e:
        log.warning("checking in a worker failed (%s); checking in the driver", e)
        return False
    return True


def read_cycle(
    refs: list[PairRef],
    validator: StreamValidator,
    *,
    check_rows: bool = True,
    checker: PairChecker | None = None,
    defer_images: bool = False,
    measure: bool = True,
    dat_reader: DatReader | None = None,
) -> CycleInput:
    """Read and check the planned pairs in order, stopping at the first refused one.

    Args:
        refs: the planned pairs.
        validator: the stream state, advanced past every accepted pair.
        check_rows: check row images (off when re-reading pairs checked before).
        checker: worker processes that check row images of large cycles.
        defer_images: leave the row images to be checked later (the compile
            job, or :func:`check_in_driver`), listing the pairs in ``unchecked``.
        measure: measure the images of pairs not read whole here, beside the
            reading; if not, they are listed in ``unmeasured`` for the compile
            job to measure (:mod:`~applier.engine.measuring`).
        dat_reader: reads the pairs' ``.dat`` files for the driver, all at once
            before the pairs are checked in order (Spark's executors,
            :mod:`~applier.engine.dat_facts`): the driver then reads the
            ``.trn`` files only, and the images are measured there
            (``measure``). With ``defer_images`` only.

    Returns:
        The accepted pairs and their transactions; ``refused`` holds the error
        that stopped the reading, to be raised once the accepted part is applied.
    """
    result = CycleInput()
    check_rows = check_rows and not defer_images
    read_elsewhere = dat_reader(refs, measure) if dat_reader is not None and defer_images else {}
    result.dat_read_by_executors = bool(read_elsewhere)
    checks = checker.submit(refs) if checker is not None and check_rows else {}
    measured: list[Future[dict[str, int]]] = []
    # Images not read with the pair are measured beside the reading, on a thread (Arrow's reads and kernels
    # leave the interpreter free): a wide cycle's images are several times its other columns.
    with ThreadPoolExecutor(max_workers=MEASURING_THREADS, thread_name_prefix="measure") as measuring:
        try:
            for ref in refs:
                try:
                    checked = _checked_by_worker(checks.get(ref.seq))
                    found = read_elsewhere.get(ref.seq)
                    if isinstance(found, IntermediateFileError):
                        raise found
                    pair = read_pair(
                        ref, check_rows=check_rows and not checked, check_digest=not defer_images, read_elsewhere=found
                    )
                    _check_stream(validator, pair)
                except IntermediateFileError as e:
                    result.refused = e
                    break
                _note_pair(result, pair)
                if pair.data is not None and "after" in pair.data.column_names:
                    merge_longest(result.longest_image, longest_images(pair.data))
                elif found is not None and found.longest_image is not None:  # measured where it was read
                    merge_longest(result.longest_image, found.longest_image)
                # A re-read (nothing checked, nothing deferred) needs no sizes; else they are measured beside
                # the reading, or by the compile job.
                elif (check_rows or defer_images) and measure:
                    measured.append(measuring.submit(longest_images_in, ref.dat_path))
                elif (check_rows or defer_images) and pair.facts.count:
                    result.unmeasured.add(pair.seq)  # the compile job measures them
                if defer_images and pair.facts.count:
                    result.unchecked[pair.seq] = dict(pair.tables)  # one object per definition already
                if not pair.digest_checked:
                    result.digests[pair.seq] = pair.header.dat_sha256
            for sizes in measured:
                merge_longest(result.longest_image, sizes.result())
        finally:
            for pending in checks.values():
                pending.cancel()
            for sizes in measured:
                sizes.cancel()
    return result


def _check_stream(validator: StreamValidator, pair: Pair) -> None:
    """``validator.check(pair)``; a pair it refuses whose digest is unchecked has its digest checked first."""
    with digest_first(pair.ref, pair.header, not pair.digest_checked):
        validator.check(pair)


def check_in_driver(cycle: CycleInput) -> None:
    """Check the row images the cycle has not had checked yet, here (a cycle, or part, that Spark does not compile).

    Raises:
        LateImageRefusal: a pair's image breaks the spec (see the module docstring).
    """
    for ref in cycle.pairs:
        if ref.seq in cycle.unchecked:
            try:
                read_pair(ref, check_rows=True)
            except IntermediateFileError as e:
                raise LateImageRefusal(e.path, e.seq, e.code, e.detail) from e
    cycle.checked()


def spill_inputs(taken: Mapping[str, BufferedTxn], memory_file: Path | None) -> list[Path]:
    """The files holding the buffered rows of the committed transactions ``taken``: theirs, then ``memory_file``."""
    spills = [t.spill_path for t in taken.values() if t.spill_path is not None]
    return [*spills, memory_file] if memory_file is not None else spills


def read_dat(path: Path) -> pa.Table:
    """The ``.dat`` columns of a pair's data file."""
    return pq.read_table(path, columns=list(DAT_COLUMNS))


def read_dat_rows(path: Path, xids: pa.Array, batch_rows: int = 8_192) -> pa.Table:
    """The ``.dat`` rows of the transactions ``xids``, read a batch at a time and filtered as they come.

    Only those rows are held: a wide pair's images, decoded whole, took several
    times its file size (a 64 MB pair read whole for its two open transactions
    was the wide cycle's driver peak, 280 MiB over its compile).
    """
    source = pq.ParquetFile(path)
    kept = [
        batch.filter(pc.is_in(batch.column("xid"), value_set=xids))
        for batch in source.iter_batches(batch_size=batch_rows, columns=list(DAT_COLUMNS))
    ]
    return pa.Table.from_batches(kept, schema=pa.schema([source.schema_arrow.field(n) for n in DAT_COLUMNS]))


def open_rows(
    cycle: CycleInput, xids: set[str], read: Callable[[Path], pa.Table] | None = None
) -> Iterator[tuple[int, pa.Table]]:
    """The rows of ``xids`` in the cycle's pairs, pair by pair as ``(seq, rows)``.

    Each pair holding such rows is read again, one pair at a time: a batch at
    a time (:func:`read_dat_rows`), or whole by ``read`` (a cache of pairs
    read whole) and then filtered on the xid.
    """
    value_set = pa.array(sorted(xids), pa.string())
    for ref in pairs_holding(cycle, xids):
        if read is None:
            yield ref.seq, read_dat_rows(ref.dat_path, value_set)
            continue
        rows = read(ref.dat_path)
        yield ref.seq, rows.filter(pc.is_in(rows["xid"], value_set=value_set))


def missing_pair_error(directory: Path, seq: int) -> GapError:
    """The error for a pair a resume needs (removed too early by retention, say)."""
    name = pair_name(seq)
    return GapError(
        directory / name,
        seq,
        "pair-missing",
        f"pair {name} is needed to resume (restart or unfinished cycle) but is not there",
    )


def window_pairs(directory: Path, checkpoint: Checkpoint) -> list[PairRef]:
    """The pairs ``restart_seq .. applied_seq`` a restart re-reads, each of them present (none to re-read: none).

    Raises:
        GapError: a pair of the window is missing.
    """
    listing = list_pairs(directory, checkpoint.restart_seq)
    window = [p for p in listing.pairs if p.seq <= checkpoint.applied_seq]
    if len(window) < checkpoint.applied_seq - checkpoint.restart_seq + 1:
        gap = listing.gap_error()
        raise gap if gap is not None else missing_pair_error(directory, checkpoint.restart_seq + len(window))
    return window


def reread_window(
    directory: Path, checkpoint: Checkpoint, admit: TableAdmission | None = None
) -> tuple[StreamValidator, CycleInput]:
    """Re-read ``restart_seq .. applied_seq``, as a restart does, to learn the open transactions.

    The pairs were checked when they were applied, so images are not checked
    again and the validator trusts them. ``admit`` is the target's rule for the
    tables of the pairs after them (None: no target).

    Returns:
        The validator, advanced to ``applied_seq``, and what the window holds
        (empty when no transaction was open).

    Raises:
        GapError: a pair of the window is missing.
        IntermediateFileError: a pair of the window no longer reads as it did.
    """
    rereading = checkpoint.restart_seq <= checkpoint.applied_seq
    validator = StreamValidator(
        tables=checkpoint.tables,
        last_lsn=None if rereading else checkpoint.last_lsn,
        trusted_through_seq=checkpoint.applied_seq,
        admit=admit,
    )
    if not rereading:
        return validator, CycleInput()
    reread = read_cycle(window_pairs(directory, checkpoint), validator, check_rows=False)
    if reread.refused is not None:
        raise reread.refused
    return validator, reread
