"""The per-transaction baseline (runs in a child process, ``--part pertxn``).

The first committed transactions, in commit order, each applied as its own
delta-rs commits (one merge per touched table) into new empty Delta tables;
the report extrapolates the time linearly to all committed transactions.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.common import BenchError
from bench.workload import latest_table_defs

Segment = tuple[str, Any, Any]  # (op, before-image, after-image) of one change
Change = tuple[str, str, Any, Any]  # (table, op, before-image, after-image)


def _converter(type_name: str) -> Callable[[Any], Any]:
    """How to turn one JSON value of a spec type into its Python value."""
    specials = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
    simple: dict[str, Callable[[Any], Any]] = {
        "int": int,
        "bigint": int,
        "boolean": bool,
        "string": str,
        "double": lambda v: specials[v] if isinstance(v, str) else float(v),
        "date": dt.date.fromisoformat,
        "timestamp": dt.datetime.fromisoformat,
        "binary": base64.b64decode,
    }
    return simple.get(type_name, Decimal)  # every other spec type is decimal(p,s), written as a string


class _Typed:
    """Turns JSON images of one table into Arrow tables of its (latest) definition."""

    def __init__(self, table: Any) -> None:
        import pyarrow as pa

        from applier.engine.changes import arrow_schema

        self.table = table
        self.schema = arrow_schema(table)
        self.loose = pa.schema([f.with_nullable(True) for f in self.schema])
        self.convert = [(c.name, _converter(c.type)) for c in table.columns]

    def rows(self, images: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """JSON images as rows of Python values of the table's types."""
        return [{n: (None if (v := img.get(n)) is None else f(v)) for n, f in self.convert} for img in images]

    def arrow(self, rows: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> Any:
        """Rows as an Arrow table of the table's columns (all nullable), plus ``extra`` string columns."""
        import pyarrow as pa

        columns = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in self.loose}
        for name, values in (extra or {}).items():
            columns[name] = pa.array(values, pa.string())
        return pa.table(columns)


def _same_key(v: Any) -> Any:
    """A value to compare rows by: NaN equal to NaN and -0.0 equal to 0.0, as in the table."""
    return "__nan__" if isinstance(v, float) and math.isnan(v) else (0.0 if v == 0.0 and isinstance(v, float) else v)


def _commit_order(intermediate: Path, prefix: int) -> tuple[list[str], list[Any]]:
    """The first ``prefix`` committed transactions in commit order (from the ``.trn`` files) and the pairs they need."""
    from applier.intermediate.pairs import list_pairs

    chosen: list[str] = []
    needed = []
    for ref in list_pairs(intermediate).pairs:
        needed.append(ref)
        with open(ref.trn_path, encoding="utf-8") as fh:
            next(fh)
            for line in fh:
                event = json.loads(line)
                if event["record"] == "commit" and len(chosen) < prefix:
                    chosen.append(event["xid"])
        if len(chosen) >= prefix:
            break
    return chosen, needed


