"""End to end: generated workloads applied to each target equal the independent reference applier."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from applier.engine.checkpoint import CheckpointStore
from applier.engine.groups import Group, GroupLimits, form_groups
from applier.engine.parts import txn_shapes
from applier.engine.reading import read_cycle
from applier.engine.units import commit_order
from applier.generate import generate_workload
from applier.intermediate.pairs import list_pairs
from applier.intermediate.stream import StreamValidator
from engine_support import assert_target_equals_reference, make_config, run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

CASES = {
    # name: (profile, seed, transactions, file MiB, cycle limit MiB, buffer bytes)
    "demo-all-at-once-large-buffer": ("demo", 1, 250, 0.05, 0, 1_048_576),
    "demo-small-cycles-tiny-buffer": ("demo", 2, 250, 0.05, 0.06, 512),
    "rollback-heavy-medium-cycles": ("rollback-heavy", 3, 250, 0.05, 0.2, 2048),
    "long-transactions-small-cycles": ("long-transactions", 4, 120, 0.05, 0.1, 1024),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_generated_workload_applied_equals_the_reference(
    tmp_path: Path, spark: Any, case: str, target_settings: list[str]
) -> None:
    profile, seed, transactions, file_mb, limit_mb, buffer = CASES[case]
    workload = generate_workload(
        tmp_path / "in", seed=seed, transactions=transactions, file_size_mb=file_mb, profile=profile
    )
    config = make_config(
        tmp_path,
        tmp_path / "in",
        target_settings,
        process_intermediate_size_per_job=limit_mb,
        buffer_size_for_split_records=buffer,
    )
    summary = run(config, spark)
    assert summary.checkpoint.applied_seq == workload.pairs
    if limit_mb:
        assert len(summary.reports) > 1
    assert_target_equals_reference(config, tmp_path / "in")
    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]
    assert [r["cycle_id"] for r in reports] == list(range(1, len(reports) + 1))
    assert sorted(s for r in reports for s in r["seqs"]) == list(range(1, workload.pairs + 1))
    times = [dt.datetime.fromisoformat(t) for r in reports for t in (r["started_at"], r["ended_at"])]
    assert times == sorted(times) and all(t.utcoffset() == dt.timedelta(0) for t in times)  # UTC, cycle after cycle
    if buffer <= 2048:
        assert any(r["spill_created"] for r in reports), "a tiny buffer must spill"
    if target_settings:  # PostgreSQL: tables load in batches of at most apply.threads connections
        batches = [b for r in reports for b in r["load_batches"]]
        assert batches and all(1 <= len(b) <= config.apply.threads for b in batches)
        assert {t for b in batches for t in b} == {t for r in reports for t in r["net_rows"]}
    created = [s["file"] for r in reports for s in r["spill_created"]]
    removed = [s["file"] for r in reports for s in r["spill_removed"]]
    assert set(removed) <= set(created)
    assert not list(config.spill_dir.glob("*.spill")), "no spill file outlives the run"


def test_a_run_limited_in_cycles_resumes_where_it_stopped(
    tmp_path: Path, spark: Any, target_settings: list[str]
) -> None:
    workload = generate_workload(tmp_path / "in", seed=5, transactions=200, file_size_mb=0.04, profile="demo")
    config = make_config(
        tmp_path,
        tmp_path / "in",
        target_settings,
        process_intermediate_size_per_job=0.05,
        buffer_size_for_split_records=1024,
    )
    first = run(config, spark, max_cycles=2)
    assert len(first.reports) == 2
    stopped = CheckpointStore(config.work_dir).load()
    assert stopped.cycle_id == 2 and stopped.applied_seq < workload.pairs
    assert_target_equals_reference(config, tmp_path / "in", through_seq=stopped.applied_seq)
    rest = run(config, spark)
    assert rest.reports[0].cycle_id == 3
    assert rest.checkpoint.applied_seq == workload.pairs
    assert_target_equals_reference(config, tmp_path / "in")
    again = run(config, spark)
    assert again.reports == [], "caught up: nothing to do"


@pytest.mark.parametrize("compile_setting", ["small groups", "log order"])
def test_groups_and_log_order_apply_the_same_rows_as_one_compiled_cycle(
    tmp_path: Path, spark: Any, target_settings: list[str], compile_setting: str
) -> None:
    generate_workload(tmp_path / "in", seed=6, transactions=120, file_size_mb=0.04, profile="demo")
    limits = {"compile_max_cmds": 40} if compile_setting == "small groups" else {"compile": "false"}
    config = make_config(tmp_path, tmp_path / "in", target_settings, **limits)
    summary = run(config, spark)
    assert_target_equals_reference(config, tmp_path / "in")
    assert [r.collisions for r in summary.reports if r.collisions] == [], "a faithful log never collides"
    groups = [g for r in summary.reports for g in r.groups]
    modes = {g["mode"] for g in groups}
    if compile_setting == "small groups":
        assert {"compiled", "log order"} <= modes
        assert all(g["commands"] <= 40 for g in groups if g["mode"] == "compiled")
        assert any(g.get("reason") == "it truncates a table" for g in groups)
        # Delta commits table by table whatever the parts: a cycle's groups go as one commit per table.
        # PostgreSQL commits a part across its tables at once: group by group, truncates in log order.
        together = {g.get("applied") == "together" for g in groups}
        assert together == ({True} if not target_settings else {False}), groups
        if not target_settings:
            commits = {log.parent.name: len(DeltaTable(str(log.parent)).history()) for log in tables(config)}
            assert len(commits) == 6 and max(commits.values()) <= len(summary.reports), commits
    else:
        assert modes == {"log order"} and len(groups) == summary.committed
        assert {g["reason"] for g in groups} == {"apply.compile is off"}


def test_groups_cut_by_size_count_every_image_wherever_it_was_measured(
    tmp_path: Path, spark: Any, target_settings: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delta's compile job measures the images the groups' estimates need; PostgreSQL's driver measures them first.

    Both cut the groups the driver's own measure gives (the images deciding
    them), and on Delta the driver reads no image to measure it.
    """
    generate_workload(tmp_path / "in", seed=7, transactions=120, file_size_mb=0.04, profile="demo")
    refs = list(list_pairs(tmp_path / "in").pairs)
    validator = StreamValidator()
    measured = read_cycle(refs, validator, defer_images=True)
    tables = validator.state.tables
    order = commit_order(measured.commits)
    quarter = sum(t.cdb_bytes for t in txn_shapes(measured, {}, tables, order)) // 4
    config = make_config(tmp_path, tmp_path / "in", target_settings, cdb_max_size_mb=quarter / 1024 / 1024)
    limits = GroupLimits(config.apply.compile, config.apply.compile_max_cmds, int(quarter / 1024 / 1024 * 1024 * 1024))
    expected = form_groups(txn_shapes(measured, {}, tables, order), limits)
    unmeasured = replace(measured, longest_image={})  # the images decide the cuts
    assert shape(form_groups(txn_shapes(unmeasured, {}, tables, order), limits)) != shape(expected)
    if not target_settings:

        def no_driver_measure(path: Path) -> None:
            raise AssertionError(f"the driver measured {path}")

        monkeypatch.setattr("applier.engine.reading.longest_images_in", no_driver_measure)
        monkeypatch.setattr("applier.engine.measuring.longest_images_in", no_driver_measure)

    summary = run(config, spark)

    assert len(summary.reports) == 1
    assert shape_of_report(summary.reports[0].groups) == shape(expected)
    assert_target_equals_reference(config, tmp_path / "in")


def shape(groups: list[Group]) -> list[tuple[int, int, int, str]]:
    return [(len(g.txns), g.commands, g.cdb_bytes, g.mode) for g in groups]


def shape_of_report(groups: list[dict[str, Any]]) -> list[tuple[int, int, int, str]]:
    return [(g["transactions"], g["commands"], g["cdb_bytes"], g["mode"]) for g in groups if g["mode"] != "together"]


def tables(config: Any) -> list[Path]:
    """The ``_delta_log`` folders of the Delta tables under the target's root."""
    return sorted(config.target.path.glob("*/*/_delta_log"))
