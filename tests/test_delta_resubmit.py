"""``applier exceptions resubmit ID`` on Delta: refused again it changes nothing; fixed, it applies once.

The set-aside transaction touches two tables: ``shop.events`` (no key, so a
second apply would show as duplicate rows) and ``shop.items``, whose CHECK
constraint refused it. Delta commits each table on its own, so an
interrupted resubmission is re-run and must skip the table that holds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from applier.cli import main
from applier.config import Config
from applier.engine.runlock import RunLock
from applier.targets import delta_resubmit
from applier.targets.delta import DeltaTarget
from applier.targets.delta_log import (
    PathAnswer,
    commit_tags,
    cycle_on_path,
    resubmission_on_path,
    resubmission_tags,
    tagged_resubmission,
)
from engine_support import make_config, run
from handmade import event, row, write_pair

ITEMS = {
    "columns": [
        {"name": "id", "type": "bigint", "nullable": False},
        {"name": "qty", "type": "int", "nullable": True},
    ],
    "primary_key": ["id"],
}
EVENTS = {
    "columns": [
        {"name": "item_id", "type": "bigint", "nullable": True},
        {"name": "note", "type": "string", "nullable": True},
    ],
    "primary_key": [],
}
TABLES = {"shop.items": ITEMS, "shop.events": EVENTS}


def write_transactions(directory: Path, seq: int, transactions: dict[str, list[tuple[int, int, str]]]) -> None:
    """Pair ``seq``: each transaction upserts items ``(id, qty)`` and adds an event ``(id, note)`` per item."""
    lsn = seq * 1000
    rows, events = [], []
    for xid, items in transactions.items():
        events.append(event("begin", xid, lsn))
        for ident, qty, note in items:
            rows.append(row(lsn + 1, xid, "I", after={"id": ident, "qty": qty}, table="shop.items"))
            rows.append(row(lsn + 2, xid, "I", after={"item_id": ident, "note": note}, table="shop.events"))
            lsn += 2
        events.append(event("commit", xid, lsn + 1))
        lsn += 2
    write_pair(directory, seq, rows, events, tables=TABLES)


def set_aside_one_transaction(tmp_path: Path, spark: Any) -> tuple[Config, Path]:
    """Apply x1 and x3 while x2 (items 3 and 4, item 3 with a negative qty) is logged; the CLI's settings file."""
    pairs = tmp_path / "pairs"
    write_transactions(pairs, 1, {"x0": [(1, 1, "made")]})
    config = make_config(tmp_path, pairs, ["errors.actions.check=log"], compile_retry_threshold=100)
    run(config, spark)
    items(config).alter.add_constraint({"qty_not_negative": "qty >= 0"})
    write_transactions(
        pairs,
        2,
        {"x1": [(2, 2, "made")], "x2": [(3, -1, "made"), (4, 4, "made")], "x3": [(5, 5, "made")]},
    )
    summary = run(config, spark)
    assert [e["xid"] for e in summary.reports[-1].exceptions] == ["x2"]
    assert content(config) == ({1: 1, 2: 2, 5: 5}, [(1, "made"), (2, "made"), (5, "made")])
    settings = tmp_path / "applier.yaml"
    settings.write_text(
        f"configuration_name: test_cfg\nintermediate_dir: {pairs}\noutput_dir: {tmp_path / 'out'}\n"
        f"target:\n  type: delta\n  path: {tmp_path / 'target'}\n"
    )
    return config, settings


def items(config: Config) -> DeltaTable:
    return DeltaTable(str(config.target.path / "shop" / "items"))


def events(config: Config) -> DeltaTable:
    return DeltaTable(str(config.target.path / "shop" / "events"))


def content(config: Config) -> tuple[dict[int, int], list[tuple[int, str]]]:
    """Items as id -> qty; every event row, sorted (duplicates kept)."""
    item_rows = items(config).to_pyarrow_table().to_pylist()
    event_rows = events(config).to_pyarrow_table().to_pylist()
    return {r["id"]: r["qty"] for r in item_rows}, sorted((r["item_id"], r["note"]) for r in event_rows)


def versions(config: Config) -> tuple[int, int, int]:
    store = DeltaTable(str(config.target.path / "_applier" / "test_cfg_exceptions"))
    return items(config).version(), events(config).version(), store.version()


def resubmission_commits(table: DeltaTable) -> list[int]:
    return [x for x in (tagged_resubmission(e, "test_cfg") for e in table.history()) if x is not None]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(list(argv)) == 0
    return capsys.readouterr().out.splitlines()


RESUBMITTED = {1: 1, 2: 2, 3: -1, 4: 4, 5: 5}, [(1, "made"), (2, "made"), (3, "made"), (4, "made"), (5, "made")]


