"""Reading one intermediate-file pair and checking it against the spec.

:func:`read_pair` checks everything that can be judged from the pair alone
(header, ``.dat`` identity, Parquet columns and metadata, lsn order, operations
and row images). What needs the pairs before it (lsn continuity, transaction
events, schema evolution) is :class:`applier.intermediate.stream.StreamValidator`'s.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from applier.errors import CorruptPairError, IntermediateFileError, InvalidChangeError
from applier.intermediate.events import Event, EventTally, decode_events, is_int, tally, unpacked
from applier.intermediate.images import ImageProblem, check_images
from applier.intermediate.pairs import (
    AUTOCORRECT_METADATA_KEY,
    DAT_COLUMNS,
    FORMAT_NAME,
    FORMAT_VERSION,
    OPS,
    TABLES_METADATA_KEY,
    PairRef,
)
from applier.intermediate.row_facts import STREAM_COLUMNS, DatFacts, RowFacts
from applier.intermediate.schema import SchemaError, TableDef, check_table_name, tables_metadata_of

_SHA256 = re.compile(r"[0-9a-f]{64}")
_ARROW_TYPES = {
    "lsn": (pa.int64(),),
    "xid": (pa.string(), pa.large_string()),
    "table": (pa.string(), pa.large_string()),
    "op": (pa.string(), pa.large_string()),
    "before": (pa.string(), pa.large_string()),
    "after": (pa.string(), pa.large_string()),
}


@dataclass(frozen=True)
class Header:
    """The first line of a ``.trn`` file."""

    seq: int
    dat_rows: int
    dat_bytes: int
    dat_sha256: str
    first_lsn: int | None
    last_lsn: int | None
    created_at: str


@dataclass(frozen=True)
class Pair:
    """A pair that passed every check :func:`read_pair` makes.

    Attributes:
        ref: where the pair is on disk.
        header: its header.
        events: its transaction events in lsn order.
        tables: the table definitions of its ``cdc.tables`` metadata.
        data: its rows (columns lsn, xid, table, op, and before and after when
            the images were checked); None when Spark's executors read them
            for it, and ``given`` holds what they found.
        autocorrect: tables a nonatomic materialization is copying, with the lsn
            range of this pair their collisions are intended in (the extension
            ``cdc.autocorrect``, docs/materialization.md).
        digest_checked: whether its ``.dat``'s sha256 was checked (False: left
            to the caller, ``read_pair(check_digest=False)`` on a pair with rows).
        given: what an executor found in its ``.dat`` (:func:`read_pair`'s ``read_elsewhere``).
    """

    ref: PairRef
    header: Header
    events: tuple[Event, ...]
    tables: dict[str, TableDef]
    data: pa.Table | None
    autocorrect: dict[str, tuple[int, int]] = field(default_factory=dict)
    digest_checked: bool = True
    given: DatFacts | None = None

    @property
    def seq(self) -> int:
        return self.ref.seq

    @cached_property
    def tally(self) -> EventTally:
        """What its events say per transaction (computed once, for the stream checks and the cycle's notes)."""
        return tally(self.events)

    @cached_property
    def facts(self) -> RowFacts:
        """What the stream checks and the cycle's notes need of its rows: found here, or by an executor."""
        if self.given is not None:
            return self.given.rows
        assert self.data is not None  # a pair is read here, or has what an executor found
        return RowFacts.of(self.data)

    @property
    def touches(self) -> pa.Table:
        """:func:`transaction_tables` of its rows, shared by the stream checks and the cycle's notes."""
        return self.facts.touches

    def stream_rows(self) -> pa.Table:
        """Its rows' columns lsn, xid, table and op: as read, or read now when an executor read them for it.

        Only a pair with a defect in its transactions, which the stream checks
        then walk row by row to name, needs them after it was read.
        """
        if self.data is not None:
            return self.data
        return pq.read_table(self.ref.dat_path, columns=list(STREAM_COLUMNS))

    def lsn_range(self) -> tuple[int, int] | None:
        """Smallest and largest lsn of any row or event, None for an empty pair.

        Events and rows are each in lsn order (:func:`read_pair` checks both),
        so only the first and last of each are looked at.
        """
        lsns = [self.events[0].lsn, self.events[-1].lsn] if self.events else []
        if self.facts.bounds is not None:
            lsns += list(self.facts.bounds)
        return (min(lsns), max(lsns)) if lsns else None


def _corrupt(ref: PairRef, path: Path, code: str, detail: str) -> CorruptPairError:
    return CorruptPairError(path, ref.seq, code, detail)


def _parse_header(ref: PairRef, line: str | None) -> Header:
    try:
        raw = json.loads(line) if line is not None else None
    except ValueError:
        raw = None
    if not isinstance(raw, dict) or raw.get("record") != "header":
        raise _corrupt(ref, ref.trn_path, "header-missing", "first line is not a header record")
    if raw.get("format") != FORMAT_NAME:
        raise _corrupt(ref, ref.trn_path, "header-format", f"format {raw.get('format')!r} is not {FORMAT_NAME!r}")
    if raw.get("version") != FORMAT_VERSION:
        raise _corrupt(
            ref, ref.trn_path, "header-version", f"version {raw.get('version')!r} is unknown (this reader knows 1)"
        )
    if raw.get("seq") != ref.seq:
        raise _corrupt(ref, ref.trn_path, "header-invalid", f"header seq {raw.get('seq')!r} is not {ref.seq}")
    for key in ("dat_rows", "dat_bytes"):
        if not is_int(raw.get(key)) or raw[key] < 0:
            raise _corrupt(ref, ref.trn_path, "header-invalid", f"header {key} {raw.get(key)!r} is not a count")
    if not isinstance(raw.get("dat_sha256"), str) or not _SHA256.fullmatch(raw["dat_sha256"]):
        raise _corrupt(ref, ref.trn_path, "header-invalid", "header dat_sha256 is not 64 lowercase hex digits")
    for key in ("first_lsn", "last_lsn"):
        if raw.get(key) is not None and not is_int(raw.get(key)):
            raise _corrupt(ref, ref.trn_path, "header-invalid", f"header {key} {raw.get(key)!r} is not an lsn")
    return Header(
        raw["seq"],
        raw["dat_rows"],
        raw["dat_bytes"],
        raw["dat_sha256"],
        raw.get("first_lsn"),
        raw.get("last_lsn"),
        str(raw.get("created_at")),
    )


def read_trn(ref: PairRef) -> tuple[Header, tuple[Event, ...]]:
    """Read and check a ``.trn`` file: header first, then events in ascending lsn order."""
    try:
        text = ref.trn_path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise _corrupt(ref, ref.trn_path, "header-missing", f"not UTF-8 text: {e}") from e
    if text and not text.endswith("\n"):
        raise _corrupt(ref, ref.trn_path, "event-invalid", "last line is not terminated by a newline")
    header_end = text.find("\n")
    header = _parse_header(ref, text[:header_end] if header_end >= 0 else None)
    return header, decode_events(ref.trn_path, ref.seq, text[header_end + 1 :])


def check_header_and_size(ref: PairRef) -> Header:
    """Check a pair cheaply: its ``.trn`` header alone, and that its ``.dat`` has the bytes the header says.

    Reads one line and one file size, not the rows or the checksum, so a whole
    backlog is checked in a moment (``applier plan``, ``applier status``, a
    run before Spark starts). :func:`read_pair` checks everything.

    Raises:
        CorruptPairError: the header is missing or invalid, the ``.dat`` is
            missing, or its size is not the header's ``dat_bytes``.
    """
    try:
        with open(ref.trn_path, "rb") as fh:
            first = fh.readline()
    except FileNotFoundError as e:
        raise _corrupt(ref, ref.trn_path, "trn-missing", "the .trn is gone") from e
    try:
        line = first.decode("utf-8").rstrip("\n") if first else None
    except UnicodeDecodeError as e:
        raise _corrupt(ref, ref.trn_path, "header-missing", f"not UTF-8 text: {e}") from e
    header = _parse_header(ref, line)
    _check_dat_size(ref, header)
    return header


def _check_dat_size(ref: PairRef, header: Header) -> None:
    try:
        size = ref.dat_path.stat().st_size
    except FileNotFoundError as e:
        raise _corrupt(ref, ref.dat_path, "dat-missing", "the .trn exists but the .dat does not") from e
    if size != header.dat_bytes:
        raise _corrupt(ref, ref.dat_path, "bytes-mismatch", f"file has {size} bytes, header says {header.dat_bytes}")


def check_dat_identity(ref: PairRef, header: Header) -> None:
    """Refuse the pair unless its ``.dat`` has the bytes and the sha256 its header says."""
    _check_dat_size(ref, header)
    mismatch = digest_mismatch(ref.dat_path, header.dat_sha256)
    if mismatch is not None:
        raise _corrupt(ref, ref.dat_path, DIGEST_MISMATCH, mismatch)


DIGEST_MISMATCH = "sha-mismatch"
"""The code of a ``.dat`` whose sha256 is not its header's ``dat_sha256``."""


def digest_mismatch(path: Path | str, expected: str) -> str | None:
    """The reader's words for a file whose sha256 is not ``expected`` (None: it is)."""
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    return None if digest == expected else f"sha256 is {digest}, header says {expected}"


@contextmanager
def digest_first(ref: PairRef, header: Header, unchecked: bool) -> Iterator[None]:
    """Around later checks of a pair whose sha256 is ``unchecked``: a refusal has the digest checked first.

    A pair with a wrong digest is then refused for it, whatever else is wrong
    with it, in the words it gets when the digest is checked before anything else.
    """
    try:
        yield
    except IntermediateFileError:
        if unchecked:
            check_dat_identity(ref, header)
        raise


def _autocorrect(ref: PairRef, metadata: dict[bytes, bytes]) -> dict[str, tuple[int, int]]:
    raw = metadata.get(AUTOCORRECT_METADATA_KEY)
    if raw is None:
        return {}
    try:
        ranges = json.loads(raw)
        return {
            str(name): (int(low), int(high))
            for name, (low, high) in ranges.items()
            if is_int(low) and is_int(high) and low <= high
        }
    except (ValueError, TypeError, AttributeError) as e:
        raise _corrupt(ref, ref.dat_path, "dat-autocorrect-invalid", f"cdc.autocorrect: {e}") from e


def _read_dat(
    ref: PairRef, header: Header, *, images: bool
) -> tuple[pa.Table, dict[str, TableDef], dict[str, tuple[int, int]]]:
    try:
        schema = pq.read_schema(ref.dat_path)
        wanted = None if images else [n for n in STREAM_COLUMNS if n in schema.names]
        table = pq.read_table(ref.dat_path, columns=wanted)
    except (pa.ArrowException, OSError) as e:
        raise _corrupt(ref, ref.dat_path, "dat-not-parquet", f"not a readable Parquet file: {e}") from e
    for name in DAT_COLUMNS:
        if name not in schema.names:
            raise _corrupt(ref, ref.dat_path, "dat-missing-column", f"column {name!r} is missing")
        if schema.field(name).type not in _ARROW_TYPES[name]:
            raise _corrupt(ref, ref.dat_path, "dat-column-type", f"column {name!r} has type {schema.field(name).type}")
    extra = [n for n in schema.names if n not in DAT_COLUMNS]
    if extra:
        raise _corrupt(ref, ref.dat_path, "dat-extra-column", f"columns {extra} are not in the spec")
    metadata = schema.metadata or {}
    if TABLES_METADATA_KEY not in metadata:
        raise _corrupt(ref, ref.dat_path, "dat-no-table-metadata", "Parquet metadata has no 'cdc.tables' key")
    try:
        defs = dict(tables_metadata_of(metadata[TABLES_METADATA_KEY]))
    except SchemaError as e:
        raise InvalidChangeError(ref.dat_path, ref.seq, "table-name-unsafe", str(e)) from e
    except ValueError as e:
        raise _corrupt(ref, ref.dat_path, "dat-table-metadata-invalid", f"cdc.tables: {e}") from e
    if table.num_rows != header.dat_rows:
        raise _corrupt(
            ref, ref.dat_path, "rows-mismatch", f"file has {table.num_rows} rows, header says {header.dat_rows}"
        )
    return table.select([n for n in DAT_COLUMNS if n in table.column_names]), defs, _autocorrect(ref, metadata)


def _check_row_columns(ref: PairRef, table: pa.Table, defs: dict[str, TableDef]) -> None:
    for name in ("lsn", "xid", "table", "op"):
        if table[name].null_count:
            raise InvalidChangeError(ref.dat_path, ref.seq, "dat-null", f"column {name!r} holds a null")
    lsn = table["lsn"]
    if table.num_rows > 1:
        ascending = pc.all(pc.greater(lsn.slice(1), lsn.slice(0, table.num_rows - 1))).as_py()
        if not ascending:
            lsns = lsn.to_pylist()
            i = next(i for i in range(1, len(lsns)) if lsns[i] <= lsns[i - 1])
            raise InvalidChangeError(
                ref.dat_path, ref.seq, "lsn-out-of-order", f"row {i}: lsn {lsns[i]} follows lsn {lsns[i - 1]}"
            )
    bad_ops = set(pc.unique(table["op"]).to_pylist()) - OPS
    if bad_ops:
        raise InvalidChangeError(ref.dat_path, ref.seq, "op-invalid", f"op {sorted(bad_ops)} is not one of I U D T")
    names = set(pc.unique(table["table"]).to_pylist())
    for name in sorted(names - defs.keys()):
        try:
            check_table_name(name)
        except SchemaError as e:
            raise InvalidChangeError(ref.dat_path, ref.seq, "table-name-unsafe", str(e)) from e
    undescribed = names - defs.keys()
    if undescribed:
        raise InvalidChangeError(
            ref.dat_path, ref.seq, "table-undescribed", f"rows of {sorted(undescribed)} but no definition in cdc.tables"
        )


def _check_lsn_range(ref: PairRef, header: Header, pair: Pair) -> None:
    actual = pair.lsn_range()
    declared = None if header.first_lsn is None and header.last_lsn is None else (header.first_lsn, header.last_lsn)
    if actual != declared:
        raise _corrupt(ref, ref.trn_path, "header-lsn-mismatch", f"header lsn range {declared} but pair holds {actual}")


def read_pair(
    ref: PairRef, *, check_rows: bool = True, check_digest: bool = True, read_elsewhere: DatFacts | None = None
) -> Pair:
    """Read one complete pair and refuse it if anything in it breaks the spec.

    Args:
        ref: the pair, as listed by :func:`applier.intermediate.pairs.list_pairs`.
        check_rows: check every row image against its table definition (the
            costly part; callers that re-read a pair already checked may skip
            it, and the engine has Spark's executors check them).
        check_digest: check the ``.dat``'s sha256 here. Without it, a pair
            with rows has only its size checked, and its digest is the
            caller's to check (the engine's executors check it as they read
            the file); a pair refused for anything else has its digest
            checked first all the same, so it is refused in the words it
            would have been with the digest checked first.
        read_elsewhere: what a Spark executor found reading the pair as
            this function does, images and digest aside
            (:func:`applier.engine.dat_facts.read_dat_facts`, which gives the
            refusal instead, when there is one): the pair has no ``data``,
            and only the ``.trn`` is read here, unless the executor sent its
            header and events.

    Returns:
        The pair's header, events, table definitions and rows; without
        ``check_rows``, the rows lack the ``before`` and ``after`` images
        (their column types are still checked).

    Raises:
        IntermediateFileError: a subclass naming the file and the defect.
    """
    if read_elsewhere is not None and read_elsewhere.header is not None and read_elsewhere.events is not None:
        header, events = read_elsewhere.header, unpacked(read_elsewhere.events)  # the .trn read there too
    else:
        header, events = read_trn(ref)
    if read_elsewhere is not None:  # read and checked by an executor (read_dat_facts), the digest of rows left
        return Pair(ref, header, events, read_elsewhere.tables, None, read_elsewhere.autocorrect,
                    digest_checked=header.dat_rows == 0, given=read_elsewhere)  # fmt: skip
    deferred = not check_digest and header.dat_rows > 0
    if deferred:
        _check_dat_size(ref, header)
    else:
        check_dat_identity(ref, header)
    with digest_first(ref, header, deferred):
        data, defs, autocorrect = _read_dat(ref, header, images=check_rows)
        _check_row_columns(ref, data, defs)
        pair = Pair(ref, header, events, defs, data, autocorrect, digest_checked=not deferred)
        _check_lsn_range(ref, header, pair)
        if check_rows:
            try:
                check_images(data, defs)
            except ImageProblem as e:
                raise InvalidChangeError(ref.dat_path, ref.seq, e.code, e.detail) from e
    return pair
