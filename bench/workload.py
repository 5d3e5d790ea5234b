"""The benchmark's workload: the work folder, the generated pairs, and the small pairs added after a bulk run."""

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

from bench.common import MARKER, MIB, BenchError, progress


def prepare_workdir(workdir: Path) -> None:
    """Empty ``workdir``; refuse a non-empty folder this benchmark did not create."""
    if workdir.exists():
        if not workdir.is_dir():
            raise BenchError(f"--workdir {workdir} exists and is not a folder")
        if any(workdir.iterdir()) and not (workdir / MARKER).exists():
            raise BenchError(f"--workdir {workdir} is not empty and was not made by this benchmark; not deleting it")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / MARKER).write_text("made by bench.apply_bench; deleted by it\n", encoding="utf-8")


def generate(intermediate: Path, transactions: int, file_size_mb: float) -> dict[str, Any]:
    """Generate the ``bench`` workload into ``intermediate``; its figures and the seconds it took."""
    from applier.generate import generate_workload

    last = [time.perf_counter()]

    def show(done: int, total: int) -> None:
        if time.perf_counter() - last[0] > 15 and done < total:
            last[0] = time.perf_counter()
            progress(f"generate: {done}/{total} transactions")

    started = time.perf_counter()
    s = generate_workload(
        intermediate, profile="bench", transactions=transactions, seed=1, file_size_mb=file_size_mb, progress=show
    )
    seconds = time.perf_counter() - started
    facts = {
        "transactions": s.transactions,
        "committed": s.committed,
        "rolled_back": s.rolled_back,
        "left_open": s.left_open,
        "empty": s.empty,
        "changes": s.rows,
        "pairs": s.pairs,
        "bytes": s.bytes,
        "rows_per_table": dict(s.rows_per_table),
        "rows_per_op": dict(s.rows_per_op),
        "last_lsn": s.last_lsn,
        "file_size_mb": file_size_mb,
        "seconds": seconds,
    }
    progress(
        f"generate: {s.rows} changes, {s.committed} committed of {s.transactions} transactions, "
        f"{s.pairs} pairs, {s.bytes / MIB:.1f} MiB in {seconds:.0f} s"
    )
    return facts


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

    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
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
    picked = random.Random(number).sample(range(customers.num_rows), transactions)
    rows = customers.take(picked).to_pylist()
    writer = IntermediateWriter(
        config.intermediate_dir, max_file_size_bytes=64 * MIB, start_seq=checkpoint.applied_seq + 1
    )
    for name in ("shop.customers", "shop.events"):
        writer.define_table(checkpoint.tables[name])
    lsn = (checkpoint.last_lsn or 0) + 1000
    now = dt.datetime.now(dt.UTC)
    changes = 0
    for i, row in enumerate(rows):
        xid = f"bench-tail-{number}-{i}"
        before = {k: _json_value(v) for k, v in row.items()}
        after = {**before, "loyalty_points": before["loyalty_points"] + 1}
        writer.begin(xid, lsn, now)
        writer.row(lsn + 1, xid, "shop.customers", "U", before, after)
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
        changes += 3
    writer.close()
    return {"seq": checkpoint.applied_seq + 1, "transactions": transactions, "changes": changes}