@pytest.mark.spark
def test_resubmitting_on_delta_refused_changes_nothing_then_fixed_applies_once_and_a_second_exits_2(
    tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config, settings = set_aside_one_transaction(tmp_path, spark)
    (kept,) = DeltaTarget(config.target.path, config.configuration_name).exceptions()
    ident, before = str(kept["id"]), versions(config)
    target = DeltaTarget(config.target.path, config.configuration_name)
    held = target.committed_cycles(["shop.items", "shop.events"])

    # Refused again: the check runs before any commit, so no table and not the record moves.
    assert main(["exceptions", "resubmit", ident, "--config", str(settings)]) == 4
    assert "qty_not_negative" in capsys.readouterr().err
    assert versions(config) == before and content(config)[1] == [(1, "made"), (2, "made"), (5, "made")]

    # A run (or another resubmission) holding the configuration's run lock refuses it.
    items(config).alter.drop_constraint("qty_not_negative")
    with RunLock(config.work_dir, config.configuration_name):
        assert main(["exceptions", "resubmit", ident, "--config", str(settings)]) == 6
    capsys.readouterr()

    assert cli(capsys, "exceptions", "resubmit", ident, "--config", str(settings)) == [
        f"exception {ident}: transaction x2 applied (4 changes to shop.events, shop.items)"
    ]
    assert content(config) == RESUBMITTED
    assert resubmission_commits(items(config)) == resubmission_commits(events(config)) == [kept["id"]]
    assert main(["exceptions", "resubmit", ident, "--config", str(settings)]) == 2
    assert f"exception {ident} was resubmitted at" in capsys.readouterr().err
    assert content(config) == RESUBMITTED
    assert "resubmitted" in cli(capsys, "exceptions", "list", "--config", str(settings))[0]

    # The resubmission moved no cycle: the next run applies its cycle over it, to the same keys.
    assert target.committed_cycles(["shop.items", "shop.events"]) == held
    write_transactions(tmp_path / "pairs", 3, {"x4": [(3, 30, "changed")]})
    assert run(config, spark).cycles_run == 1
    changed = content(config)
    assert changed[0] == {**RESUBMITTED[0], 3: 30} and changed[1] == sorted([*RESUBMITTED[1], (3, "changed")])


class Crash(BaseException):  # the process dies: no handler, main()'s included, catches it
    """A crash of the command between two commits."""


@pytest.mark.spark
def test_an_interrupted_delta_resubmission_re_run_leaves_each_table_holding_the_transaction_once(
    tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, settings = set_aside_one_transaction(tmp_path, spark)
    (kept,) = DeltaTarget(config.target.path, config.configuration_name).exceptions()
    ident = str(kept["id"])
    items(config).alter.drop_constraint("qty_not_negative")
    real_commit = delta_resubmit.commit_table

    def commit_then_crash(*args: Any) -> None:
        real_commit(*args)
        raise Crash

    # Crash right after the first table (shop.events, in name order) committed.
    monkeypatch.setattr(delta_resubmit, "commit_table", commit_then_crash)
    with pytest.raises(Crash):
        main(["exceptions", "resubmit", ident, "--config", str(settings)])
    monkeypatch.undo()
    assert content(config) == ({1: 1, 2: 2, 5: 5}, RESUBMITTED[1])
    assert resubmission_commits(events(config)) == [kept["id"]] and resubmission_commits(items(config)) == []

    # Re-run, crashing after the last table and before the mark: shop.events is skipped, shop.items committed.
    def crash(*args: Any) -> bool:
        raise Crash

    monkeypatch.setattr(delta_resubmit, "mark", crash)
    with pytest.raises(Crash):
        main(["exceptions", "resubmit", ident, "--config", str(settings)])
    monkeypatch.undo()
    assert content(config) == RESUBMITTED
    assert DeltaTarget(config.target.path, config.configuration_name).exceptions()[0]["resubmitted_at"] is None

    # Re-run: both tables hold it, so only the mark is written; then it is done.
    before = versions(config)
    assert cli(capsys, "exceptions", "resubmit", ident, "--config", str(settings))[0].startswith(f"exception {ident}:")
    assert versions(config) == (before[0], before[1], before[2] + 1)
    assert content(config) == RESUBMITTED
    assert resubmission_commits(items(config)) == resubmission_commits(events(config)) == [kept["id"]]
    assert main(["exceptions", "resubmit", ident, "--config", str(settings)]) == 2


def _entry(operation: str, tags: dict[str, str] | None = None, **params: str) -> dict[str, Any]:
    return {"operation": operation, "operationParameters": params, **(tags or {})}


def test_the_history_walk_passes_resubmissions_and_finds_one_only_along_the_tables_state() -> None:
    history = {
        0: _entry("CREATE TABLE"),
        1: _entry("WRITE", commit_tags("cfg", 1)),
        2: _entry("MERGE", resubmission_tags("cfg", 7)),
        3: _entry("MERGE", commit_tags("cfg", 2, through=5)),
        4: _entry("MERGE", resubmission_tags("cfg", 8)),
    }
    assert cycle_on_path(history, 4, "cfg", complete=True) == PathAnswer(2, 3), "a resubmission moves no cycle"
    assert cycle_on_path(history, 2, "cfg", complete=True) == PathAnswer(1, 1)
    assert resubmission_on_path(history, 4, "cfg", 7) is True
    assert resubmission_on_path(history, 4, "cfg", 9) is False
    assert resubmission_on_path(history, 4, "other", 7) is False, "another configuration's resubmission"
    restored = {**history, 5: _entry("RESTORE", version="1")}
    assert resubmission_on_path(restored, 5, "cfg", 7) is False, "the restore undid it"
    assert resubmission_on_path({k: v for k, v in history.items() if k >= 3}, 4, "cfg", 7) is None, "log cleaned"
