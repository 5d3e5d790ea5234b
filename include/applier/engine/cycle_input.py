"""What the driver learnt from a cycle's pairs (:class:`CycleInput`), and the lookups made in it.

:func:`applier.engine.reading.read_cycle` fills it as it reads and checks the
pairs; the groups, the compile's read tasks, the buffers and the parts ask it
which transactions commit, which pairs hold their rows and how many.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.engine.touches import Truncate
from applier.errors import IntermediateFileError
from applier.intermediate.pairs import PairRef
from applier.intermediate.schema import TableDef

if TYPE_CHECKING:
    from applier.engine.open_rows import OpenRows


@dataclass
class CycleInput:
    """What the driver learnt from a cycle's pairs.

    Attributes:
        pairs: the accepted pairs (a refused pair and those after it are not here).
        commits: xid -> commit lsn of transactions committed in these pairs.
        rollbacks: xids rolled back in these pairs.
        rows_read: rows in the accepted pairs.
        refused: the error of the pair that cut the cycle short, if any.
        xids_by_seq: for each pair, the xids that have rows in it, each once (an
            Arrow array: a set of every xid of 392,000 transactions weighed 24 MiB
            more than a tuple, and a tuple's strings took a cycle of 100,000
            transactions 40 ms to make and intern). :func:`xids_of` reads it.
        begun_at: xid -> source time (``ts``) of the begin of each transaction begun
            in these pairs and still open after them (what ``applier status`` shows).
        truncates: ``(xid, (table, lsn))`` of every ``T`` row in these pairs.
        table_rows: rows per table in these pairs (of any transaction).
        counts: rows per transaction and table, one table per pair with rows
            (columns ``xid``, ``table``, ``rows``).
            In Arrow, not in Python maps: a cycle of 392,000 transactions held
            70 MiB of ``(xid, table)`` keys.
        longest_image: per table, its longest image in these pairs (bytes), once
            :attr:`unmeasured` is empty.
        unmeasured: the pairs whose images are still to be measured for
            :attr:`longest_image`, by the compile job's read tasks or the driver
            (:mod:`~applier.engine.measuring`; shared by narrowed parts, as
            :attr:`unchecked` is).
        commit_ends: per pair holding commits, in order, ``(its last commit's lsn,
            its seq)``: where :meth:`commit_seq` finds the pair of a commit.
        autocorrect: tables a nonatomic materialization copies in these pairs (``cdc.autocorrect``).
        unchecked: the pairs whose row images are still to be checked: seq -> the
            pair's table definitions (shared by :func:`~applier.engine.sparkapply.narrowed` parts).
        digests: of those, seq -> the ``dat_sha256`` their ``.dat`` must have, checked with the images.
        read_seconds: how long reading and checking the pairs took.
        dat_read_by_executors: Spark's executors read the pairs' ``.dat`` files
            for the checks (:mod:`~applier.engine.dat_facts`).
        open_after: the pairs holding rows of the transactions still open after
            these, for the buffers (:mod:`~applier.engine.open_rows`; set by the run).
    """

    pairs: list[PairRef] = field(default_factory=list)
    commits: dict[str, int] = field(default_factory=dict)
    rollbacks: set[str] = field(default_factory=set)
    rows_read: int = 0
    refused: IntermediateFileError | None = None
    xids_by_seq: dict[int, pa.Array] = field(default_factory=dict)
    begun_at: dict[str, str] = field(default_factory=dict)
    truncates: list[tuple[str, Truncate]] = field(default_factory=list)
    table_rows: Counter[str] = field(default_factory=Counter)
    counts: list[pa.Table] = field(default_factory=list)
    longest_image: dict[str, int] = field(default_factory=dict)
    unmeasured: set[int] = field(default_factory=set)
    commit_ends: list[tuple[int, int]] = field(default_factory=list)
    autocorrect: set[str] = field(default_factory=set)
    unchecked: dict[int, dict[str, TableDef]] = field(default_factory=dict)
    digests: dict[int, str] = field(default_factory=dict)
    read_seconds: float = 0.0
    dat_read_by_executors: bool = False
    open_after: OpenRows | None = None

    @property
    def bytes(self) -> int:
        return sum(p.size for p in self.pairs)

    @cached_property
    def pair_commits(self) -> dict[int, pa.Table]:
        """Per pair, the ``xid, commit_lsn`` (:data:`COMMITS`, by xid) of the commits with rows in it.

        One lookup for all the pairs, made once a cycle is read (its commits
        no longer change; a narrowed part is a new object): the compile's
        check for input and its read tasks both ask.
        """
        keys = pa.array(list(self.commits), pa.string())
        lsns = pa.array(list(self.commits.values()), pa.int64())
        found = {}
        for ref, (xids, at) in zip(self.pairs, pair_lookups(self, keys), strict=True):
            committed = pc.is_valid(at)
            mine, order = xids.filter(committed), pc.take(lsns, at.filter(committed))
            by_xid = pc.sort_indices(mine)
            found[ref.seq] = pa.table([mine.take(by_xid), order.take(by_xid)], schema=COMMITS)
        return found

    def checked(self) -> None:
        """The images and digests of every pair are checked: none is left (:attr:`unchecked`, :attr:`digests`)."""
        self.unchecked.clear()
        self.digests.clear()

    def commit_seq(self, xid: str) -> int | None:
        """The pair whose ``.trn`` holds the commit of ``xid`` (None: not committed in these pairs).

        Pairs follow each other in lsn order, so the pair is the first whose
        last commit is at or after this one: no map from every xid is kept.
        """
        lsn = self.commits.get(xid)
        if lsn is None:
            return None
        at = bisect.bisect_left(self.commit_ends, (lsn, 0))
        return self.commit_ends[at][1] if at < len(self.commit_ends) else None

    def all_counts(self) -> pa.Table:
        """:attr:`counts` as one table (the pairs' tables as its chunks, not copied).

        Look the cycle's xids up in it once (``pc.index_in`` hashes its value
        set on every call: 392,000 xids looked up pair by pair took a second).
        """
        return pa.concat_tables(self.counts) if self.counts else _NO_COUNTS

    def rows_of(self, xids: Collection[str]) -> int:
        """Rows of the transactions ``xids`` in these pairs."""
        return pc.sum(self.counts_of(xids)["rows"]).as_py() or 0

    def tables_by_group(self, groups: Sequence[Collection[str]]) -> list[set[str]]:
        """The tables that rows of each group of transactions change in these pairs (a group per list of xids).

        One lookup of the cycle's counts in the xids of all the groups, in
        Arrow: a cycle compiled in dozens of groups filtered every pair's counts
        once per group.
        """
        found: list[set[str]] = [set() for _ in groups]
        counts = self.all_counts()
        if not counts.num_rows or not groups:
            return found
        xids = pa.array([xid for group in groups for xid in group], counts["xid"].type)
        group_of = pa.array(np.repeat(np.arange(len(groups), dtype=np.int64), [len(group) for group in groups]))
        group = pc.take(group_of, pc.index_in(counts["xid"], xids))
        hit = pa.table({"group": group, "table": counts["table"]}).filter(pc.is_valid(group))
        pairs = hit.group_by(["group", "table"], use_threads=False).aggregate([])
        for number, table in zip(pairs["group"].to_pylist(), pairs["table"].to_pylist(), strict=True):
            found[number].add(table)
        return found

    def counts_of(self, xids: Collection[str]) -> pa.Table:
        """The rows of :meth:`all_counts` of the transactions ``xids``."""
        counts = self.all_counts()
        return counts.filter(pc.is_in(counts["xid"], pa.array(list(xids), counts["xid"].type)))


# Made from schemas, not lists: pyarrow imports pandas to check a list it is given (0.27 s), and the JVM
# starts only once the driver's imports are done.
NO_XIDS = pa.nulls(0, pa.string())
"""No xids: a pair without rows (:attr:`CycleInput.xids_by_seq`)."""
COMMITS = pa.schema([("xid", pa.string()), ("commit_lsn", pa.int64())])
"""Commits as read tasks carry them: ``xid``, ``commit_lsn``."""
_COUNTS = pa.schema([("xid", pa.string()), ("table", pa.string()), ("rows", pa.int64())])
_NO_COUNTS = pa.Table.from_arrays([pa.nulls(0, field.type) for field in _COUNTS], schema=_COUNTS)


def pairs_holding(cycle: CycleInput, xids: Collection[str]) -> list[PairRef]:
    """The cycle's pairs that hold rows of any of ``xids`` (a dict: its keys), in order."""
    if not xids:
        return []
    found = pair_lookups(cycle, pa.array(list(xids), pa.string()))
    return [ref for ref, (_, at) in zip(cycle.pairs, found, strict=True) if at.null_count < len(at)]


def xids_of(cycle: CycleInput, seq: int) -> pa.Array:
    """The xids with rows in pair ``seq`` (:attr:`CycleInput.xids_by_seq`), as a string array (none: empty)."""
    xids = cycle.xids_by_seq.get(seq, NO_XIDS)
    return xids if isinstance(xids, pa.Array) else pa.array(sorted(xids), pa.string())


def pair_lookups(cycle: CycleInput, keys: pa.Array) -> list[tuple[pa.Array, pa.Array]]:
    """Per pair of the cycle, in order: its xids and the position of each in ``keys`` (null: not there).

    One lookup for all the pairs: Arrow hashes ``keys`` once a call, and a
    cycle's commits are a hundred thousand keys.
    """
    arrays = [xids_of(cycle, ref.seq) for ref in cycle.pairs]
    if not arrays:
        return []
    at = pc.index_in(pa.concat_arrays(arrays), value_set=keys)
    found, start = [], 0
    for xids in arrays:
        found.append((xids, at.slice(start, len(xids))))
        start += len(xids)
    return found
