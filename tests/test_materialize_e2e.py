"""Tables added to running replication while pgbench writes to them, in each mode, applied to both targets.

Replication starts with ``pgbench_branches`` only. With pgbench's TPC-B-like
load running, ``pgbench_accounts`` is subscribed nonatomic (chunks between
watermarks, no lock), ``pgbench_tellers`` incremental (a chunk per four rows)
and ``pgbench_history`` (no key) atomic. The Applier applies the pairs; every
table then equals its source, each subscription is valid, and no collision
was counted (the nonatomic copy's are autocorrected).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from applier.engine.api import run_applier
from applier.engine.checkpoint import CheckpointStore
from applier.extract import extract
from applier.extract.subscriptions import Registry, applier_state
from extract_support import delta_row_set, extract_config, pg_row_set, prepare

pytestmark = [pytest.mark.postgres, pytest.mark.spark, pytest.mark.slow]
TABLES = ("public.pgbench_accounts", "public.pgbench_branches", "public.pgbench_tellers", "public.pgbench_history")
SUBSCRIBED = {"public.pgbench_accounts": ("nonatomic", 25_000), "public.pgbench_tellers": ("incremental", 4),
              "public.pgbench_history": ("atomic", None)}  # fmt: skip


def _pgbench(url: str, *args: str) -> list[str]:
    params = psycopg.conninfo.conninfo_to_dict(url)
    command = ["pgbench", "-h", str(params["host"]), "-p", str(params.get("port", 5432)), "-U", "postgres"]
    return [*command, *args, str(params["dbname"])]


def test_subscriptions_added_mid_run_in_each_mode_equal_the_source(
    tmp_path: Path, logical_source: tuple[str, str, str], target_settings: list[str], spark: Any
) -> None:
    url = logical_source[0]
    subprocess.run(_pgbench(url, "-i", "-I", "dtp", "-s", "1", "-q"), check=True, capture_output=True)
    config = extract_config(tmp_path, logical_source, "source.include=public.pgbench_branches", *target_settings)
    prepare(config)  # the slot, then pgbench's rows: the replicated table's come through it
    subprocess.run(_pgbench(url, "-i", "-I", "g", "-s", "1", "-q"), check=True, capture_output=True)
    extract(config)
    registry = Registry(config.intermediate_dir)
    load = subprocess.Popen(_pgbench(url, "-T", "8", "-c", "2", "-j", "1"), stdout=subprocess.DEVNULL)
    try:
        time.sleep(1)
        for table, (mode, chunk_rows) in SUBSCRIBED.items():
            registry.add(table, mode, chunk_rows)
            extract(config)  # materializes while pgbench writes
        while load.poll() is None:
            extract(config)
            time.sleep(0.5)
    finally:
        load.wait()
    assert load.returncode == 0
    extract(config)
    run_applier(config, spark=spark)

    for table in TABLES:
        source = pg_row_set(url, table, source_types=True)
        if config.target.type == "postgres":
            assert config.target.url
            target = pg_row_set(config.target.url, table, source_types=False)
        else:
            target = delta_row_set(config.target.path / table.replace(".", "/"))
        assert target == source, table
    applied = CheckpointStore(config.work_dir).load().applied_commit_lsn or 0
    subs = registry.load()
    assert {t: (s.mode, applier_state(s, applied), s.recovering) for t, s in subs.items()} == {
        t: (mode, "valid", False) for t, (mode, _) in SUBSCRIBED.items()
    }
    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]
    assert [r["collisions"] for r in reports if r.get("collisions")] == []
