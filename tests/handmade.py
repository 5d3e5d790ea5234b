"""Pairs written by hand with pyarrow and json, never through the project's writer.

Reader tests use these so that the writer and the reader cannot share a
misreading of the spec.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ACCOUNTS = {
    "columns": [
        {"name": "id", "type": "bigint", "nullable": False},
        {"name": "owner", "type": "string", "nullable": True},
        {"name": "balance", "type": "decimal(10,2)", "nullable": True},
    ],
    "primary_key": ["id"],
}


def row(lsn: int, xid: str, op: str, before: Any = None, after: Any = None, table: str = "bank.accounts") -> dict:
    """One .dat row; dict images are JSON-encoded, strings are kept as given."""
    enc = lambda v: json.dumps(v) if isinstance(v, (dict, list)) else v  # noqa: E731
    return {"lsn": lsn, "xid": xid, "table": table, "op": op, "before": enc(before), "after": enc(after)}


def event(record: str, xid: str, lsn: int) -> dict:
    return {"record": record, "xid": xid, "lsn": lsn, "ts": "2026-11-21T10:00:00.000000Z"}


def write_pair(
    directory: Path,
    seq: int,
    rows: list[dict],
    events: list[dict],
    tables: dict | None = None,
    header_changes: dict | None = None,
    dat_bytes: bytes | None = None,
) -> Path:
    """Write pair ``seq`` into ``directory``; ``header_changes`` overrides header fields after computing them."""
    directory.mkdir(parents=True, exist_ok=True)
    if dat_bytes is None:
        schema = pa.schema(
            [
                ("lsn", pa.int64()),
                ("xid", pa.string()),
                ("table", pa.string()),
                ("op", pa.string()),
                ("before", pa.string()),
                ("after", pa.string()),
            ],
            metadata={"cdc.tables": json.dumps(tables if tables is not None else {"bank.accounts": ACCOUNTS})},
        )
        cols = {name: [r[name] for r in rows] for name in schema.names}
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pydict(cols, schema=schema), sink)
        dat_bytes = sink.getvalue().to_pybytes()
    lsns = [r["lsn"] for r in rows] + [e["lsn"] for e in events]
    header = {
        "record": "header",
        "format": "cdc-intermediate",
        "version": 1,
        "seq": seq,
        "dat_rows": len(rows),
        "dat_bytes": len(dat_bytes),
        "dat_sha256": hashlib.sha256(dat_bytes).hexdigest(),
        "first_lsn": min(lsns) if lsns else None,
        "last_lsn": max(lsns) if lsns else None,
        "created_at": "2026-11-21T10:00:00.000000Z",
    }
    header.update(header_changes or {})
    name = f"{seq:012d}"
    (directory / f"{name}.dat").write_bytes(dat_bytes)
    lines = [header, *events]
    (directory / f"{name}.trn").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return directory / f"{name}.dat"


def good_first_pair(directory: Path) -> None:
    """Pair 1: txn t1 inserts two accounts and commits; t2 begins, updates and stays open."""
    write_pair(
        directory,
        1,
        [
            row(11, "t1", "I", after={"id": 1, "owner": "ann", "balance": "1.50"}),
            row(12, "t1", "I", after={"id": 2, "owner": "bob", "balance": "2.00"}),
            row(15, "t2", "U", before={"id": 1}, after={"id": 1, "owner": "ann", "balance": "9.99"}),
        ],
        [event("begin", "t1", 10), event("commit", "t1", 13), event("begin", "t2", 14)],
    )
