"""The compile of a small part of a cycle in the driver, without a Spark job.

The enhanced retry (:mod:`applier.engine.units`) compiles ever smaller groups
of a refused cycle: dozens of groups of a few transactions each. A Spark job
costs about 0.8 s whatever its size, so finding one bad transaction among
1,000 took 40 s, nearly all of it job overhead. Below :data:`LOCAL_ROWS`
rows a part is compiled here instead, by the very functions the executors
run (:func:`~applier.engine.events.event_batch` before the shuffle,
:func:`~applier.engine.identity.chunk_batches` after it); only the
aggregation per identity between them, Spark's ``groupBy``, is pyarrow's:

- the first event by position ``(commit_lsn, lsn)`` says whether the identity existed;
- the last one gives its final presence and image;
- the counts add up.

The rows come from the part's ``.dat`` files (only its transactions'), its
transactions' spill files and the committed rows still in memory when the
cycle began, as Spark would read them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from applier.engine.buffers import BufferedTxn
from applier.engine.compiled import CompiledCycle
from applier.engine.cycle_input import CycleInput
from applier.engine.events import event_batch
from applier.engine.identity import CHUNK_SCHEMA, chunk_batches
from applier.engine.reading import open_rows, read_dat, spill_inputs
from applier.engine.spill import read_spill
from applier.intermediate.pairs import DAT_COLUMNS
from applier.intermediate.schema import TableDef

LOCAL_ROWS = 20_000
"""Parts of at most this many input rows compile in the driver."""


def part_rows(cycle: CycleInput, taken: Mapping[str, BufferedTxn]) -> int:
    """The input rows of a part's committed transactions (``cycle`` and ``taken`` narrowed to the part)."""
    return cycle.rows_of(cycle.commits) + sum(t.rows for t in taken.values())


class PairCache:
    """The ``.dat`` tables a cycle's parts read, decoded once: the last few, within a byte limit.

    A refused cycle, or one applied transaction by transaction, compiles
    hundreds of small parts from the same pairs; decoding a pair of a million
    rows for each took 100 ms a transaction. Pairs larger than the limit are
    read each time.
    """

    def __init__(self, max_bytes: int = 256 * 1024 * 1024, pairs: int = 2) -> None:
        self.max_bytes, self.pairs = max_bytes, pairs
        self._tables: dict[Path, pa.Table] = {}

    def read(self, path: Path) -> pa.Table:
        """The ``.dat`` columns of the pair file ``path``."""
        table = self._tables.pop(path, None)
        if table is None:
            table = read_dat(path)
        if table.nbytes <= self.max_bytes // self.pairs:
            self._tables[path] = table  # the newest last
            while len(self._tables) > self.pairs:
                del self._tables[next(iter(self._tables))]
        return table


def committed_rows_locally(
    cycle: CycleInput, taken: Mapping[str, BufferedTxn], memory_file: Path | None, cache: PairCache | None = None
) -> pa.Table:
    """The rows of ``cycle``'s committed transactions with their ``commit_lsn`` (what Spark's input join gives)."""
    commits = cycle.commits
    wanted = pa.array(sorted(commits), pa.string())
    read = cache.read if cache is not None else None  # None: a batch at a time
    parts = [rows for _, rows in open_rows(cycle, set(commits), read)]
    for path in spill_inputs(taken, memory_file):
        for batch in read_spill(path):
            data = pa.Table.from_batches([batch]).select(list(DAT_COLUMNS))
            parts.append(data.filter(pc.is_in(data["xid"], value_set=wanted)))
    rows = pa.concat_tables([p.cast(parts[0].schema) for p in parts]) if parts else _empty()
    commit_lsn = [commits[x] for x in rows["xid"].to_pylist()]
    return rows.append_column("commit_lsn", pa.array(commit_lsn, pa.int64()))


def compile_locally(
    rows: pa.Table,
    tables: Mapping[str, TableDef],
    truncates: Mapping[str, tuple[int, int]],
    touched: Iterable[str],
    into: CompiledCycle,
    groups: Sequence[tuple[int, CompiledCycle]] = (),
) -> CompiledCycle:
    """:func:`~applier.engine.compile.compile_cycle`'s result, computed in this process.

    Args:
        rows: the committed rows (``.dat`` columns plus ``commit_lsn``), ``T`` rows included.
        tables: the definitions by name; ``truncates`` each truncated table's last truncate position.
        touched: the tables the rows change.
        into: where the chunks go (the first group's, with ``groups``).
        groups: the later compilable groups, as :func:`~applier.engine.compile.compile_cycle` takes them.
    """
    names = sorted(set(touched) | set(truncates))
    definitions = {n: tables[n] for n in names}
    if not names:
        return into
    bounds = [start for start, _ in groups]
    holders = [into, *(holder for _, holder in groups)]
    batches = rows.to_batches() or [pa.RecordBatch.from_pylist([], rows.schema)]
    events = pa.Table.from_batches([event_batch(b, definitions, truncates, None, bounds) for b in batches])
    if events.num_rows:
        ordered = events.sort_by(
            [("table", "ascending"), ("key", "ascending"), ("commit_lsn", "ascending"), ("lsn", "ascending")]
        )
        finals = ordered.group_by(["table", "group", "key"], use_threads=False).aggregate(
            [("existed", "first"), ("present", "last"), ("image", "last"), ("n", "sum")]
        )
        finals = finals.rename_columns(
            {"existed_first": "existed", "present_last": "present", "image_last": "image", "n_sum": "n"}
        ).sort_by([("table", "ascending"), ("group", "ascending")])
        aggregated = finals.select(["table", "group", "existed", "present", "image", "n"]).to_batches()
    else:
        aggregated = []
    for described in chunk_batches(definitions, frozenset(truncates), str(into.folder), aggregated):
        for chunk in pa.Table.from_batches([described], CHUNK_SCHEMA).to_pylist():
            holders[chunk["group"]].add_file(chunk["table"], Path(chunk["path"]), chunk["bytes"], chunk)
    return into


def _empty() -> pa.Table:
    return pa.table({name: pa.array([], pa.int64() if name == "lsn" else pa.string()) for name in DAT_COLUMNS})
