"""Naming and listing of intermediate-file pairs (spec section 1).

A pair is ``NNNNNNNNNNNN.dat`` plus ``NNNNNNNNNNNN.trn``; it is complete once
its ``.trn`` exists. Listing returns the complete pairs from a starting
sequence number, contiguous, and stops before the first gap.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from applier.errors import GapError

FORMAT_NAME = "cdc-intermediate"
FORMAT_VERSION = 1
SEQ_DIGITS = 12
MAX_SEQ = 10**SEQ_DIGITS - 1
DAT_COLUMNS = ("lsn", "xid", "table", "op", "before", "after")
OPS = frozenset({"I", "U", "D", "T"})
TABLES_METADATA_KEY = b"cdc.tables"
AUTOCORRECT_METADATA_KEY = b"cdc.autocorrect"  # an extension: docs/materialization.md
EXTRACT_METADATA_KEY = b"cdc.extract"  # the extractor's source position of a pair's last item (applier.extract.decode)
MIB = 1024 * 1024

_PAIR_FILE = re.compile(r"(\d{12})\.(dat|trn)")


def pair_name(seq: int) -> str:
    """The 12-digit, zero-padded name of pair ``seq`` (without extension)."""
    if not 1 <= seq <= MAX_SEQ:
        raise ValueError(f"sequence number {seq} is outside 1..{MAX_SEQ}")
    return f"{seq:0{SEQ_DIGITS}d}"


@dataclass(frozen=True)
class PairRef:
    """A complete pair on disk: its sequence number, files and size in bytes."""

    seq: int
    dat_path: Path
    trn_path: Path
    size: int

    @property
    def name(self) -> str:
        return pair_name(self.seq)


@dataclass(frozen=True)
class PairListing:
    """Complete pairs from a start, contiguous, and the gap that stopped the listing.

    Attributes:
        pairs: complete pairs ``start, start+1, ...`` with no number missing.
        gap_seq: the first missing sequence number when a complete pair exists
            beyond it (a gap), else None.
        next_complete_seq: the first complete pair past the gap, else None.
    """

    directory: Path
    pairs: tuple[PairRef, ...]
    gap_seq: int | None = None
    next_complete_seq: int | None = None

    def gap_error(self) -> GapError | None:
        """The error to report once every pair before the gap is applied; None without a gap."""
        if self.gap_seq is None or self.next_complete_seq is None:
            return None
        missing = pair_name(self.gap_seq)
        return GapError(
            self.directory / missing,
            self.gap_seq,
            "gap",
            f"pair {missing} is missing while {pair_name(self.next_complete_seq)} is complete; "
            "nothing past the gap is applied",
        )


def _scan(directory: Path) -> tuple[dict[int, int], set[int]]:
    """Map seq -> .dat size for every ``.dat``, and the set of seqs with a ``.trn``.

    Temporary names (leading ``.`` or ``.tmp`` suffix) never match the pattern.
    """
    dats: dict[int, int] = {}
    trns: set[int] = set()
    with os.scandir(directory) as entries:
        for entry in entries:
            m = _PAIR_FILE.fullmatch(entry.name)
            if not m or not entry.is_file():
                continue
            seq = int(m.group(1))
            if m.group(2) == "dat":
                dats[seq] = entry.stat().st_size
            else:
                trns.add(seq)
    return dats, trns


def list_pairs(directory: Path | str, start_seq: int = 1) -> PairListing:
    """List the complete pairs from ``start_seq`` on, in sequence order, up to a gap.

    A ``.dat`` without its ``.trn`` is not yet complete and ends the listing
    without being a gap. A ``.trn`` whose ``.dat`` is missing is listed (it is
    complete by the spec's rule); reading it reports the missing ``.dat``.

    Args:
        directory: the intermediate directory.
        start_seq: the first sequence number wanted.

    Returns:
        The contiguous complete pairs and, if a later complete pair exists after
        a missing number, where the gap is.
    """
    directory = Path(directory)
    dats, trns = _scan(directory)
    pairs: list[PairRef] = []
    seq = start_seq
    while seq in trns:
        name = pair_name(seq)
        trn_path = directory / f"{name}.trn"
        try:
            trn_size = trn_path.stat().st_size
        except FileNotFoundError:  # removed by retention between scan and stat
            break
        pairs.append(PairRef(seq, directory / f"{name}.dat", trn_path, dats.get(seq, 0) + trn_size))
        seq += 1
    later = sorted(s for s in trns if s > seq)
    if later:
        return PairListing(directory, tuple(pairs), gap_seq=seq, next_complete_seq=later[0])
    return PairListing(directory, tuple(pairs))
