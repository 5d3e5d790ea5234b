"""A long transaction far larger than the buffer: spilled while open, removed after commit,
and the driver's memory does not grow with the transaction's size."""

from __future__ import annotations

import datetime as dt
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from applier.intermediate.schema import Column, TableDef
from applier.intermediate.writer import IntermediateWriter

pytestmark = [pytest.mark.spark, pytest.mark.slow]

T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
ACCOUNTS = TableDef("bank.accounts", (Column("id", "bigint", False), Column("memo", "string", True)), ("id",))
MIB = 1024 * 1024


def write_big_transaction(directory: Path, size_mib: int) -> int:
    """Insert 2000 accounts, then one transaction of ``size_mib`` MiB of updates to them, and a small one after."""
    lsn = 0
    rng = random.Random(size_mib)
    with IntermediateWriter(directory, max_file_size_bytes=2 * MIB, clock=lambda: T0) as w:
        w.define_table(ACCOUNTS)
        w.begin("load", lsn := lsn + 1, T0)
        for i in range(2000):
            w.row(lsn := lsn + 1, "load", "bank.accounts", "I", None, {"id": i, "memo": "new"})
        w.commit("load", lsn := lsn + 1, T0)
        w.begin("big", lsn := lsn + 1, T0)
        written, n = 0, 0
        while written < size_mib * MIB:
            memo = f"batch {n} " + rng.randbytes(500).hex()  # incompressible, like real data
            w.row(lsn := lsn + 1, "big", "bank.accounts", "U", {"id": n % 2000}, {"id": n % 2000, "memo": memo})
            written += len(memo) + 30
            n += 1
        w.commit("big", lsn := lsn + 1, T0)
        w.begin("after", lsn := lsn + 1, T0)
        w.row(lsn := lsn + 1, "after", "bank.accounts", "D", {"id": 0}, None)
        w.commit("after", lsn := lsn + 1, T0)
    return w.next_seq - 1


def run_applier(tmp_path: Path, size_mib: int) -> list[dict]:
    pairs = write_big_transaction(tmp_path / "in", size_mib)
    assert pairs >= 3, "the transaction spans several pairs"
    config = tmp_path / "applier.yaml"
    config.write_text(
        f"configuration_name: big\nintermediate_dir: {tmp_path / 'in'}\noutput_dir: {tmp_path / 'out'}\n"
        f"target: {{path: {tmp_path / 'target'}}}\nspark: {{master: 'local[2]'}}\n"
        "apply: {process_intermediate_size_per_job: 2, buffer_size_for_split_records: 65536}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "applier.cli", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "out" / "big" / "cycles.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_50_mb_transaction_spills_while_open_and_its_file_goes_after_commit(tmp_path: Path) -> None:
    small = run_applier(tmp_path / "small", 10)
    large = run_applier(tmp_path / "large", 50)
    spill_name = "big_big.spill"
    first_open = next(r for r in large if r["spill_created"])
    assert [s["file"] for s in first_open["spill_created"]] == [spill_name]
    assert first_open["open"] == 1 and first_open["committed"] <= 1, "named while the transaction is open"
    commit_cycle = next(r for r in large if r["spill_removed"])
    assert [s["file"] for s in commit_cycle["spill_removed"]] == [spill_name]
    assert commit_cycle["spill_removed"][0]["bytes"] > 5 * MIB, "the rows went to the file, not to memory"
    assert commit_cycle["cycle_id"] > first_open["cycle_id"]
    assert not list((tmp_path / "large" / "out" / "big" / "tmp").glob("*.spill"))
    small_peak = max(r["driver_peak_rss_mib"] for r in small)
    large_peak = max(r["driver_peak_rss_mib"] for r in large)
    # Five times the transaction must not mean more memory: allow noise, not 40 MiB of growth.
    assert large_peak < small_peak + 20, (small_peak, large_peak)
