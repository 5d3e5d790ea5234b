"""What the baselines apply: a prefix of the committed transactions, typed images, and one transaction's net changes.

The prefix is the first committed transactions in commit order (from the
``.trn`` files), each one's rows in lsn order, images as parsed JSON.
:func:`transaction_net` compiles one source transaction into the same
:class:`~applier.engine.changes.TableChanges` the engine hands a target for a
whole cycle, so the PostgreSQL per-transaction baseline runs exactly the
target's staging and set-wise statements, only once per source transaction.
Pure apart from reading the pairs.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from applier.engine.changes import COUNT_COLUMN, TableChanges
from bench.workload import latest_table_defs

Segment = tuple[str, Any, Any]  # (op, before-image, after-image) of one change
Change = tuple[str, str, Any, Any]  # (table, op, before-image, after-image)
_SPECIALS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "bigint": int,
    "boolean": bool,
    "string": str,
    "double": lambda v: _SPECIALS[v] if isinstance(v, str) else float(v),
    "date": dt.date.fromisoformat,
    "timestamp": dt.datetime.fromisoformat,
    "binary": base64.b64decode,
}  # every other spec type is decimal(p,s), written as a string


class Typed:
    """Turns JSON images of one table into rows and Arrow tables of its (latest) definition."""

    def __init__(self, table: Any) -> None:
        from applier.engine.changes import arrow_schema

        self.table = table
        self.schema = arrow_schema(table)
        self.loose = pa.schema([f.with_nullable(True) for f in self.schema])
        self.convert = [(c.name, _CONVERT.get(c.type, Decimal)) for c in table.columns]

    def rows(self, images: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """JSON images as rows of Python values of the table's types."""
        return [{n: (None if (v := img.get(n)) is None else f(v)) for n, f in self.convert} for img in images]

    def arrow(self, rows: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> pa.Table:
        """Rows as an Arrow table of the table's columns (all nullable), plus ``extra`` string columns."""
        columns = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in self.loose}
        for name, values in (extra or {}).items():
            columns[name] = pa.array(values, pa.string())
        return pa.table(columns)


def same_key(v: Any) -> Any:
    """A value to compare rows by: NaN equal to NaN and -0.0 equal to 0.0, as in the table."""
    return "__nan__" if isinstance(v, float) and math.isnan(v) else (0.0 if v == 0.0 and isinstance(v, float) else v)


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
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from applier.intermediate.pairs import list_pairs

    started = time.perf_counter()
    xids: list[str] = []
    needed = []
    for ref in list_pairs(intermediate).pairs:
        needed.append(ref)
        with open(ref.trn_path, encoding="utf-8") as fh:
            next(fh)
            for line in fh:
                event = json.loads(line)
                if event["record"] == "commit" and len(xids) < transactions:
                    xids.append(event["xid"])
        if len(xids) >= transactions:
            break
    wanted = pa.array(xids, pa.string())
    parts = []
    for ref in needed:
        dat = pq.read_table(ref.dat_path, columns=["lsn", "xid", "table", "op", "before", "after"])
        parts.append(dat.filter(pc.is_in(dat["xid"], value_set=wanted)))
    data = pa.concat_tables(parts).sort_by("lsn")
    by_xid: dict[str, list[Change]] = defaultdict(list)
    for row in data.to_pylist():
        before = json.loads(row["before"]) if row["before"] is not None else None
        after = json.loads(row["after"]) if row["after"] is not None else None
        by_xid[row["xid"]].append((row["table"], row["op"], before, after))
    defs = latest_table_defs(intermediate)
    return Prefix(defs, xids, dict(by_xid), data.num_rows, time.perf_counter() - started)


def run_prefix(prefix: Prefix, apply_transaction: Callable[[list[Change]], None]) -> dict[str, Any]:
    """Apply every transaction of ``prefix`` in commit order with ``apply_transaction``, timed.

    Returns:
        ``transactions``, ``rows`` (changes), ``seconds`` in all, and ``half_s`` and ``half_rows``: the
        seconds and changes of the first half of the transactions (which holds the initial loads), so the
        report can extrapolate the second half's rate as well as the whole prefix's.
    """
    print(f"loaded {len(prefix.xids)} transactions, {prefix.rows} changes in {prefix.load_s:.1f} s", flush=True)
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
    return {
        "transactions": len(prefix.xids),
        "rows": rows,
        "seconds": time.perf_counter() - started,
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


def net_keyed(key_of: list[str], segment: list[Segment]) -> dict[tuple[Any, ...], dict[str, Any] | None]:
    """The net effect of a keyed segment: per key, the last after-image, or ``None`` when the row is gone."""
    final: dict[tuple[Any, ...], dict[str, Any] | None] = {}
    for op, before, after in segment:
        if op == "I":
            final[tuple(after[k] for k in key_of)] = after
        elif op == "U":
            old, new = tuple(before[k] for k in key_of), tuple(after[k] for k in key_of)
            if old != new:
                final[old] = None
            final[new] = after
        else:
            final[tuple(before[k] for k in key_of)] = None
    return final


def _net_counted(typed: Typed, segment: list[Segment]) -> tuple[list[dict[str, Any]], list[int]]:
    """A keyless table's net change: each row value with its signed count (zero counts dropped)."""
    net: dict[tuple[Any, ...], list[Any]] = {}
    names = typed.loose.names

    def add(image: dict[str, Any], n: int) -> None:
        row = typed.rows([image])[0]
        entry = net.setdefault(tuple(same_key(row[c]) for c in names), [row, 0])
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
    final = net_keyed(key, segment)
    ups = [image for image in final.values() if image is not None]
    gone = [dict(zip(key, k, strict=True)) for k, image in final.items() if image is None]
    stats["U"], stats["D"] = len(ups), len(gone)
    return TableChanges(
        table, truncate, typed.arrow(typed.rows(ups)), typed.arrow(typed.rows(gone)).select(key), None, stats
    )


def transaction_net(changes: list[Change], typed: dict[str, Typed]) -> dict[str, TableChanges]:
    """Every table's net change in one source transaction (tables it touches only)."""
    tables, truncated = per_table(changes)
    return {name: table_net(typed[name], segment, name in truncated) for name, segment in tables.items()}


def copy_data(rows: pa.Table) -> bytes:
    """Staging rows as the target sends them to COPY: PostgreSQL's binary format (``pg_load.binary_copy``)."""
    from applier.targets.pg_load import binary_copy

    return b"".join(binary_copy(rows))


def create_tables(conn: Any, defs: dict[str, Any]) -> None:
    """Create every table (and its schema) empty, as the PostgreSQL target would on first sight, and commit."""
    from applier.targets import pg_sql as q

    with conn.transaction():
        for table in defs.values():
            conn.execute(q.create_schema(table.schema_name))
            conn.execute(q.create_table(q.target_table(table, {}), table))
