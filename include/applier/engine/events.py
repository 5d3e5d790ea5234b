"""Committed rows in, events on row identities out: the compile's first step, in Python on Spark's executors.

Each committed row becomes one or two *events* on an identity (the typed
primary key, or the whole row value of a table without one,
:meth:`~applier.engine.identity.TableRules.key`):

- an insert: the after image's identity is present, and did not exist before;
- a delete: the before image's identity is absent, and existed;
- an update keeping its key: present, and existed;
- an update moving its key, or any update of a table without a key (its row
  value is its identity): the before identity absent, then the after one present.

Only the identities are computed row by row, with each row's own table's rules
(in C, :func:`applier.intermediate.native.identities`; what it leaves, decoded
by msgspec); the rest are column operations over the whole batch, whatever the
number of tables in it.
"""

from __future__ import annotations

import functools
import itertools
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.engine.identity import TableRules, rules_of
from applier.engine.image_checks import Checks, PairRules, Refused, record_refusal, refusal, refused_in
from applier.engine.reduce import fold
from applier.engine.worker_path import prepare_worker
from applier.intermediate import native
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
        ("first_commit_lsn", pa.int64()),
        ("first_lsn", pa.int64()),
    ]
)
"""An event of an identity, ending at ``commit_lsn, lsn`` and starting at ``first_commit_lsn, first_lsn``.

A row's event is at one position, where it starts and ends; a folded event
spans several rows' events of one identity (:func:`~applier.engine.reduce.fold`).
"""

FOLD_BYTES = 64 * 1024 * 1024
"""Events an executor holds before it folds them and passes them on (:func:`event_batches`)."""


Images = tuple[Sequence[Any], Sequence[Any], list[Any] | None, list[Any] | None]
"""A batch's images as Python values: before and after texts (:func:`_texts`), those the check decoded (or None)."""


def _checked(batch: pa.RecordBatch, tables: Mapping[str, TableDef], checks: PairRules | None) -> Images:
    """The batch's images, checked against their pairs' definitions when ``checks`` names the pairs.

    Raises the refusal of the batch's first row whose images break its pair's
    definitions. An image the check decoded is kept for its identity when its
    pair defines the table as the cycle does (:meth:`~applier.engine.identity.TableRules.key_of_checked`).
    """
    befores, afters = _texts(batch.column("before")), _texts(batch.column("after"))
    if checks is None:
        return befores, afters, None, None
    seqs, tables_of = batch.column("seq").to_pylist(), batch.column("table").to_pylist()
    images = (batch.column("before"), batch.column("after"))
    checked = checks.check(seqs, tables_of, batch.column("op").to_pylist(), befores, afters, images)
    if checked.problem is not None:
        i, problem = checked.problem
        lsn, xid = batch.column("lsn")[i].as_py(), batch.column("xid")[i].as_py()
        raise refusal(seqs[i], lsn, xid, tables_of[i], problem)
    if checked.befores is None or checked.afters is None:
        return befores, afters, None, None
    for i, where in enumerate(zip(seqs, tables_of, strict=True)):
        if not checks.defines_as(where, tables):
            checked.befores[i] = checked.afters[i] = None
    return befores, afters, checked.befores, checked.afters


class _Texts(Sequence[memoryview | None]):
    """:func:`_texts` of a column, each view made when asked for: with the C passes, few rows are read in Python.

    A batch's keyless rows, say, are a few percent of it: making every row's
    view to read those cost more than the C passes over the whole batch.
    """

    def __init__(self, column: pa.Array) -> None:
        self.column = column

    def __len__(self) -> int:
        return len(self.column)

    @functools.cached_property
    def _where(self) -> tuple[list[int], list[bool] | None, memoryview] | None:
        return _spans(self.column) if self.column.null_count < len(self.column) else None

    @functools.cached_property
    def _all(self) -> list[memoryview | None]:
        return _eager_texts(self.column)

    def __getitem__(self, i: Any) -> Any:
        where = self._where
        if where is None or not isinstance(i, int):
            return self._all[i]
        at, valid, view = where
        if valid is not None and not valid[i]:
            return None
        return view[at[i] : at[i + 1]]


def _texts(column: pa.Array) -> Sequence[memoryview | None]:
    """A string column's values as views of its buffer, None for null: msgspec reads a view as it reads a ``str``.

    Making a ``str`` of each image (a copy, and a scan of its UTF-8) and reading
    it back took longer than decoding the image from the view. With the C
    passes built, the views are made only if a row is read in Python.
    """
    return _Texts(column) if native.LIBRARY is not None else _eager_texts(column)


