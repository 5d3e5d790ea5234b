"""Reading a cycle's pairs in the driver: checking them and sorting out transactions.

The driver reads each pair once with pyarrow, checks it (reader and stream
validator), and learns which transactions commit, roll back or stay open.
Rows of transactions still open at the end of the cycle go to the buffers;
Spark reads the ``.dat`` files itself for the committed ones.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from applier.engine.buffers import TransactionBuffers
from applier.engine.checking import PairChecker
from applier.errors import IntermediateFileError
from applier.intermediate.pairs import PairRef
from applier.intermediate.reader import Pair, read_pair
from applier.intermediate.stream import StreamValidator

log = logging.getLogger("applier")


@dataclass
class CycleInput:
    """What the driver learnt from a cycle's pairs.

    Attributes:
        pairs: the accepted pairs (a refused pair and those after it are not here).
        commits: xid -> commit lsn of transactions committed in these pairs.
        rollbacks: xids rolled back in these pairs.
        rows_read: rows in the accepted pairs.
        refused: the error of the pair that cut the cycle short, if any.
        xids_by_seq: for each pair, the xids that have rows in it.
        begun_at: xid -> source time (``ts``) of the begins in these pairs.
        read_seconds: how long reading and checking the pairs took.
    """

    pairs: list[PairRef] = field(default_factory=list)
    commits: dict[str, int] = field(default_factory=dict)
    rollbacks: set[str] = field(default_factory=set)
    rows_read: int = 0
    refused: IntermediateFileError | None = None
    xids_by_seq: dict[int, set[str]] = field(default_factory=dict)
    begun_at: dict[str, str] = field(default_factory=dict)
    read_seconds: float = 0.0

    @property
    def bytes(self) -> int:
        return sum(p.size for p in self.pairs)


def _note_pair(into: CycleInput, pair: Pair) -> None:
    into.pairs.append(pair.ref)
    into.rows_read += pair.data.num_rows
    into.xids_by_seq[pair.seq] = set(pc.unique(pair.data["xid"]).to_pylist())
    for event in pair.events:
        if event.record == "commit":
            into.commits[event.xid] = event.lsn
        elif event.record == "rollback":
            into.rollbacks.add(event.xid)
        else:
            into.begun_at[event.xid] = event.ts


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
    refs: list[PairRef], validator: StreamValidator, *, check_rows: bool = True, checker: PairChecker | None = None
) -> CycleInput:
    """Read and check the planned pairs in order, stopping at the first refused one.

    Args:
        refs: the planned pairs.
        validator: the stream state, advanced past every accepted pair.
        check_rows: check row images (off when re-reading pairs checked before).
        checker: worker processes that check row images of large cycles.

    Returns:
        The accepted pairs and their transactions; ``refused`` holds the error
        that stopped the reading, to be raised once the accepted part is applied.
    """
    result = CycleInput()
    checks = checker.submit(refs) if checker is not None and check_rows else {}
    try:
        for ref in refs:
            try:
                checked = _checked_by_worker(checks.get(ref.seq))
                pair = read_pair(ref, check_rows=check_rows and not checked)
                validator.check(pair)
            except IntermediateFileError as e:
                result.refused = e
                break
            _note_pair(result, pair)
    finally:
        for pending in checks.values():
            pending.cancel()
    return result


def buffer_open_rows(cycle: CycleInput, still_open: set[str], buffers: TransactionBuffers) -> None:
    """Put the cycle's rows of transactions still open after it into the buffers.

    Each pair holding such rows is read again with a filter on the xid, one
    pair at a time, so memory stays bounded by a pair and the buffers.
    """
    for ref in cycle.pairs:
        wanted = cycle.xids_by_seq.get(ref.seq, set()) & still_open
        if not wanted:
            continue
        rows = pq.read_table(ref.dat_path, columns=["lsn", "xid", "table", "op", "before", "after"])
        rows = rows.filter(pc.is_in(rows["xid"], value_set=pa.array(sorted(wanted), pa.string())))
        buffers.add(rows, seq=ref.seq)
