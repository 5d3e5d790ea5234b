"""Per identity, its first and last events: the compile's aggregation, in Arrow on each executor.

Events are folded per identity (:func:`fold`) twice: by each executor over
its input partition's events before the shuffle (an identity changed many
times in a pair then crosses it once), and after the shuffle on
``(table, salt)``, where every event of an identity is in one partition. A
fold sorts the events once (Arrow's sort, in C++) on ``(table, group, key)``
and each event's first position, the table as a small integer and without
the images (taken once, at each identity's last event); each run of one
table, group and key is an identity: its first event says whether it existed
before the cycle, its last one (the greatest position) gives its final state
and image, and the counts add up. The result holds each table's identities
together, in group order, as :func:`applier.engine.identity.chunk_batches`
takes it.

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
import pyarrow.compute as pc

from applier.engine.identity import chunk_batches
from applier.engine.worker_path import prepare_worker
from applier.intermediate.schema import TableDef

_ORDER = [("table", "ascending"), ("group", "ascending"), ("key", "ascending")]
_FIRST = [("first_commit_lsn", "ascending"), ("first_lsn", "ascending")]
_NO_LSN = np.iinfo(np.int64).min
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

    The result holds each table's identities together, sorted by group and key.
    """
    # Tables as small integers: sorting on them groups the rows as well as on the names, and faster.
    tables = events.column("table").combine_chunks().dictionary_encode().indices
    small = ("group", "key", "first_commit_lsn", "first_lsn")
    sortable = pa.table({"table": tables, **{name: events.column(name) for name in small}})
    order = pc.sort_indices(sortable, sort_keys=_ORDER + _FIRST)  # stable: ties keep their order
    count = events.num_rows
    changes = np.zeros(count, dtype=bool)
    changes[0] = True
    for name, _ in _ORDER:
        column = sortable.column(name).take(order).combine_chunks()
        differs = pc.not_equal(column.slice(1), column.slice(0, count - 1))
        changes[1:] |= differs.to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(changes)
    run = np.cumsum(changes) - 1  # each sorted event's identity
    # The last event: the greatest (commit_lsn, lsn) of its identity, the later one in arrival on a tie.
    commit_lsn = events.column("commit_lsn").take(order).to_numpy()
    lsn = events.column("lsn").take(order).to_numpy()
    latest = commit_lsn == np.maximum.reduceat(commit_lsn, starts)[run]
    lsn = np.where(latest, lsn, _NO_LSN)
    latest &= lsn == np.maximum.reduceat(lsn, starts)[run]
    ends = np.maximum.reduceat(np.where(latest, np.arange(count), -1), starts)
    first, last = order.take(pa.array(starts)), order.take(pa.array(ends))
    counts = np.add.reduceat(events.column("n").take(order).to_numpy().astype(np.int64), starts)
    columns = {name: events.column(name).take(last) for name in _FROM_LAST}
    columns.update({name: events.column(name).take(first) for name in _FROM_FIRST})
    columns["n"] = pa.array(counts.astype(np.int32), pa.int32())
    return pa.table({name: columns[name] for name in events.column_names})


def net_identities(events: pa.Table) -> pa.Table:
    """One row per identity of ``events``: ``table``, ``group``, ``existed`` (first event), ``present`` and
    ``image`` (last event) and ``n`` (summed); each table's together, sorted by group and key.

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
