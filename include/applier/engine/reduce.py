"""Per identity, its first and last events: the compile's aggregation, in Arrow on each executor.

After the shuffle on ``(table, salt)`` every event of an identity is in one
partition. A partition's events are sorted once (Arrow's sort, in C++) on
``(table, group, key, commit_lsn, lsn)``, the table as a small integer and
without the images (taken once, at each identity's last event); each run of
one table, group and key is an identity: its first event says whether it
existed before the cycle, its last one gives its final state and image, and
the counts add up. The result holds each table's identities together, in
group order, as :func:`applier.engine.identity.chunk_batches` takes it.

Spark's own aggregation (``min_by``/``max_by`` over a struct holding the image)
kept a string in its buffer, so it sorted the events on both sides of the
shuffle and again within partitions; doing it here sorts them once. A partition
is held whole meanwhile: the compile sizes its partitions by input bytes
(:data:`applier.engine.netting.INPUT_BYTES_PER_PARTITION`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.engine.identity import chunk_batches
from applier.engine.worker_path import trim_import_caches
from applier.intermediate.schema import TableDef

_ORDER = [("table", "ascending"), ("group", "ascending"), ("key", "ascending")]
_POSITION = [("commit_lsn", "ascending"), ("lsn", "ascending")]


def net_identities(events: pa.Table) -> pa.Table:
    """One row per identity of ``events``: ``table``, ``group``, ``existed`` (first event), ``present`` and
    ``image`` (last event) and ``n`` (summed); each table's together, sorted by group and key.

    Args:
        events: events as :func:`applier.engine.events.event_batch` makes them.
    """
    if events.num_rows == 0:
        return pa.table(
            {"table": pa.array([], pa.string()), "group": pa.array([], pa.int32()), "existed": pa.array([], pa.bool_()),
             "present": pa.array([], pa.bool_()), "image": pa.array([], pa.string()), "n": pa.array([], pa.int64())}
        )  # fmt: skip
    # Tables as small integers: sorting on them groups the rows as well as on the names, and faster.
    tables = events.column("table").combine_chunks().dictionary_encode().indices
    small = ("group", "key", "commit_lsn", "lsn")
    sortable = pa.table({"table": tables, **{name: events.column(name) for name in small}})
    order = pc.sort_indices(sortable, sort_keys=_ORDER + _POSITION)
    count = events.num_rows
    changes = np.zeros(count, dtype=bool)
    changes[0] = True
    for name, _ in _ORDER:
        column = sortable.column(name).take(order).combine_chunks()
        differs = pc.not_equal(column.slice(1), column.slice(0, count - 1))
        changes[1:] |= differs.to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(changes)
    ends = np.append(starts[1:], count) - 1
    first, last = order.take(pa.array(starts)), order.take(pa.array(ends))
    counts = np.add.reduceat(events.column("n").take(order).to_numpy().astype(np.int64), starts)
    return pa.table(
        {
            "table": events.column("table").take(first),
            "group": events.column("group").take(first),
            "existed": events.column("existed").take(first),
            "present": events.column("present").take(last),
            "image": events.column("image").take(last),
            "n": pa.array(counts, pa.int64()),
        }
    )


def net_batches(
    tables: Mapping[str, TableDef], truncated: frozenset[str], folder: str, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """A partition's events in, its typed chunk files out (the ``mapInArrow`` function, settings bound)."""
    trim_import_caches()
    received = list(batches)
    if not received:
        return
    finals = net_identities(pa.Table.from_batches(received))
    del received
    yield from chunk_batches(tables, truncated, folder, finals.to_batches())
