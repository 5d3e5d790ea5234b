"""Reading a whole intermediate directory pair by pair, checking everything.

Used by ``applier check`` and by anything that wants to know what a stream
holds without applying it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from applier.intermediate.pairs import list_pairs
from applier.intermediate.reader import read_pair
from applier.intermediate.stream import StreamValidator


@dataclass
class StreamSummary:
    """What the checked pairs hold."""

    pairs: int = 0
    bytes: int = 0
    rows: int = 0
    committed: int = 0
    rolled_back: int = 0
    rows_by_table: Counter[str] = field(default_factory=Counter)
    open_xids: list[str] = field(default_factory=list)
    last_seq: int = 0


def scan_directory(directory: Path | str, progress: Callable[[int, int], None] | None = None) -> StreamSummary:
    """Read and check every complete pair from 1 on.

    Args:
        directory: the intermediate directory.
        progress: called with ``(pairs done, pairs listed)`` after each pair.

    Returns:
        A summary of the accepted pairs.

    Raises:
        IntermediateFileError: the first refused pair, or the gap after the
            last good pair.
    """
    listing = list_pairs(directory)
    validator = StreamValidator()
    summary = StreamSummary()
    for done, ref in enumerate(listing.pairs, start=1):
        pair = read_pair(ref)
        validator.check(pair)
        summary.pairs += 1
        summary.bytes += ref.size
        summary.rows += pair.facts.count
        summary.committed += sum(1 for e in pair.events if e.record == "commit")
        summary.rolled_back += sum(1 for e in pair.events if e.record == "rollback")
        summary.rows_by_table.update(pair.stream_rows()["table"].to_pylist())
        summary.last_seq = ref.seq
        if progress:
            progress(done, len(listing.pairs))
    summary.open_xids = sorted(validator.state.open_xids)
    gap = listing.gap_error()
    if gap is not None:
        raise gap
    return summary
