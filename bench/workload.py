"""The benchmark's workloads: the work folder, the generated pairs, and the small pairs the harness writes itself."""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import random
import shutil
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.measure import MIB, BenchError, progress

MARKER = ".cdc-bench"  # a folder holding this file is ours to delete


def prepare_workdir(workdir: Path) -> None:
    """Empty ``workdir``; refuse a non-empty folder this benchmark did not create."""
    if workdir.exists():
        if not workdir.is_dir():
            raise BenchError(f"--workdir {workdir} exists and is not a folder")
        if any(workdir.iterdir()) and not (workdir / MARKER).exists():
            raise BenchError(f"--workdir {workdir} is not empty and was not made by this benchmark; not deleting it")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / MARKER).write_text("made by python -m bench; deleted by it\n", encoding="utf-8")


def generate(
    intermediate: Path, profile: str, transactions: int | None, file_size_mb: float | None, **sizes: Any
) -> dict[str, Any]:
    """Generate a ``profile`` workload (seed 1) into ``intermediate``; its figures and the seconds it took.

    ``transactions`` and ``file_size_mb`` are the profile's own when None; ``sizes`` are the profile's sizing
    arguments (``tables``, ``columns`` of ``wide``).
    """
    from applier.generate import generate_workload

    last = [time.perf_counter()]

    def show(done: int, total: int) -> None:
        if time.perf_counter() - last[0] > 15 and done < total:
            last[0] = time.perf_counter()
            progress(f"generate {profile}: {done}/{total} transactions")

    started = time.perf_counter()
    s = generate_workload(
        intermediate,
        profile=profile,
        transactions=transactions,
        seed=1,
        file_size_mb=file_size_mb,
        progress=show,
        **sizes,
    )
    seconds = time.perf_counter() - started
    busiest = sorted(s.rows_per_table.items(), key=lambda kv: -kv[1])[:10]
    progress(
        f"generate {profile}: {s.rows} changes, {s.committed} committed of {s.transactions} transactions, "
        f"{s.pairs} pairs, {s.bytes / MIB:.1f} MiB in {seconds:.0f} s"
    )
    return {
        "profile": profile,
        "arguments": {"transactions": transactions, "file_size_mb": file_size_mb, **sizes},
        "transactions": s.transactions,
        "committed": s.committed,
        "rolled_back": s.rolled_back,
        "left_open": s.left_open,
        "empty": s.empty,
        "changes": s.rows,
        "pairs": s.pairs,
        "bytes": s.bytes,
        "tables": len(s.rows_per_table),
        "rows_per_table": dict(busiest) if len(s.rows_per_table) > 10 else dict(sorted(s.rows_per_table.items())),
        "rows_per_op": dict(sorted(s.rows_per_op.items())),
        "seconds": seconds,
    }


def latest_table_defs(intermediate: Path) -> dict[str, Any]:
    """The last definition of every table, from the ``cdc.tables`` metadata of the pairs."""
    import pyarrow.parquet as pq

    from applier.intermediate.pairs import TABLES_METADATA_KEY, list_pairs
    from applier.intermediate.schema import parse_table_def

    defs: dict[str, Any] = {}
    for ref in list_pairs(intermediate).pairs:
        metadata = pq.read_schema(ref.dat_path).metadata or {}
        for name, raw in json.loads(metadata.get(TABLES_METADATA_KEY, b"{}")).items():
            defs[name] = parse_table_def(name, raw)
    return dict(sorted(defs.items()))


def _json_value(v: Any) -> Any:
    """A Python value read from Arrow, in the spec's JSON encoding."""
    from applier.intermediate.writer import utc_text

    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if v is None or isinstance(v, bool | int | str | float):
        return v
    if isinstance(v, Decimal):
        return format(v, "f")
    if isinstance(v, dt.datetime):
        return utc_text(v)
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")
    raise TypeError(f"no JSON encoding for {type(v).__name__}")