def _eager_texts(column: pa.Array) -> list[memoryview | None]:
    count = len(column)
    if column.null_count == count:
        return [None] * count
    spans = _spans(column)
    if spans is None:  # a string view, say: its values as Python strings
        return column.to_pylist()  # type: ignore[no-any-return]
    at, valid, view = spans
    if valid is None:
        return [view[start:end] for start, end in itertools.pairwise(at)]
    return [view[start:end] if ok else None for (start, end), ok in zip(itertools.pairwise(at), valid, strict=True)]


def _spans(column: pa.Array) -> tuple[list[int], list[bool] | None, memoryview] | None:
    """A string column's value offsets, validity (None: no nulls) and data; None for any other kind of column."""
    width = _OFFSETS.get(column.type)
    if width is None:
        return None
    _, offsets, data = column.buffers()
    at = np.frombuffer(offsets, width, len(column) + 1, column.offset * width().itemsize).tolist()
    valid = column.is_valid().to_numpy(zero_copy_only=False).tolist() if column.null_count else None
    return at, valid, memoryview(data)


_OFFSETS: dict[pa.DataType, Any] = {pa.string(): np.int32, pa.large_string(): np.int64}


def _eventful(rows: pa.RecordBatch, truncates: Mapping[str, tuple[int, int]]) -> pa.Array:
    """Which rows give events: committed here, not ``T``, and after their table's last truncate."""
    keep = pc.and_(pc.is_valid(rows.column("commit_lsn")), pc.not_equal(rows.column("op"), "T"))
    for table, (commit_lsn, lsn) in truncates.items():
        before_cut = pc.or_(
            pc.less(rows.column("commit_lsn"), commit_lsn),
            pc.and_(pc.equal(rows.column("commit_lsn"), commit_lsn), pc.less_equal(rows.column("lsn"), lsn)),
        )
        keep = pc.and_(keep, pc.invert(pc.and_(pc.equal(rows.column("table"), table), before_cut)))
    return keep


def _keys(
    rules: Mapping[str, TableRules],
    names: list[str],
    images: Sequence[Any],
    decoded: list[Any] | None,
    column: pa.Array,
    tables: pa.Array,
) -> pa.Array:
    """Each image's identity by its own table's rules (null for no image); ``tables``: ``names`` as a column.

    The C pass writes them (:func:`applier.intermediate.native.identities`);
    those it leaves (an image with an escaped string, say) come from the
    check's decoding where kept, or are decoded here.
    """

    def key(i: int) -> bytes | None:  # each table's key functions are made when one of its rows needs them
        image, row = images[i], None if decoded is None else decoded[i]
        if image is None:
            return None
        table = rules[names[i]]
        return table.key_of(image) if row is None else table.key_of_checked(row)

    plain = {name: r.native_keys for name, r in rules.items() if r.native_keys is not None}
    if not plain or native.LIBRARY is None:
        return pa.array([key(i) for i in range(len(names))], pa.binary())
    found = pc.index_in(tables, value_set=pa.array(list(plain), pa.string()))
    rule_of = pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    written, done = native.identities(column, rule_of, list(plain.values()))
    valid = column.is_valid()
    todo = np.flatnonzero(~done & valid.to_numpy(zero_copy_only=False))
    if len(todo):
        left = np.zeros(len(names), bool)
        left[todo] = True
        written = pc.replace_with_mask(written, left, pa.array([key(i) for i in todo.tolist()], pa.binary()))
    return pc.if_else(valid, written, pa.scalar(None, pa.binary()))


