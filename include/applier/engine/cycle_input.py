"""What the driver learnt from a cycle's pairs (:class:`CycleInput`), and the lookups made in it.

:func:`applier.engine.reading.read_cycle` fills it as it reads and checks the
pairs; the groups, the compile's read tasks, the buffers and the parts ask it
which transactions commit, which pairs hold their rows and how many.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress, repeat
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

        Made once a cycle is read (its commits no longer change; a narrowed
        part is a new object): the compile's check for input and its read
        tasks both ask. Each pair's xids are looked up in :attr:`commits`
        itself (:func:`commit_lsns_in`).
        """
        found = {}
        for ref in self.pairs:
            xids = xids_of(self, ref.seq)
            lsns = commit_lsns_in(self.commits, xids)
            committed = pc.is_valid(lsns)
            mine, order = xids.filter(committed), lsns.filter(committed)
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

    @cached_property
    def counts_commit_lsns(self) -> list[np.ndarray]:
        """Per table of :attr:`counts`, the commit lsn in :attr:`commits` of each row's xid (a minimum int: none).

        Looked up once a cycle is read (its commits no longer change; a
        narrowed part is a new object), for the two that walk the counts by
        commit: the transactions' shapes (:func:`~applier.engine.parts.txn_shapes`)
        and the groups' tables (:meth:`tables_by_group`). Each looked them up
        on its own: a fifth of the driver's Python in a cycle on a cluster.

        Each pair's committed xids are looked up once (:attr:`pair_commits`,
        which the compile asks for too); its counts' rows, an xid per table it
        changes, find theirs there with one Arrow lookup in the pair's own
        commits, not one dict lookup per row.
        """
        with_rows = [ref.seq for ref in self.pairs if len(self.xids_by_seq.get(ref.seq, NO_XIDS))]
        if len(with_rows) != len(self.counts):  # counts not read pair by pair (_note_pair): look each row up
            return [commit_lsns_of(self.commits, counts["xid"]) for counts in self.counts]
        found = []
        for seq, counts in zip(with_rows, self.counts, strict=True):
            commits = self.pair_commits[seq]
            at = pc.index_in(counts["xid"].cast(pa.string()), value_set=commits["xid"])
            lsns = pc.take(commits["commit_lsn"], at).fill_null(_NOT_COMMITTED)
            found.append(lsns.to_numpy(zero_copy_only=False))
        return found

    def rows_of(self, xids: Collection[str]) -> int:
        """Rows of the transactions ``xids`` in these pairs."""
        return pc.sum(self.counts_of(xids)["rows"]).as_py() or 0

    def tables_by_group(self, groups: Sequence[Collection[str]]) -> list[set[str]]:
        """The tables that rows of each group of transactions change in these pairs (a group per list of xids).

        The cycle's counts are looked up pair by pair, each xid's group found
        by its commit lsn (:func:`group_numbers`): a cycle compiled in dozens
        of groups filtered every pair's counts once per group, and one Arrow
        lookup of all the counts in every group's xids took 30 MiB for a
        moment at 392,000 transactions.
        """
        found: list[set[str]] = [set() for _ in groups]
        if not self.counts or not groups:
            return found
        numbers = group_numbers(self.commits, groups)
        for counts, wanted in zip(self.counts, self.counts_commit_lsns, strict=True):
            group = numbers(counts["xid"], wanted)
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


_NOT_COMMITTED = np.iinfo(np.int64).min


def _commit_lsns(commits: Mapping[str, int], xids: Sequence[str]) -> np.ndarray:
    return np.fromiter(map(commits.get, xids, repeat(_NOT_COMMITTED)), np.int64, len(xids))


def commit_lsns_of(commits: Mapping[str, int], xids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The commit lsn in ``commits`` of each of ``xids``, for :func:`commit_positions` and :func:`group_numbers`."""
    return _commit_lsns(commits, xids.to_pylist())


def commit_lsns_in(commits: Mapping[str, int], xids: pa.Array) -> pa.Array:
    """The commit lsn in ``commits`` of each of ``xids`` (null: not committed there), as an int64 array.

    Looked up in the cycle's own map, one pair's xids at a time: one Arrow
    lookup of every pair's xids hashed the cycle's commits again, 29 MiB for
    a moment at 392,000 transactions and the driver's peak. The map is about
    as fast: 0.15 s for 420,000 xids, where Arrow took 0.13 s.
    """
    found = commit_lsns_of(commits, xids)
    return pa.array(found, pa.int64(), mask=found == _NOT_COMMITTED)


def commit_positions(commit_lsns: np.ndarray, wanted: np.ndarray) -> pa.Array:
    """The position of each commit of ``wanted`` in the commit order whose commit lsns are ``commit_lsns`` (null:
    not there).

    ``wanted`` holds xids' commit lsns, looked up in the cycle's map
    (:func:`commit_lsns_of`; :attr:`CycleInput.counts_commit_lsns`): a commit
    is found by its lsn, which is unique (the stream refuses an event whose
    lsn is not above the one before), and no second map from every xid is made.
    """
    at, hit = _found_at(commit_lsns, wanted)
    return pa.array(at, pa.int64(), mask=~hit)


def _found_at(sorted_lsns: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``wanted`` (commit lsns, or :data:`_NOT_COMMITTED`) sits in ``sorted_lsns``, and if it is there."""
    at = np.searchsorted(sorted_lsns, wanted)
    hit = (wanted != _NOT_COMMITTED) & (at < len(sorted_lsns))
    hit[hit] = sorted_lsns[at[hit]] == wanted[hit]
    return at, hit


def group_numbers(
    commits: Mapping[str, int], groups: Sequence[Collection[str]]
) -> Callable[[pa.Array, np.ndarray], pa.Array]:
    """A lookup of xids in ``groups`` (disjoint): the number of each one's group, null for none.

    The groups' committed xids are held as their commit lsns, sorted, beside
    their group numbers (12 bytes a transaction, not a map from every xid);
    an xid is found by its commit lsn in ``commits``, which the lookup is
    given (:func:`commit_lsns_of`) with the xids. The few members not
    committed there (a buffered transaction, say) are kept in a map.
    """
    lsns: list[np.ndarray] = []
    numbers: list[np.ndarray] = []
    others: dict[str, int] = {}
    for number, group in enumerate(groups):
        members = list(group)
        got = _commit_lsns(commits, members)
        lsns.append(got)
        numbers.append(np.full(len(got), number, np.int32))
        missing = got == _NOT_COMMITTED
        if missing.any():
            others.update((xid, number) for xid in compress(members, missing))
    member_lsns, member_groups = np.concatenate(lsns), np.concatenate(numbers)
    del lsns, numbers
    if len(member_lsns) > 1 and not bool((member_lsns[1:] > member_lsns[:-1]).all()):  # not runs of commit order
        by_lsn = np.argsort(member_lsns, kind="stable")
        member_lsns, member_groups = member_lsns[by_lsn], member_groups[by_lsn]
    member_groups = np.append(member_groups, -1)  # where an xid not found looks

    def look_up(xids: pa.Array, wanted: np.ndarray) -> pa.Array:
        at, hit = _found_at(member_lsns, wanted)
        found = member_groups[np.where(hit, at, -1)]
        if others:
            found[~hit] = [others.get(xid, -1) for xid in compress(xids.to_pylist(), ~hit)]
        return pa.array(found, pa.int64(), mask=found < 0)

    return look_up


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

    One lookup for all the pairs: Arrow hashes ``keys`` once a call. For a
    few keys (the transactions still open, say): every commit of a cycle is
    looked up in :attr:`CycleInput.commits` instead (:func:`commit_lsns_in`).
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