def write_tail_pair(config: Any, target: Any, number: int, transactions: int) -> dict[str, int]:
    """One small pair after everything applied so far: customer updates and event inserts, all committed.

    Sequence numbers and lsns continue the checkpoint's; the customers updated
    are rows the target holds now, so the before-images are exact.
    """
    from applier.engine.checkpoint import CheckpointStore
    from applier.intermediate.writer import IntermediateWriter, utc_text

    checkpoint = CheckpointStore(config.work_dir).load()
    customers = target.read_arrow("shop.customers")
    if customers is None or customers.num_rows < transactions:
        raise BenchError("the target holds too few customers for the small cycle")
    rows = customers.take(random.Random(number).sample(range(customers.num_rows), transactions)).to_pylist()
    writer = IntermediateWriter(
        config.intermediate_dir, max_file_size_bytes=64 * MIB, start_seq=checkpoint.applied_seq + 1
    )
    for name in ("shop.customers", "shop.events"):
        writer.define_table(checkpoint.tables[name])
    lsn, now = (checkpoint.last_lsn or 0) + 1000, dt.datetime.now(dt.UTC)
    for i, row in enumerate(rows):
        xid = f"bench-tail-{number}-{i}"
        before = {k: _json_value(v) for k, v in row.items()}
        writer.begin(xid, lsn, now)
        writer.row(
            lsn + 1, xid, "shop.customers", "U", before, {**before, "loyalty_points": before["loyalty_points"] + 1}
        )
        for j in range(2):
            event = {
                "at": utc_text(now),
                "kind": "bench_tail",
                "entity_id": row["id"],
                "score": 0.5 + j,
                "payload": xid,
            }
            writer.row(lsn + 2 + j, xid, "shop.events", "I", None, event)
        writer.commit(xid, lsn + 4, now)
        lsn += 10
    writer.close()
    return {"seq": checkpoint.applied_seq + 1, "transactions": transactions, "changes": 3 * transactions}


def write_run_length_pairs(intermediate: Path, pairs: int, per_pair: int, accounts: int = 1000) -> dict[str, Any]:
    """``pairs`` small pairs of equal shape, one per cycle of the run-length step; their figures.

    Pair 1 inserts ``accounts`` rows of a keyed table in one transaction; every
    later pair holds ``per_pair`` committed transactions, each updating one
    account (its before-image exact) and appending a row to a keyless table.
    """
    from applier.intermediate.schema import Column, TableDef
    from applier.intermediate.writer import IntermediateWriter, utc_text

    started = time.perf_counter()
    keyed = TableDef("bench.accounts", (Column("id", "bigint", False), Column("balance", "bigint", False)), ("id",))
    audit = TableDef("bench.audit", (Column("account", "bigint", False), Column("at", "timestamp", False)), ())
    balances, lsn, rng = dict.fromkeys(range(accounts), 0), 1, random.Random(1)
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for seq in range(1, pairs + 1):
        with IntermediateWriter(intermediate, max_file_size_bytes=64 * MIB, start_seq=seq) as writer:
            writer.define_table(keyed)
            writer.define_table(audit)
            batch = [None] if seq == 1 else [rng.randrange(accounts) for _ in range(per_pair)]
            for n, account in enumerate(batch):
                xid, at = f"r{seq}-{n}", now + dt.timedelta(seconds=lsn)
                writer.begin(xid, lsn, at)
                if account is None:
                    for i in range(accounts):
                        writer.row(lsn + 1 + i, xid, keyed.name, "I", None, {"id": i, "balance": 0})
                    lsn += accounts
                else:
                    old = {"id": account, "balance": balances[account]}
                    balances[account] += 1
                    writer.row(lsn + 1, xid, keyed.name, "U", old, {**old, "balance": balances[account]})
                    writer.row(lsn + 2, xid, audit.name, "I", None, {"account": account, "at": utc_text(at)})
                writer.commit(xid, lsn + 3, at)
                lsn += 4
    size = sum(f.stat().st_size for f in intermediate.iterdir())
    changes = accounts + 2 * per_pair * (pairs - 1)
    progress(f"run-length pairs: {pairs} pairs, {changes} changes, {size / MIB:.1f} MiB")
    return {
        "profile": "run-length (written by bench.workload)",
        "transactions": 1 + per_pair * (pairs - 1),
        "committed": 1 + per_pair * (pairs - 1),
        "rolled_back": 0,
        "left_open": 0,
        "empty": 0,
        "changes": changes,
        "pairs": pairs,
        "bytes": size,
        "tables": 2,
        "rows_per_table": {keyed.name: accounts + per_pair * (pairs - 1), audit.name: per_pair * (pairs - 1)},
        "rows_per_op": {"I": accounts + per_pair * (pairs - 1), "U": per_pair * (pairs - 1)},
        "seconds": time.perf_counter() - started,
    }
