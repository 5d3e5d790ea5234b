"""The Delta target's exceptions store: one Delta table, ``<root>/_applier/<configuration>_exceptions``.

One row per transaction an error action set aside (``log``, ``retry_log``),
with the same fields as PostgreSQL's ``applier_exceptions`` and its changes
in a list column (each image as the pair held it). The engine moves past the
transaction in its intent file; the store's commit carries the part's tags
(``applier.cycle``, ``applier.through``), so a re-run that finds them writes
nothing again. No credential is ever written here.

A resubmission sets the record's ``resubmitted_at`` (:func:`mark`) only after
every table it changes committed (:mod:`applier.targets.delta_resubmit`): the
mark is what makes a later resubmission of the record refuse.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from applier.targets import PassedTransaction
from applier.targets.delta_schema import NEW_TABLE_PROPERTIES

CHANGE = pa.struct(
    [
        ("lsn", pa.int64()),
        ("table_name", pa.string()),
        ("op", pa.string()),
        ("before", pa.string()),
        ("after", pa.string()),
    ]
)
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("configuration_name", pa.string()),
        ("cycle_id", pa.int64()),
        ("xid", pa.string()),
        ("commit_lsn", pa.int64()),
        ("pair_seq", pa.int64()),
        ("table_name", pa.string()),
        ("error_class", pa.string()),
        ("sqlstate", pa.string()),
        ("message", pa.string()),
        ("action", pa.string()),
        ("logged_at", pa.timestamp("us", tz="UTC")),
        ("resubmitted_at", pa.timestamp("us", tz="UTC")),
        ("changes", pa.list_(CHANGE)),
    ]
)


def store_path(root: Path, configuration: str) -> Path:
    return root / "_applier" / f"{configuration}_exceptions"


def append(path: Path, configuration: str, passed: PassedTransaction, props: CommitProperties) -> None:
    """Add ``passed`` with its changes, numbered after the last record, in one tagged commit."""
    current = DeltaTable(str(path)) if (path / "_delta_log").is_dir() else None
    last = 0
    if current is not None:
        ids = current.to_pyarrow_table(columns=["id"])["id"].to_pylist()
        last = max(ids, default=0)
    changes = [] if passed.changes is None else passed.changes.select(["lsn", "table", "op", "before", "after"])
    listed = [
        {"lsn": c["lsn"], "table_name": c["table"], "op": c["op"], "before": c["before"], "after": c["after"]}
        for c in (changes.to_pylist() if isinstance(changes, pa.Table) else [])
    ]
    record = {
        "id": last + 1,
        "configuration_name": configuration,
        "cycle_id": passed.cycle_id,
        "xid": passed.xid,
        "commit_lsn": passed.commit_lsn,
        "pair_seq": passed.pair_seq,
        "table_name": passed.table,
        "error_class": passed.error_class,
        "sqlstate": passed.code,
        "message": passed.message,
        "action": passed.action,
        "logged_at": dt.datetime.now(dt.UTC),
        "resubmitted_at": None,
        "changes": listed,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = pa.Table.from_pylist([record], SCHEMA)
    write_deltalake(str(path), rows, mode="append", configuration=NEW_TABLE_PROPERTIES, commit_properties=props)


def records(path: Path, ident: int | None = None) -> list[dict[str, Any]]:
    """The records, oldest first (one, by id, with ``changes_list``), shaped like PostgreSQL's."""
    if not (path / "_delta_log").is_dir():
        return []
    found = sorted(DeltaTable(str(path)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    out = []
    for r in found:
        if ident is not None and r["id"] != ident:
            continue
        listed = r.pop("changes") or []
        r["changes"] = len(listed)
        if ident is not None:
            r["changes_list"] = sorted(listed, key=lambda c: c["lsn"])
        out.append(r)
    return out


def delete(path: Path, ident: int | None, before: str | None) -> int:
    """Delete record ``ident``, or those logged before the ISO moment ``before``; how many."""
    if not (path / "_delta_log").is_dir():
        return 0
    if ident is not None:
        predicate = f"id = {int(ident)}"
    else:
        assert before is not None
        moment = dt.datetime.fromisoformat(before)
        moment = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
        predicate = f"logged_at < '{moment.astimezone(dt.UTC).isoformat()}'"
    metrics = DeltaTable(str(path)).delete(predicate)
    return int(metrics.get("num_deleted_rows", 0))


def mark(path: Path, ident: int, props: CommitProperties) -> bool:
    """Set record ``ident``'s ``resubmitted_at`` to now, in one tagged commit; False when it was set already."""
    now = dt.datetime.now(dt.UTC).isoformat()
    metrics = DeltaTable(str(path)).update(
        updates={"resubmitted_at": f"'{now}'"},
        predicate=f"id = {int(ident)} AND resubmitted_at IS NULL",
        commit_properties=props,
    )
    return int(metrics.get("num_updated_rows", 0)) == 1
