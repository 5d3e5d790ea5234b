"""`applier status` and the spark-submit entry point, as operators use them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from applier.config import load_config
from applier.generate import generate_workload
from conftest import REPO, spec_dir
from engine_support import assert_target_equals_reference, make_config, run

pytestmark = pytest.mark.spark


def _write_config(tmp_path: Path, intermediate: Path, extra: str = "") -> Path:
    path = tmp_path / "applier.yaml"
    path.write_text(
        f"configuration_name: test_cfg\nintermediate_dir: {intermediate}\noutput_dir: {tmp_path / 'out'}\n"
        f"target: {{path: {tmp_path / 'target'}}}\n{extra}"
    )
    return path


def test_status_shows_positions_backlog_open_transactions_and_the_last_cycle(tmp_path: Path, spark: Any) -> None:
    workload = generate_workload(
        tmp_path / "in", seed=21, transactions=120, file_size_mb=0.03, profile="long-transactions"
    )
    config = make_config(
        tmp_path, tmp_path / "in", process_intermediate_size_per_job=0.1, buffer_size_for_split_records=1024
    )
    summary = run(config, spark, max_cycles=2)
    checkpoint = summary.checkpoint
    config_file = _write_config(
        tmp_path,
        tmp_path / "in",
        "apply: {process_intermediate_size_per_job: 0.1, buffer_size_for_split_records: 1024}\n",
    )
    assert load_config(config_file).work_dir == config.work_dir
    done = subprocess.run(
        [sys.executable, "-m", "applier.cli", "status", "--config", str(config_file)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"applied seq {checkpoint.applied_seq} " in out and f"restart seq {checkpoint.restart_seq}" in out
    assert f"backlog: {workload.pairs - checkpoint.applied_seq} pairs" in out
    assert "open transactions: " in out and "open transactions: 0" not in out
    assert "spilled" in out, "a long transaction over the 1 KB buffer shows as spilled"
    assert "last cycle: 2 " in out


def test_the_spark_submit_job_applies_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    shutil.copytree(spec_dir() / "vectors" / "valid" / "three-pairs", folder, ignore=shutil.ignore_patterns("*.json"))
    config_file = _write_config(tmp_path, folder)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    spark_submit = Path(sys.executable).parent / "spark-submit"
    done = subprocess.run(
        [str(spark_submit), "--master", "local[1]", str(REPO / "jobs" / "apply.py"), "--config", str(config_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    config = load_config(config_file)
    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]
    assert reports[-1]["applied_seq"] == 3
    assert_target_equals_reference(config, folder)
