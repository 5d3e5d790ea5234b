"""The target is authoritative: a lost or stale checkpoint.json never makes a run skip pairs.

Each target keeps a copy of the checkpoint beside the data (PostgreSQL: in the
checkpoint row; Delta: ``<root>/_applier/<configuration>.checkpoint.json``).
A run whose file is missing or older starts from the copy; when the target
holds a cycle past both, the run refuses before it applies anything.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest

from applier.errors import TargetError
from applier.generate import generate_workload
from applier.targets import open_target
from engine_support import assert_target_equals_reference, make_config, run

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("authoritative") / "in"
    generate_workload(out, seed=3, transactions=200, file_size_mb=0.03, profile="demo")
    return out


def _drop_copy(config: Any, settings: list[str]) -> None:
    if settings:
        url = settings[1].split("=", 1)[1]
        with psycopg.connect(url) as conn:
            conn.execute("UPDATE applier_checkpoint SET state = NULL")
    else:
        (config.target.path / "_applier" / "test_cfg.checkpoint.json").unlink()


def test_a_lost_checkpoint_with_another_cycle_size_resumes_from_the_target_s_copy(
    tmp_path: Path, spark: Any, stream: Path, target_settings: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(tmp_path, stream, target_settings, process_intermediate_size_per_job=0.03)
    first = run(config, spark, max_cycles=3)
    applied = first.checkpoint.applied_seq
    assert first.checkpoint.cycle_id == 3 and applied < len(list(stream.glob("*.trn")))
    copy = open_target(config).saved_checkpoint()
    assert copy is not None and copy["cycle_id"] == 3 and copy["applied_seq"] == applied

    (config.work_dir / "checkpoint.json").unlink()
    bigger = make_config(tmp_path, stream, target_settings, process_intermediate_size_per_job=0.2)
    with caplog.at_level(logging.WARNING, logger="applier"):
        summary = run(bigger, spark)
    assert any("checkpoint.json was missing, the target's copy holds cycle 3" in r.getMessage() for r in caplog.records)
    assert summary.reports[0].seqs[0] == applied + 1  # no pair skipped, none applied twice
    assert_target_equals_reference(bigger, stream)


def test_a_stale_checkpoint_resumes_from_the_newer_copy(
    tmp_path: Path, spark: Any, stream: Path, target_settings: list[str]
) -> None:
    config = make_config(tmp_path, stream, target_settings, process_intermediate_size_per_job=0.03)
    run(config, spark, max_cycles=1)
    old = tmp_path / "checkpoint-after-cycle-1.json"
    shutil.copy2(config.work_dir / "checkpoint.json", old)
    run(config, spark, max_cycles=2)
    shutil.copy2(old, config.work_dir / "checkpoint.json")  # a backup from before put back
    summary = run(config, spark)
    assert summary.reports[0].cycle_id == 4
    assert_target_equals_reference(config, stream)


def test_with_no_checkpoint_and_no_copy_a_run_refuses_before_applying_anything(
    tmp_path: Path, spark: Any, stream: Path, target_settings: list[str]
) -> None:
    config = make_config(tmp_path, stream, target_settings, process_intermediate_size_per_job=0.03)
    run(config, spark, max_cycles=2)
    saved = json.loads((config.work_dir / "checkpoint.json").read_text())
    (config.work_dir / "checkpoint.json").unlink()
    _drop_copy(config, target_settings)
    with pytest.raises(TargetError) as refused:
        run(config, spark)
    message = str(refused.value)
    held = max(saved["table_cycles"].values())  # the last cycle that committed changes
    assert f"the target holds cycle {held}, but" in message and "holds cycle 0" in message, message
    assert "restore checkpoint.json from a backup" in message
    assert not (config.work_dir / "checkpoint.json").exists()
    # Put back, the run goes on from where it was and equals the reference.
    (config.work_dir / "checkpoint.json").write_text(json.dumps(saved))
    run(config, spark)
    assert_target_equals_reference(config, stream)