def _changes_by_xid(needed: list[Any], chosen: list[str]) -> tuple[dict[str, list[Change]], int]:
    """The rows of the ``chosen`` transactions from the ``.dat`` files, in lsn order; and how many there are."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    wanted = pa.array(chosen, pa.string())
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
    return by_xid, data.num_rows


def _net_keyed(key_of: list[str], segment: list[Segment]) -> dict[tuple[Any, ...], dict[str, Any] | None]:
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


def _remove_rows(name: str, current: list[dict[str, Any]], removals: list[dict[str, Any]], names: list[str]) -> Any:
    """``current`` without one row per removal, matched on every column (NaN and -0.0 compare as values)."""
    gone: dict[tuple[Any, ...], int] = defaultdict(int)
    for r in removals:
        gone[tuple(_same_key(r[c]) for c in names)] += 1
    kept = []
    for r in current:
        k = tuple(_same_key(r[c]) for c in names)
        if gone.get(k, 0) > 0:
            gone[k] -= 1
        else:
            kept.append(r)
    if any(gone.values()):
        raise BenchError(f"{name}: a transaction deletes a row value the table does not hold")
    return kept


class _PerTransactionWriter:
    """Applies transactions one by one as their own delta-rs commits, counting commits and the time they take."""

    def __init__(self, defs: dict[str, Any], root: Path) -> None:
        from deltalake import DeltaTable

        self.typed = {name: _Typed(t) for name, t in defs.items()}
        self.tables: dict[str, Any] = {}
        for name, t in self.typed.items():
            path = str(root / name.replace(".", "/"))
            DeltaTable.create(path, t.schema, mode="error")
            self.tables[name] = DeltaTable(path)
        self.commits = 0
        self.prepare_s = 0.0
        self.delta_s = 0.0

    def _count(self, t0: float, t1: float, t2: float) -> None:
        """Count one commit: typing from ``t0`` to ``t1``, delta-rs from ``t1`` to ``t2``."""
        self.commits += 1
        self.prepare_s += t1 - t0
        self.delta_s += t2 - t1

    def apply_keyed(self, name: str, segment: list[Segment]) -> None:
        """One merge on the key: the segment's net upserts and deletes."""
        t0 = time.perf_counter()
        t = self.typed[name]
        key_of = t.table.primary_key
        final = _net_keyed(key_of, segment)
        images = [img if img is not None else dict(zip(key_of, key, strict=True)) for key, img in final.items()]
        ops = ["U" if img is not None else "D" for img in final.values()]
        source = t.arrow(t.rows(images), {"__op": ops})
        on = " AND ".join(f't."{k}" = s."{k}"' for k in key_of)
        t1 = time.perf_counter()
        (
            self.tables[name]
            .merge(source, on, source_alias="s", target_alias="t")
            .when_matched_delete("s.__op = 'D'")
            .when_matched_update_all("s.__op = 'U'", except_cols=["__op"])
            .when_not_matched_insert_all("s.__op = 'U'", except_cols=["__op"])
            .execute()
        )
        self._count(t0, t1, time.perf_counter())

    def apply_counted(self, name: str, segment: list[Segment]) -> None:
        """A table without a key: an append, or a rewrite of the whole table when the segment removes rows."""
        from deltalake import write_deltalake

        t0 = time.perf_counter()
        t = self.typed[name]
        inserts = t.rows([a for op, _, a in segment if op in ("I", "U")])
        removals = t.rows([b for op, b, _ in segment if op in ("D", "U")])
        if not removals:
            data = t.arrow(inserts)
            t1 = time.perf_counter()
            write_deltalake(self.tables[name], data, mode="append")
        else:
            current = self.tables[name].to_pyarrow_table().to_pylist()
            data = t.arrow(_remove_rows(name, current, removals, t.loose.names) + inserts)
            t1 = time.perf_counter()
            write_deltalake(self.tables[name], data, mode="overwrite")
        self.tables[name].update_incremental()
        self._count(t0, t1, time.perf_counter())

    def truncate(self, name: str) -> None:
        """A truncate: one ``delete()`` of the whole table."""
        t1 = time.perf_counter()
        self.tables[name].delete()
        self.delta_s += time.perf_counter() - t1
        self.commits += 1

    def apply_transaction(self, changes: list[Change]) -> None:
        """Per touched table, its changes between truncates as one commit each, and each truncate as its own."""
        per_table: dict[str, list[Segment]] = {}
        for table, op, before, after in changes:
            per_table.setdefault(table, []).append((op, before, after))
        for name, table_changes in per_table.items():
            apply = self.apply_keyed if self.typed[name].table.primary_key else self.apply_counted
            segment: list[Segment] = []
            for op, before, after in table_changes:
                if op != "T":
                    segment.append((op, before, after))
                    continue
                if segment:
                    apply(name, segment)
                    segment = []
                self.truncate(name)
            if segment:
                apply(name, segment)


def part_pertxn(params: dict[str, Any]) -> dict[str, Any]:
    """Apply each of the first ``prefix`` committed transactions as its own Delta commits, with delta-rs.

    Args:
        params: ``intermediate_dir``, ``out_dir`` (the new tables) and ``prefix`` (transactions to apply).

    Returns:
        The transactions, rows and commits applied, the seconds they took (typing and delta-rs apart), the
        seconds spent loading them (not timed with the rest) and the rows each table ends with.
    """
    intermediate, root, prefix = Path(params["intermediate_dir"]), Path(params["out_dir"]), params["prefix"]
    defs = latest_table_defs(intermediate)
    load_started = time.perf_counter()
    chosen, needed = _commit_order(intermediate, prefix)
    by_xid, num_rows = _changes_by_xid(needed, chosen)
    load_s = time.perf_counter() - load_started
    print(f"loaded {len(chosen)} transactions, {num_rows} rows in {load_s:.1f} s", flush=True)

    writer = _PerTransactionWriter(defs, root)
    started = time.perf_counter()
    rows_applied = 0
    for n, xid in enumerate(chosen, start=1):
        changes = by_xid.get(xid, [])
        rows_applied += len(changes)
        writer.apply_transaction(changes)
        if n % 250 == 0:
            elapsed = time.perf_counter() - started
            print(f"{n}/{len(chosen)} transactions, {writer.commits} commits, {elapsed:.1f} s", flush=True)
    seconds = time.perf_counter() - started
    return {
        "transactions": len(chosen),
        "rows": rows_applied,
        "commits": writer.commits,
        "seconds": seconds,
        "prepare_s": writer.prepare_s,
        "delta_s": writer.delta_s,
        "load_s": load_s,
        "final_rows": {name: t.to_pyarrow_dataset().count_rows() for name, t in writer.tables.items()},
    }
