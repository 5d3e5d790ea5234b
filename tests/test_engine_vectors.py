"""The engine against the conformance vectors: valid folders give exactly the expected tables,
invalid ones apply pair 1, refuse pair 2 naming it, and continue once the input is fixed."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from applier.config import Config, load_config
from applier.engine.checkpoint import CheckpointStore
from applier.errors import IntermediateFileError
from applier.targets import open_target
from conftest import spec_dir
from engine_support import make_config, run
from reference.applier import canonical_rows

pytestmark = pytest.mark.spark
VECTORS = spec_dir() / "vectors"


def _folders(kind: str) -> list[str]:
    return sorted(p.name for p in (VECTORS / kind).iterdir() if p.is_dir()) if (VECTORS / kind).is_dir() else []


def assert_tables_as_expected(config: Config, expected: dict[str, Any]) -> None:
    target = open_target(config)
    for name, want in expected["tables"].items():
        table = target.read_arrow(name)
        if table is None:
            assert want["rows"] == [], f"{name} is missing"
            continue
        assert table.column_names == want["columns"]
        columns_types = list(zip(want["columns"], _types(config, name), strict=True))
        got = canonical_rows(columns_types, [list(r.values()) for r in table.to_pylist()])
        assert got == canonical_rows(columns_types, want["rows"]), name


def _types(config: Config, table: str) -> list[str]:
    checkpoint = CheckpointStore(config.work_dir).load()
    return [c.type for c in checkpoint.tables[table].columns]


def _copy(name: str, kind: str, tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    shutil.copytree(VECTORS / kind / name, folder, ignore=shutil.ignore_patterns("expected.json"))
    return folder


@pytest.mark.parametrize("name", _folders("valid"))
def test_a_valid_folder_gives_exactly_the_expected_tables(
    tmp_path: Path, spark: Any, name: str, target_settings: list[str]
) -> None:
    expected = json.loads((VECTORS / "valid" / name / "expected.json").read_text())
    config = make_config(tmp_path, _copy(name, "valid", tmp_path), target_settings)
    summary = run(config, spark)
    assert summary.checkpoint.applied_seq == expected["applied_through_seq"]
    assert_tables_as_expected(config, expected)


@pytest.mark.parametrize("name", _folders("invalid"))
def test_an_invalid_folder_applies_pair_1_and_refuses_pair_2(
    tmp_path: Path, spark: Any, name: str, target_settings: list[str]
) -> None:
    expected = json.loads((VECTORS / "invalid" / name / "expected.json").read_text())
    assert_pair_2_refused(make_config(tmp_path, _copy(name, "invalid", tmp_path), target_settings), spark, expected)


def assert_pair_2_refused(config: Config, spark: Any, expected: dict[str, Any]) -> None:
    """A run of an invalid vector applies pair 1, then refuses pair 2 naming it, for the vector's defect."""
    with pytest.raises(IntermediateFileError) as refused:
        run(config, spark)
    assert refused.value.exit_code == 3 and refused.value.code == expected["what"]
    assert "000000000002" in str(refused.value)
    assert CheckpointStore(config.work_dir).load().applied_seq == expected["applied_through_seq"]
    assert_tables_as_expected(config, expected)


def test_a_wrong_digest_is_found_by_the_executor_reading_the_pair_and_refused_as_at_reading(
    tmp_path: Path, spark: Any, target_settings: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    # The driver reads the pairs without hashing them; the compile job's task reading pair 2 finds its digest wrong.
    expected = json.loads((VECTORS / "invalid" / "sha-mismatch" / "expected.json").read_text())
    config = make_config(tmp_path, _copy("sha-mismatch", "invalid", tmp_path), target_settings)
    with caplog.at_level(logging.INFO, logger="applier"), pytest.raises(IntermediateFileError) as refused:
        run(config, spark)
    late = [r.getMessage() for r in caplog.records if "refused by Spark's image check" in r.getMessage()]
    assert late and late[0].startswith("pair 2 refused") and "sha256 is " in late[0], late
    assert refused.value.code == "sha-mismatch" and refused.value.exit_code == 3
    assert "000000000002.dat" in str(refused.value) and "header says" in str(refused.value)
    assert CheckpointStore(config.work_dir).load().applied_seq == expected["applied_through_seq"] == 1
    assert_tables_as_expected(config, expected)


@pytest.mark.slow
def test_applier_run_exits_3_naming_the_pair_and_continues_once_the_input_is_fixed(tmp_path: Path) -> None:
    folder = _copy("sha-mismatch", "invalid", tmp_path)
    config_file = tmp_path / "applier.yaml"
    config_file.write_text(
        f"configuration_name: fix\nintermediate_dir: {folder}\noutput_dir: {tmp_path / 'out'}\n"
        f"target: {{path: {tmp_path / 'target'}}}\nspark: {{master: 'local[1]'}}\n"
    )
    applier = [sys.executable, "-m", "applier.cli", "run", "--config", str(config_file)]
    refused = subprocess.run(applier, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 3, refused.stderr[-2000:]
    assert "000000000002.dat" in refused.stderr and "sha256" in refused.stderr
    for pair in ("000000000002", "000000000003"):  # the extractor rewrites the broken pair correctly
        for ext in (".dat", ".trn"):
            shutil.copy(VECTORS / "valid" / "three-pairs" / f"{pair}{ext}", folder / f"{pair}{ext}")
    fixed = subprocess.run(applier, capture_output=True, text=True, timeout=600)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    expected = json.loads((VECTORS / "valid" / "three-pairs" / "expected.json").read_text())
    assert_tables_as_expected(load_config(config_file), expected)
