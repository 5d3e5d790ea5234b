"""Committed rows in, events on row identities out: the compile's first step, in Python on Spark's executors.

Each committed row becomes one or two *events* on an identity (the typed
primary key, or the whole row value of a table without one,
:meth:`~applier.engine.identity.TableRules.key`):

- an insert: the after image's identity is present, and did not exist before;
- a delete: the before image's identity is absent, and existed;
- an update keeping its key: present, and existed;
- an update moving its key, or any update of a table without a key (its row
  value is its identity): the before identity absent, then the after one present.

Only the identities are computed row by row (each image's key decoded in C by
msgspec, with its own table's rules); the rest are column operations over the
whole batch, whatever the number of tables in it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.engine.identity import rules_of
from applier.engine.image_checks import Checks, PairRules, refusal
from applier.engine.worker_path import trim_import_caches
from applier.intermediate.schema import TableDef

EVENT_SCHEMA = pa.schema(
    [
        ("table", pa.string()),
        ("key", pa.binary()),
        ("commit_lsn", pa.int64()),
        ("lsn", pa.int64()),
        ("present", pa.bool_()),
        ("existed", pa.bool_()),
        ("n", pa.int32()),
        ("image", pa.string()),
        ("salt", pa.int32()),
        ("group", pa.int32()),
    ]
)


def _check(batch: pa.RecordBatch, checks: Checks) -> None:
    """Raise the refusal of the batch's first row whose images break its pair's definitions."""
    seqs = batch.column("seq").to_pylist()
    tables, ops, befores, afters = (batch.column(c).to_pylist() for c in ("table", "op", "before", "after"))
    wrong = PairRules(checks).first_problem(seqs, tables, ops, befores, afters)
    if wrong is not None:
        i, problem = wrong
        raise refusal(seqs[i], batch.column("lsn")[i].as_py(), batch.column("xid")[i].as_py(), tables[i], problem)


def _eventful(rows: pa.Table, truncates: Mapping[str, tuple[int, int]]) -> pa.Table:
    """The rows that give events: committed here, not ``T``, and after their table's last truncate."""
    keep = pc.and_(pc.is_valid(rows.column("commit_lsn")), pc.not_equal(rows.column("op"), "T"))
    for table, (commit_lsn, lsn) in truncates.items():
        before_cut = pc.or_(
            pc.less(rows.column("commit_lsn"), commit_lsn),
            pc.and_(pc.equal(rows.column("commit_lsn"), commit_lsn), pc.less_equal(rows.column("lsn"), lsn)),
        )
        keep = pc.and_(keep, pc.invert(pc.and_(pc.equal(rows.column("table"), table), before_cut)))
    return rows.filter(keep)


def _keys(key_of: Mapping[str, Callable[[str], bytes]], names: list[str], images: pa.ChunkedArray) -> pa.Array:
    """Each image's identity by its own table's rules (null for no image)."""
    pairs = zip(names, images.to_pylist(), strict=True)
    return pa.array([None if image is None else key_of[name](image) for name, image in pairs], pa.binary())


