"""What the PostgreSQL baselines apply: a prefix of the committed transactions, and one transaction's net changes.

The prefix is read as the Delta baseline reads it (``bench.per_transaction``:
the first committed transactions in commit order, each one's rows in lsn
order, images as parsed JSON). :func:`transaction_net` compiles one source
transaction into the same :class:`~applier.engine.changes.TableChanges` the
engine hands a target for a whole cycle, so the per-transaction baseline runs
exactly the target's staging and set-wise statements, only once per source
transaction. Pure apart from reading the pairs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from applier.engine.changes import COUNT_COLUMN, TableChanges
from bench.per_transaction import Change, Segment, _changes_by_xid, _commit_order, _net_keyed, _same_key, _Typed
from bench.workload import latest_table_defs

Typed = _Typed  # turns JSON images of one table into typed rows and Arrow tables


@dataclass
class Prefix:
    """The first committed transactions of a workload, in commit order, with their changes.

    Attributes:
        defs: every table's latest definition.
        xids: the transactions, in commit order.
        changes: per transaction, its changes in lsn order (``(table, op, before, after)``).
        rows: the changes in all.
        load_s: seconds spent reading them (not part of any measurement).
    """

    defs: dict[str, Any]
    xids: list[str]
    changes: dict[str, list[Change]]
    rows: int
    load_s: float


def load_prefix(intermediate: Path, transactions: int) -> Prefix:
    """The first ``transactions`` committed transactions of the pairs in ``intermediate`` (fewer if there are)."""
    started = time.perf_counter()
    defs = latest_table_defs(intermediate)
    xids, needed = _commit_order(intermediate, transactions)
    by_xid, rows = _changes_by_xid(needed, xids)
    return Prefix(defs, xids, dict(by_xid), rows, time.perf_counter() - started)


def run_prefix(prefix: Prefix, apply_transaction: Callable[[list[Change]], None]) -> dict[str, Any]:
    """Apply every transaction of ``prefix`` in commit order with ``apply_transaction``, timed.

    Returns:
        ``transactions``, ``rows`` (changes), ``seconds`` in all, and ``half_s`` and ``half_rows``: the
        seconds and changes of the first half of the transactions (which holds the initial loads), so the
        report can extrapolate the second half's rate as well as the whole prefix's.
    """
    half = len(prefix.xids) // 2
    rows, half_s, half_rows = 0, 0.0, 0
    started = time.perf_counter()
    for n, xid in enumerate(prefix.xids, start=1):
        changes = prefix.changes.get(xid, [])
        rows += len(changes)
        apply_transaction(changes)
        if n == half:
            half_s, half_rows = time.perf_counter() - started, rows
        if n % 1000 == 0:
            print(f"{n}/{len(prefix.xids)} transactions in {time.perf_counter() - started:.1f} s", flush=True)
    seconds = time.perf_counter() - started
    return {
        "transactions": len(prefix.xids),
        "rows": rows,
        "seconds": seconds,
        "half_transactions": half,
        "half_s": half_s,
        "half_rows": half_rows,
        "load_s": prefix.load_s,
    }


def per_table(changes: list[Change]) -> tuple[dict[str, list[Segment]], set[str]]:
    """A transaction's changes per table, in order, each cut after its table's last truncate; the truncated tables.

    What a table held before a truncate of the same transaction does not
    matter: the truncate empties it and only what follows is applied.
    """
    tables: dict[str, list[Segment]] = {}
    truncated: set[str] = set()
    for table, op, before, after in changes:
        if op == "T":
            tables[table] = []
            truncated.add(table)
        else:
            tables.setdefault(table, []).append((op, before, after))
    return tables, truncated


def _net_counted(typed: Typed, segment: list[Segment]) -> tuple[list[dict[str, Any]], list[int]]:
    """A keyless table's net change: each row value with its signed count (zero counts dropped)."""
    net: dict[tuple[Any, ...], list[Any]] = {}
    names = typed.loose.names

    def add(image: dict[str, Any], n: int) -> None:
        row = typed.rows([image])[0]
        entry = net.setdefault(tuple(_same_key(row[c]) for c in names), [row, 0])
        entry[1] += n

    for op, before, after in segment:
        if op in ("U", "D"):
            add(before, -1)
        if op in ("I", "U"):
            add(after, 1)
    kept = [(row, n) for row, n in net.values() if n != 0]
    return [row for row, _ in kept], [n for _, n in kept]


def table_net(typed: Typed, segment: list[Segment], truncate: bool) -> TableChanges:
    """One table's net change in one transaction, as the engine's compiler would give it for a cycle."""
    table = typed.table
    key = list(table.primary_key)
    stats = {"I": 0, "U": 0, "D": 0, "T": int(truncate)}
    if not key:
        rows, counts = _net_counted(typed, segment)
        counted = typed.arrow(rows).append_column(COUNT_COLUMN, pa.array(counts, pa.int64()))
        stats["I"] = sum(n for n in counts if n > 0)
        stats["D"] = -sum(n for n in counts if n < 0)
        empty = typed.arrow([])
        return TableChanges(table, truncate, empty, empty.select(key), counted, stats)
    final = _net_keyed(key, segment)
    ups = [image for image in final.values() if image is not None]
    gone = [dict(zip(key, k, strict=True)) for k, image in final.items() if image is None]
    stats["U"], stats["D"] = len(ups), len(gone)
    upserts = typed.arrow(typed.rows(ups))
    deletes = typed.arrow(typed.rows(gone)).select(key)
    return TableChanges(table, truncate, upserts, deletes, None, stats)


def transaction_net(changes: list[Change], typed: dict[str, Typed]) -> dict[str, TableChanges]:
    """Every table's net change in one source transaction (tables it touches only)."""
    tables, truncated = per_table(changes)
    return {name: table_net(typed[name], segment, name in truncated) for name, segment in tables.items()}


def copy_data(rows: pa.Table) -> bytes:
    """Staging rows as the target sends them to COPY: CSV, written batch by batch.

    Batch by batch as the target does (``pg_load.read_batches``), and not as
    one table: pyarrow's CSV writer emits junk for a table whose first chunk is
    empty (apache/arrow#36889), which a concatenation of no upserts and some
    deletes is.
    """
    from applier.targets.pg_load import csv_bytes, read_batches

    return b"".join(csv_bytes(batch) for batch in read_batches(rows))


def create_tables(conn: Any, defs: dict[str, Any]) -> None:
    """Create every table (and its schema) empty, as the target would on first sight, and commit."""
    from applier.targets import pg_sql as q

    with conn.transaction():
        for table in defs.values():
            conn.execute(q.create_schema(table.schema_name))
            conn.execute(q.create_table(q.target_table(table, {}), table))
