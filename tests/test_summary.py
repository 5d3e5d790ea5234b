"""The summary ``make demo`` ends with: read from a configuration's files, worded for people."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from applier.config import load_config
from applier.engine.checkpoint import Checkpoint, CheckpointStore
from applier.engine.ledger import RunLedger, RunRecord
from applier.engine.report import collision_counts
from applier.summary import Summary, collisions_line, main, read_summary, summary_lines


def test_summary_lines() -> None:
    summary = Summary(
        configuration_name="demo",
        cycles=3,
        applied_seq=7,
        committed=40,
        rolled_back=2,
        rows={"shop.events": 5, "shop.orders": 10},
        target="delta tables under /t",
        last_run={"run_key": "20260101T000500Z", "mode": "apply", "status": "finished", "cycles": 3},
        validation={
            "results_name": "20260101T000500Z",
            "success": False,
            "tables": {"shop.events": {}, "shop.orders": {}},
            "failures": ["shop.orders: expect_column_values_to_be_unique(id) failed: 1 unexpected value"],
            "json_path": "/o/validation/20260101T000500Z/validation.json",
            "data_docs_path": "/o/validation/data_docs/index.html",
        },
    )
    assert summary_lines(summary) == [
        "configuration demo: 3 cycles, applied through pair 7",
        "transactions: 40 committed, 2 rolled back",
        "transactions set aside by error actions: none",
        "collisions: none",
        "last run 20260101T000500Z: apply, finished, 3 cycles",
        "rows per table (15 in all):",
        "  shop.events: 5",
        "  shop.orders: 10",
        "validation 20260101T000500Z: FAILED (2 tables)",
        "  shop.orders: expect_column_values_to_be_unique(id) failed: 1 unexpected value",
        "  results: /o/validation/20260101T000500Z/validation.json",
        "  Data Docs: /o/validation/data_docs/index.html",
        "target: delta tables under /t",
    ]


def test_read_summary_from_the_work_folder(tmp_path: Path) -> None:
    paths = [f"intermediate_dir={tmp_path}", f"output_dir={tmp_path}", f"target.path={tmp_path}"]
    config = load_config(None, ["configuration_name=demo", *paths])
    CheckpointStore(config.work_dir).save(Checkpoint(cycle_id=2, applied_seq=5, row_counts={"s.b": 3, "s.a": 1}))
    (config.work_dir / "cycles.jsonl").write_text(
        json.dumps({"cycle_id": 1, "committed": 4, "rolled_back": 1})
        + "\n"
        + json.dumps({"cycle_id": 2, "committed": 6, "rolled_back": 0})
        + "\n"
    )
    RunLedger(config.work_dir).save(RunRecord(run_key="k1", status="finished", mode="apply", started_at="2026-01-01"))
    results = config.work_dir / "validation" / "k1" / "validation.json"
    results.parent.mkdir(parents=True)
    results.write_text(json.dumps({"results_name": "k1", "success": True, "tables": {"s.a": {}}, "failures": []}))

    summary = read_summary(config)
    assert summary == Summary(
        configuration_name="demo",
        cycles=2,
        applied_seq=5,
        committed=10,
        rolled_back=1,
        rows={"s.a": 1, "s.b": 3},
        target=f"delta tables under {tmp_path}",
        last_run={"run_key": "k1", "mode": "apply", "status": "finished", "cycles": 0},
        validation={
            "results_name": "k1",
            "success": True,
            "tables": {"s.a": {}},
            "failures": [],
            "json_path": str(results),
        },
    )


def test_a_bad_configuration_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("configuration_name: _bad\n")
    assert main(["--config", str(config)]) == 2
    assert "configuration key 'configuration_name': '_bad' is not allowed" in capsys.readouterr().err


def test_the_collisions_line_counts_per_table_and_kind() -> None:
    counts = {"shop.items": {"insert": 1, "delete": 2}, "shop.log": {"delete": 1}}
    assert collisions_line(counts) == (
        "collisions: 4, applied as upserts (shop.items: 1 insert found its key already held, 2 deletes found no row; "
        "shop.log: 1 delete found no row)"
    )
    reports = [{"collisions": {"shop.items": {"insert": 1}}}, {}, {"collisions": {"shop.items": {"insert": 2}}}]
    assert collision_counts(reports) == {"shop.items": {"insert": 3}}