def _events(
    rows: pa.Table, tables: Mapping[str, TableDef], spreads: Mapping[str, int], bounds: Sequence[int]
) -> pa.Table:
    """The events of rows that give some (none ``T``), in the columns of :data:`EVENT_SCHEMA`.

    Only the identities are computed row by row; the rest are column operations
    over all the rows at once, whatever the number of tables among them.
    """
    names = rows.column("table").to_pylist()
    rules = {name: rules_of(tables[name]) for name in set(names)}
    key_of = {name: r.key_of for name, r in rules.items()}
    op, before, after = rows.column("op"), rows.column("before"), rows.column("after")
    before_key, after_key = _keys(key_of, names, before), _keys(key_of, names, after)
    updated = pc.equal(op, "U")
    # A row value of a table without a key is its identity: each update removes one copy and adds one.
    keyless = pc.is_in(rows.column("table"), pa.array([n for n, r in rules.items() if r.keyless], pa.string()))
    moved = pc.and_(updated, pc.or_(keyless, pc.fill_null(pc.not_equal(before_key, after_key), False)))
    kept = pc.and_(updated, pc.invert(moved))  # an update in place: its identity existed and stays
    gone = pc.or_(pc.equal(op, "D"), moved)  # the before image's identity ends absent
    arrived = pc.is_valid(after)  # the after image's identity ends present
    commit_lsn = rows.column("commit_lsn").combine_chunks()
    groups = np.searchsorted(np.asarray(bounds, np.int64), commit_lsn.to_numpy(), side="right") if bounds else None
    group = pa.array(np.zeros(rows.num_rows, np.int32) if groups is None else groups, pa.int32())
    spread = {name: n for name, n in spreads.items() if n > 1 and name in rules}

    def events(mask: pa.Array, key: pa.Array, image: pa.ChunkedArray, present: bool, existed: pa.Array) -> pa.Table:
        taken, table = pc.filter(key, mask), pc.filter(rows.column("table"), mask)
        n = len(taken)
        if spread:
            by = zip(table.to_pylist(), taken.to_pylist(), strict=True)
            salts = pa.array([zlib.crc32(k) % spread[t] if t in spread else 0 for t, k in by], pa.int32())
        else:
            salts = pa.array(np.zeros(n, np.int32))
        return pa.table(
            {
                "table": table,
                "key": taken,
                "commit_lsn": pc.filter(commit_lsn, mask),
                "lsn": pc.filter(rows.column("lsn"), mask),
                "present": pa.repeat(present, n),
                "existed": pc.filter(existed, mask),
                "n": pa.repeat(pa.scalar(1 if present else -1, pa.int32()), n),
                "image": pc.filter(image, mask),
                "salt": salts,
                "group": pc.filter(group, mask),
            },
            schema=EVENT_SCHEMA,
        )

    return pa.concat_tables(
        [
            events(gone, before_key, before, False, pa.repeat(True, rows.num_rows)),
            events(arrived, after_key, after, True, kept),
        ]
    )


def event_batch(
    batch: pa.RecordBatch,
    tables: Mapping[str, TableDef],
    truncates: Mapping[str, tuple[int, int]],
    spreads: Mapping[str, int] | None = None,
    bounds: Sequence[int] = (),
    checks: Checks | None = None,
) -> pa.RecordBatch:
    """The events of a batch of committed rows (``.dat`` columns plus ``commit_lsn``).

    With ``checks``, the batch holds every row of the pairs read (``seq`` and
    ``xid`` too, ``commit_lsn`` null for a row of a transaction not committed
    here): the images of the pairs in ``checks`` are checked first
    (:class:`~applier.engine.image_checks.PairRules`; a refusal raises
    :func:`~applier.engine.image_checks.refusal`'s error), and only the
    committed rows give events.

    ``T`` rows, and rows at or before their table's last truncate, give none:
    the target empties the table first. An event's ``salt`` spreads a busy
    table's identities over ``spreads[table]`` shuffle partitions (a hash of
    the key, the same in every process); it is 0 for every other table, whose
    identities all meet in one partition and become one chunk. Its ``group``
    is the compilable group of its transaction: groups are runs of commit
    order, and ``bounds`` holds the commit lsn each group after the first
    starts at (none: one group, 0).
    """
    if checks is not None:
        _check(batch, checks)
    rows = _eventful(pa.Table.from_batches([batch]), truncates)
    events = _events(rows, tables, spreads or {}, bounds) if rows.num_rows else EVENT_SCHEMA.empty_table()
    return pa.RecordBatch.from_arrays([column.combine_chunks() for column in events.columns], schema=EVENT_SCHEMA)


def event_batches(
    tables: Mapping[str, TableDef],
    truncates: Mapping[str, tuple[int, int]],
    spreads: Mapping[str, int],
    bounds: Sequence[int],
    checks: Checks | None,
    batches: Iterable[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """:func:`event_batch` over a partition (the ``mapInArrow`` function, with its settings bound)."""
    trim_import_caches()
    for batch in batches:
        yield event_batch(batch, tables, truncates, spreads, bounds, checks)
