"""Per identity, its first and last events: the compile's aggregation, in Arrow on each executor.

Events are folded per identity (:func:`fold`) twice: by each executor over
its input partition's events before the shuffle (an identity changed many
times in a pair then crosses it once), and after the shuffle on
``(table, salt)``, where every event of an identity is in one partition. A
fold numbers each event's identity ``(table, group, key)`` with Arrow's hash
(one integer an event) and sorts those integers once (numpy, stable), without
the images (taken once, at each identity's first and last events); each run
of one number is an identity: its first event (the least first position)
says whether it existed before the cycle, its last one (the greatest
position) gives its final state and image, and the counts add up. The result
holds each table's identities together, in group order, as
:func:`applier.engine.identity.chunk_batches` takes it. (Sorting on the key's
bytes and the positions, with Arrow's sort, took twice as long.)

Spark's own aggregation (``min_by``/``max_by`` over a struct holding the image)
kept a string in its buffer, so it sorted the events on both sides of the
shuffle and again within partitions; doing it here sorts them once a side. A
partition is held whole meanwhile: the compile sizes its partitions by input
bytes (:data:`applier.engine.netting.INPUT_BYTES_PER_PARTITION`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa

from applier.engine.identity import chunk_batches
from applier.engine.worker_path import prepare_worker
from applier.intermediate.schema import TableDef

_NO_LSN = np.iinfo(np.int64).min
_LAST_LSN = np.iinfo(np.int64).max
# A folded event's columns: from its identity's last event, from its first; ``n`` is their sum.
_FROM_LAST = ("commit_lsn", "lsn", "present", "image")
_FROM_FIRST = ("table", "key", "group", "salt", "existed", "first_commit_lsn", "first_lsn")


def fold(events: pa.Table) -> pa.Table:
    """The events of each identity folded into one, in the columns of ``events`` (``EVENT_SCHEMA``'s).

    An event spans the positions ``first_commit_lsn, first_lsn`` to
    ``commit_lsn, lsn`` (one row's event: one position). The folded event of
    an identity (``table``, ``group``, ``key``) spans from its events' first
    position to their last: ``existed`` is its first event's, ``present``
    and ``image`` its last event's, and ``n`` their sum. Folding is
    associative: the executors fold the events of each input partition
    before the shuffle, then fold what meets after it. Two events at one
    position (an update of a table without a key that keeps its row value:
    the copy removed, then added) keep their order of arrival.

    The result holds each table's identities together, in group order (identities in no set order within).
    """
    count = events.num_rows
    if count == 0:
        return events
    ident = _identity_numbers(events)
    order = np.argsort(ident, kind="stable")  # grouped by identity, in order of arrival within each
    ident = ident[order]
    changes = np.empty(count, dtype=bool)
    changes[0] = True
    np.not_equal(ident[1:], ident[:-1], out=changes[1:])
    starts = np.flatnonzero(changes)
    run = np.cumsum(changes) - 1  # each sorted event's identity
    arrival = np.arange(count)
    # The first event: the least (first_commit_lsn, first_lsn) of its identity, the earlier one in arrival on a tie.
    first_commit_lsn = events.column("first_commit_lsn").to_numpy()[order]
    first_lsn = events.column("first_lsn").to_numpy()[order]
    earliest = first_commit_lsn == np.minimum.reduceat(first_commit_lsn, starts)[run]
    first_lsn = np.where(earliest, first_lsn, _LAST_LSN)
    earliest &= first_lsn == np.minimum.reduceat(first_lsn, starts)[run]
    firsts = np.minimum.reduceat(np.where(earliest, arrival, count), starts)
    # The last event: the greatest (commit_lsn, lsn) of its identity, the later one in arrival on a tie.
    commit_lsn = events.column("commit_lsn").to_numpy()[order]
    lsn = events.column("lsn").to_numpy()[order]
    latest = commit_lsn == np.maximum.reduceat(commit_lsn, starts)[run]
    lsn = np.where(latest, lsn, _NO_LSN)
    latest &= lsn == np.maximum.reduceat(lsn, starts)[run]
    ends = np.maximum.reduceat(np.where(latest, arrival, -1), starts)
    first, last = pa.array(order[firsts]), pa.array(order[ends])
    counts = np.add.reduceat(events.column("n").to_numpy()[order].astype(np.int64), starts)
    columns = {name: _take(events.column(name), last) for name in _FROM_LAST}
    columns.update({name: _take(events.column(name), first) for name in _FROM_FIRST})
    columns["n"] = pa.array(counts.astype(np.int32), pa.int32())
    return pa.table({name: columns[name] for name in events.column_names})


def _take(column: pa.ChunkedArray, at: pa.Array) -> pa.Array:
    """``column``'s values at ``at``, from one chunk: Arrow's take across a partition's many chunks (a batch's
    events each) cost a wide pair's images 0.67 CPU s, against 0.04 to join them and 0.08 to take."""
    return column.combine_chunks().take(at) if column.num_chunks > 1 else column.take(at)


def _identity_numbers(events: pa.Table) -> np.ndarray:
    """Each event's identity ``(table, group, key)`` as one integer: its table's, group's and key's codes combined.

    Tables and keys are numbered by Arrow's hash of their values (in order of
    first arrival), so equal identities get equal numbers and different ones
    different numbers.
    """
    tables = events.column("table").combine_chunks().dictionary_encode()
    keys = events.column("key").combine_chunks().dictionary_encode()
    group: np.ndarray = events.column("group").to_numpy().astype(np.int64)
    groups = int(group.max()) + 1
    numbered = tables.indices.to_numpy().astype(np.int64) * groups + group
    if len(tables.dictionary) * groups * len(keys.dictionary) >= 2**62:  # numbered densely, then it fits
        numbered = np.unique(numbered, return_inverse=True)[1].astype(np.int64)
    codes: np.ndarray = keys.indices.to_numpy().astype(np.int64)
    numbers: np.ndarray = numbered * len(keys.dictionary) + codes
    return numbers


def net_identities(events: pa.Table) -> pa.Table:
    """One row per identity of ``events``: ``table``, ``group``, ``existed`` (first event), ``present`` and
    ``image`` (last event) and ``n`` (summed); each table's together, in group order.

    Args:
        events: events as :func:`applier.engine.events.event_batch` makes them, or folded (:func:`fold`).
    """
    if events.num_rows == 0:
        return pa.table(
            {"table": pa.array([], pa.string()), "group": pa.array([], pa.int32()), "existed": pa.array([], pa.bool_()),
             "present": pa.array([], pa.bool_()), "image": pa.array([], pa.string()), "n": pa.array([], pa.int64())}
        )  # fmt: skip
    folded = fold(events)
    return pa.table(
        {
            **{name: folded.column(name) for name in ("table", "group", "existed", "present", "image")},
            "n": folded.column("n").cast(pa.int64()),
        }
    )


def net_batches(
    tables: Mapping[str, TableDef], truncated: frozenset[str], folder: str, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """A partition's events in, its typed chunk files out (the ``mapInArrow`` function, settings bound)."""
    prepare_worker()
    received = list(batches)
    if not received:
        return
    finals = net_identities(pa.Table.from_batches(received))
    del received
    yield from chunk_batches(tables, truncated, folder, finals.to_batches())