def _events(
    rows: pa.Table, images: Images, tables: Mapping[str, TableDef], spreads: Mapping[str, int], bounds: Sequence[int]
) -> pa.Table:
    """The events of rows that give some (none ``T``), in the columns of :data:`EVENT_SCHEMA`.

    Only the identities are computed row by row; the rest are column operations
    over all the rows at once, whatever the number of tables among them.
    """
    names = rows.column("table").to_pylist()
    rules = {name: rules_of(tables[name]) for name in set(names)}
    op, before, after = rows.column("op"), rows.column("before"), rows.column("after")
    table = rows.column("table").combine_chunks()
    before_key = _keys(rules, names, images[0], images[2], before.combine_chunks(), table)
    after_key = _keys(rules, names, images[1], images[3], after.combine_chunks(), table)
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
        position = pc.filter(commit_lsn, mask), pc.filter(rows.column("lsn"), mask)
        n = len(taken)
        if spread and native.LIBRARY is not None:
            busy = pc.index_in(table, value_set=pa.array(list(spread), pa.string())).fill_null(-1).to_numpy()
            spreads = np.append(np.array(list(spread.values()), np.int32), np.int32(0))[busy]
            salts = pa.array(native.salts(taken.combine_chunks() if isinstance(taken, pa.ChunkedArray) else taken,
                                          spreads))  # fmt: skip
        elif spread:
            by = zip(table.to_pylist(), taken.to_pylist(), strict=True)
            salts = pa.array([zlib.crc32(k) % spread[t] if t in spread else 0 for t, k in by], pa.int32())
        else:
            salts = pa.array(np.zeros(n, np.int32))
        return pa.table(
            {
                "table": table,
                "key": taken,
                "commit_lsn": position[0],
                "lsn": position[1],
                "present": pa.repeat(present, n),
                "existed": pc.filter(existed, mask),
                "n": pa.repeat(pa.scalar(1 if present else -1, pa.int32()), n),
                "image": pc.filter(image, mask),
                "salt": salts,
                "group": pc.filter(group, mask),
                "first_commit_lsn": position[0],
                "first_lsn": position[1],
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
    checks: Checks | PairRules | None = None,
) -> pa.RecordBatch:
    """The events of a batch of committed rows (``.dat`` columns plus ``commit_lsn``).

    With ``checks`` (the pairs to check, or their
    :class:`~applier.engine.image_checks.PairRules`, kept across a partition's
    batches), the batch holds every row of the pairs read (``seq`` and ``xid``
    too, ``commit_lsn`` null for a row of a transaction not committed here):
    its images are checked first (a refusal raises
    :func:`~applier.engine.image_checks.refusal`'s error), the identities of the
    committed rows come from the images the check decoded, and only those
    rows give events.

    ``T`` rows, and rows at or before their table's last truncate, give none:
    the target empties the table first. An event's ``salt`` spreads a busy
    table's identities over ``spreads[table]`` shuffle partitions (a hash of
    the key, the same in every process); it is 0 for every other table, whose
    identities all meet in one partition and become one chunk. Its ``group``
    is the compilable group of its transaction: groups are runs of commit
    order, and ``bounds`` holds the commit lsn each group after the first
    starts at (none: one group, 0).
    """
    images = _checked(batch, tables, PairRules(checks) if isinstance(checks, Mapping) else checks)
    keep = _eventful(batch, truncates)
    if keep.true_count < batch.num_rows:
        at = np.flatnonzero(keep.to_numpy(zero_copy_only=False)).tolist()  # a list is indexed by numpy ints 5x slower
        batch = batch.filter(keep)
        if isinstance(images[0], _Texts):
            texts: list[Sequence[Any]] = [_texts(batch.column(c)) for c in ("before", "after")]
        else:
            texts = [[v[i] for i in at] for v in images[:2]]
        decoded = [None if v is None else [v[i] for i in at] for v in images[2:]]
        images = (*texts, *decoded)  # type: ignore[assignment]
    rows = pa.Table.from_batches([batch])
    events = _events(rows, images, tables, spreads or {}, bounds) if rows.num_rows else EVENT_SCHEMA.empty_table()
    return pa.RecordBatch.from_arrays([column.combine_chunks() for column in events.columns], schema=EVENT_SCHEMA)


def event_batches(
    tables: Mapping[str, TableDef],
    truncates: Mapping[str, tuple[int, int]],
    spreads: Mapping[str, int],
    bounds: Sequence[int],
    checks: Checks | None,
    folder: str | None,
    batches: Iterable[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """:func:`event_batch` over a partition (the ``mapInArrow`` function, with its settings bound), folded.

    The events of up to :data:`FOLD_BYTES` are folded per identity
    (:func:`~applier.engine.reduce.fold`) before they go on: an identity
    changed many times in a partition crosses the shuffle once. A pair
    refused while the partition is read or checked is recorded in ``folder``
    (:func:`~applier.engine.image_checks.record_refusal`), and the partition
    ends there: the driver finds the refusal once the job is done (without a
    ``folder``, the refusal is raised). Once any partition of the job has
    refused a pair, the others stop at their next batch.
    """
    prepare_worker()
    rules = None if checks is None else PairRules(checks)
    watch = folder if checks is not None else None  # a job that checks nothing refuses nothing
    pending: list[pa.RecordBatch] = []
    held = 0
    try:
        for batch in batches:
            if watch is not None and refused_in(watch):
                return
            events = event_batch(batch, tables, truncates, spreads, bounds, rules)
            if events.num_rows:
                pending.append(events)
                held += events.nbytes
            if held >= FOLD_BYTES:
                yield from _folded(pending)
                pending, held = [], 0
    except Refused as refused:
        if folder is None:
            raise
        record_refusal(folder, refused)
        return
    yield from _folded(pending)


def _folded(events: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    if events:
        yield from fold(pa.Table.from_batches(events)).to_batches(max_chunksize=_OUT_ROWS)


_OUT_ROWS = 10_000  # rows per batch handed back to Spark (its own default for Arrow batches)
