"""Writing intermediate-file pairs atomically (spec sections 1-3).

The writer takes rows and transaction events in log order and cuts them into
pairs no larger than a configured size. Each pair is written under temporary
names, fsynced, and renamed into place ``.dat`` first, ``.trn`` last, so a
reader never sees a partial pair.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from applier.intermediate.pairs import FORMAT_NAME, FORMAT_VERSION, OPS, TABLES_METADATA_KEY, pair_name
from applier.intermediate.schema import TableDef, check_table_name, tables_metadata

DAT_SCHEMA = pa.schema(
    [
        pa.field("lsn", pa.int64(), nullable=False),
        pa.field("xid", pa.string(), nullable=False),
        pa.field("table", pa.string(), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("before", pa.string(), nullable=True),
        pa.field("after", pa.string(), nullable=True),
    ]
)
# Bytes a row or event costs beyond its images, for the size estimate that decides rotation.
_ROW_OVERHEAD = 40
_EVENT_BYTES = 90


def utc_text(moment: dt.datetime) -> str:
    """ISO 8601 UTC text with microseconds and ``Z``, as the spec writes times."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_IMAGE_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def encode_image(image: dict[str, Any] | None) -> str | None:
    """A row image as the spec's JSON object text (NaN and infinities already as strings)."""
    return None if image is None else _IMAGE_ENCODER.encode(image)


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


