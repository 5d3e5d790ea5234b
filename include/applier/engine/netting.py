"""Every table's net changes of a cycle, in two Spark jobs (engine design, "Row ordering and net changes").

Committed transactions take effect in ascending commit lsn, and the rows of one
transaction in ascending lsn (spec section 4), so every committed row has the
position ``(commit_lsn, lsn)``. Nothing here relies on the physical order of a
DataFrame; positions are compared explicitly.

The compile reads the committed rows once and exchanges them once, for all tables:

1. In Python on the executors (:func:`applier.engine.events.event_batches`),
   which read the cycle's files themselves (:mod:`applier.engine.sources`),
   the images of the pairs not checked yet are checked against their pair's
   definitions (the reader's rules: a refusal is recorded in the job's folder
   and ends its partition, and the driver re-reads with its own checks to cut
   the cycle there), the rows of
   transactions not committed in the cycle are dropped, rows at or before
   their table's last truncate are dropped (the target empties the table
   first), and so are the ``T`` rows; every other row yields
   events on *identities*: present with its after image, or absent (a delete,
   the old key of an update that moves the key). On a table without a key
   every event also counts +1 (a copy added) or -1 (removed). Each
   executor folds its partition's events per identity before passing them
   on (:func:`applier.engine.reduce.fold`), and writes them to the exchange
   (:mod:`applier.engine.exchange`: Arrow files in the compile's folder, a
   batch per partition; the JVM carries only where they are).
2. Per table and identity (a second job, a task per partition reading its
   events from every file, then one Arrow sort of each partition on the
   executor: :mod:`applier.engine.reduce`), the first event
   says whether the identity existed before the cycle, the last one decides
   its final state, and the counts add up. The exchange partitions on the table and a *salt*:
   a table with a small share of the cycle's rows has salt 0, so all its
   identities meet in one partition; a busy table's identities are spread
   by a hash of their key over partitions in proportion to its share
   (:func:`table_spreads`). A cycle over 1,000 tables thus writes about one
   chunk per table, not one per table and partition (eight times as many
   small files, which took most of the compile).
3. Sorted by table, the identities become typed chunks
   of net changes (:func:`applier.engine.identity.chunk_batches`), one table per
   chunk, written by the executors as files in the cycle's compile folder; the
   driver collects only their list, in one parallel job, and reads a table's
   files when it applies the table: it never holds the whole compiled cycle.
   (Streaming the chunks themselves with ``toLocalIterator`` ran the final
   stage one partition at a time, two to three times slower.)

No step builds an expression per table, so the job's size does not grow with
the number or the width of the tables a cycle touches.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from applier.engine import exchange
from applier.engine.events import event_batches
from applier.engine.image_checks import Checks, refused_in
from applier.engine.reduce import net_batches
from applier.engine.session import task_per_number
from applier.engine.sources import ReadTasks
from applier.intermediate.schema import TableDef

# Bytes of input per shuffle partition of the compile: large cycles get more
# partitions (never fewer than the session's spark.sql.shuffle.partitions), so
# that no task aggregates and parses too much at once.
INPUT_BYTES_PER_PARTITION = 32 * 1024 * 1024


def table_spreads(weights: Mapping[str, float], partitions: int) -> dict[str, int]:
    """Over how many shuffle partitions each busy table's identities are spread.

    A table gets twice its share of the partitions, rounded up, when that is
    more than one (twice: hashing few ``(table, salt)`` values into the
    partitions balances better the more there are); tables left out get one.

    Args:
        weights: rows (or any measure of work) per table in the cycle.
        partitions: the compile's shuffle partitions.
    """
    total = sum(weights.values())
    if total <= 0 or partitions <= 1:
        return {}
    spreads = {table: math.ceil(2 * partitions * weight / total) for table, weight in weights.items()}
    return {table: min(spread, 2 * partitions) for table, spread in spreads.items() if spread > 1}


def net_changes(
    rows: DataFrame | ReadTasks,
    tables: Mapping[str, TableDef],
    truncates: Mapping[str, tuple[int, int]],
    folder: str,
    partitions: int | None = None,
    spreads: Mapping[str, int] | None = None,
    bounds: Sequence[int] = (),
    checks: Checks | None = None,
) -> list[dict[str, Any]]:
    """The compile: committed rows in, typed chunks of each table's net changes out (two Spark jobs).

    Args:
        rows: committed rows (``.dat`` columns plus ``commit_lsn``), ``T`` rows
            included, or the tasks that read them on the executors
            (:class:`~applier.engine.sources.ReadTasks`); every table of a row
            must be in ``tables``.
        tables: the definitions (the latest of the cycle) of the tables to compile;
            columns added later read as null in older images.
        truncates: each truncated table's last truncate position ``(commit_lsn, lsn)``.
        folder: where the executors write the exchange's and the chunks' files,
            and the refusals of pairs they check (a folder every executor and
            the driver reach: the Applier's work folder).
        partitions: partitions of the exchange (None: the session's ``spark.sql.shuffle.partitions``).
        spreads: over how many partitions a busy table's identities are spread
            (:func:`table_spreads`; a table not named: one).
        bounds: the commit lsn each compilable group after the first starts
            at; each group's net changes are kept apart (none: one group).
        checks: the pairs whose images the job checks (seq -> their definitions;
            :class:`applier.engine.image_checks.PairRules`): ``rows`` then holds
            every row of those pairs, with ``seq`` and ``xid``, and a null
            ``commit_lsn`` for a transaction not committed here. None: every
            row is committed and checked before.

    Returns:
        One row per chunk file: ``table``, ``path``, ``rows``, ``bytes``, its
        net ``I``/``U``/``D`` rows and its ``group`` (the file holds one table's
        net changes of one group, see :func:`applier.engine.identity.final_table`);
        none when an executor refused a pair (recorded in ``folder``: the
        second job does not run).
    """
    definitions = dict(tables)
    events = functools.partial(
        event_batches, definitions, dict(truncates), dict(spreads or {}), list(bounds), checks, folder
    )
    spark = rows.spark if isinstance(rows, ReadTasks) else rows.sparkSession
    count = partitions or int(str(spark.conf.get("spark.sql.shuffle.partitions")))
    shared = os.path.join(folder, exchange.FOLDER)
    write = functools.partial(_events_written, events, shared, count)
    try:
        if isinstance(rows, ReadTasks):  # read on the executors, into the events step in the same process
            located = rows.collect(write)
        else:
            read = ["table", "op", "before", "after", "commit_lsn", "lsn"] + (
                ["seq", "xid"] if checks is not None else []
            )
            written = rows.select(*read).mapInArrow(functools.partial(_as_arrow, write), exchange.LOCATIONS_DDL)
            located = [row.asDict() for row in written.collect()]
        received = exchange.by_partition(located)
        if not received or refused_in(folder):
            return []
        net = functools.partial(net_batches, definitions, frozenset(truncates), folder)
        return task_per_number(spark.sparkContext, len(received), functools.partial(_netted, received, net))
    finally:
        exchange.remove(shared)


def _events_written(
    events: Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    folder: str,
    partitions: int,
    batches: Iterable[pa.RecordBatch],
) -> Iterator[dict[str, Any]]:
    """The first job's function: a partition's rows into events, written to the exchange; where they are."""
    return exchange.write(folder, partitions, events(batches))


def _as_arrow(
    write: Callable[[Iterable[pa.RecordBatch]], Iterator[dict[str, Any]]], batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``write`` as a ``mapInArrow`` function (rows given as a DataFrame)."""
    located = list(write(batches))
    if located:
        yield pa.RecordBatch.from_pylist(located, schema=exchange.LOCATIONS)


def _netted(
    received: Sequence[Sequence[tuple[str, Sequence[int]]]],
    net: Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    numbers: Iterable[int],
) -> Iterator[dict[str, Any]]:
    """The second job's function: each numbered partition's events, read from the exchange, netted into chunk files."""
    for index in numbers:
        for chunks in net(exchange.read(received[index])):
            yield from chunks.to_pylist()


def compile_partitions(input_bytes: int, default: int) -> int:
    """Shuffle partitions for a cycle of ``input_bytes``: the default, more for large cycles."""
    return max(default, math.ceil(input_bytes / INPUT_BYTES_PER_PARTITION))