class IntermediateWriter:
    """Writes a change stream as consecutive intermediate-file pairs.

    Calls must come in ascending lsn order, as a log reader produces them. A
    pair is closed when its estimated written size (text size times the compression
    ratio of the pairs written so far) reaches ``max_file_size_bytes`` at a
    point where no transaction that began in it is still without rows (so each
    ``begin`` stays in the pair of its first row), or when a table's definition
    changes while the pair holds rows of that table, or on :meth:`close`.

    Args:
        directory: where pairs are written (created if missing).
        max_file_size_bytes: the size at which the writer moves to a new pair.
        start_seq: the sequence number of the first pair written.
        clock: returns the time written as the header's ``created_at``.
        on_pair: called with ``(seq, size_bytes)`` after each pair is in place.
        pair_metadata: called with a pair's ``(first_lsn, last_lsn)`` as it is written: more
            key-value metadata for its ``.dat`` (extensions a version-1 reader ignores).
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        max_file_size_bytes: int,
        start_seq: int = 1,
        clock: Callable[[], dt.datetime] | None = None,
        on_pair: Callable[[int, int], None] | None = None,
        pair_metadata: Callable[[int | None, int | None], dict[bytes, str]] | None = None,
    ) -> None:
        if max_file_size_bytes <= 0:
            raise ValueError("max_file_size_bytes must be positive")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_file_size_bytes = max_file_size_bytes
        self.next_seq = start_seq
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._on_pair = on_pair
        self._pair_metadata = pair_metadata
        self._defs: dict[str, TableDef] = {}
        self._last_lsn: int | None = None
        # Written bytes per estimated byte, learnt from each pair written (compression
        # makes a pair smaller than its text); starts at 1 so the first pair is never too big.
        self._size_ratio = 1.0
        self._reset_pair()

    def _reset_pair(self) -> None:
        self._rows: dict[str, list[Any]] = {c: [] for c in DAT_SCHEMA.names}
        self._events: list[dict[str, Any]] = []
        self._tables_in_pair: set[str] = set()
        self._begun_without_rows: set[str] = set()
        self._estimate = 0
        self._first_lsn: int | None = None

    def define_table(self, table: TableDef) -> None:
        """Set the definition written for ``table`` from now on (schema evolution)."""
        check_table_name(table.name)
        if table.name in self._tables_in_pair and self._defs.get(table.name) != table:
            self._flush()
        self._defs[table.name] = table

    def _advance(self, lsn: int) -> None:
        if self._last_lsn is not None and lsn <= self._last_lsn:
            raise ValueError(f"lsn {lsn} is not above the previous lsn {self._last_lsn}")
        if self._estimate * self._size_ratio >= self.max_file_size_bytes and not self._begun_without_rows:
            self._flush()
        self._last_lsn = lsn
        if self._first_lsn is None:
            self._first_lsn = lsn

    def row(
        self,
        lsn: int,
        xid: str,
        table: str,
        op: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
    ) -> None:
        """Add one row change; images are JSON-ready dicts in the spec's encoding."""
        if op not in OPS:
            raise ValueError(f"op {op!r} is not one of I U D T")
        if table not in self._defs:
            raise ValueError(f"table {table} has no definition; call define_table first")
        self._advance(lsn)
        before_text, after_text = encode_image(before), encode_image(after)
        for column, value in zip(DAT_SCHEMA.names, (lsn, xid, table, op, before_text, after_text), strict=True):
            self._rows[column].append(value)
        self._tables_in_pair.add(table)
        self._begun_without_rows.discard(xid)
        self._estimate += _ROW_OVERHEAD + len(xid) + len(table) + len(before_text or "") + len(after_text or "")

    def _event(self, record: str, xid: str, lsn: int, ts: dt.datetime) -> None:
        self._advance(lsn)
        self._events.append({"record": record, "xid": xid, "lsn": lsn, "ts": utc_text(ts)})
        self._estimate += _EVENT_BYTES

    def begin(self, xid: str, lsn: int, ts: dt.datetime) -> None:
        """A transaction begins; its rows follow."""
        self._event("begin", xid, lsn, ts)
        self._begun_without_rows.add(xid)

    def commit(self, xid: str, lsn: int, ts: dt.datetime) -> None:
        """A transaction commits."""
        self._event("commit", xid, lsn, ts)
        self._begun_without_rows.discard(xid)

    def rollback(self, xid: str, lsn: int, ts: dt.datetime) -> None:
        """A transaction rolls back."""
        self._event("rollback", xid, lsn, ts)
        self._begun_without_rows.discard(xid)

    def close(self) -> None:
        """Write the pair in progress, if it holds anything."""
        self._flush()

    def __enter__(self) -> IntermediateWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()

    def _flush(self) -> None:
        if not self._events and not self._rows["lsn"]:
            return
        seq, name = self.next_seq, pair_name(self.next_seq)
        metadata = {
            TABLES_METADATA_KEY: json.dumps(tables_metadata([self._defs[t] for t in sorted(self._tables_in_pair)]))
        }
        if self._pair_metadata:
            metadata.update(self._pair_metadata(self._first_lsn, self._last_lsn))
        table = pa.Table.from_pydict(self._rows, schema=DAT_SCHEMA.with_metadata(metadata))
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        dat_bytes = sink.getvalue().to_pybytes()
        header = {
            "record": "header",
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "seq": seq,
            "dat_rows": table.num_rows,
            "dat_bytes": len(dat_bytes),
            "dat_sha256": hashlib.sha256(dat_bytes).hexdigest(),
            "first_lsn": self._first_lsn,
            "last_lsn": self._last_lsn,
            "created_at": utc_text(self._clock()),
        }
        trn_text = "".join(json.dumps(line) + "\n" for line in [header, *self._events]).encode()
        dat_tmp, trn_tmp = self.directory / f".{name}.dat.tmp", self.directory / f".{name}.trn.tmp"
        _fsync_write(dat_tmp, dat_bytes)
        _fsync_write(trn_tmp, trn_text)
        os.replace(dat_tmp, self.directory / f"{name}.dat")
        os.replace(trn_tmp, self.directory / f"{name}.trn")
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        if self._estimate >= 64 * 1024:  # small pairs are dominated by fixed overhead
            self._size_ratio = (len(dat_bytes) + len(trn_text)) / self._estimate
        self.next_seq += 1
        self._reset_pair()
        if self._on_pair:
            self._on_pair(seq, len(dat_bytes) + len(trn_text))
