"""A table's upkeep as a run goes on.

Small files are compacted: a table's files stay few, its rows and its held
cycle unchanged. The tables the Applier creates are checkpointed every 10
commits (Delta Lake's default), so an open reads few commits.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from applier.config import load_config
from applier.errors import ConfigError
from applier.targets import delta_compact
from applier.targets.delta import DeltaTarget
from test_delta_target import counted, keyed, rows_of, table_def

APP = "demo"
EVENTS = table_def("app.events", [("what", "string", True), ("n", "bigint", True)])
ITEMS = table_def("app.items", [("id", "bigint", False), ("note", "string", True)], ("id",))


def files(target: DeltaTarget, name: str) -> int:
    return len(DeltaTable(str(target.table_path(name))).file_uris())


def operations(target: DeltaTarget, name: str) -> list[str]:
    return [entry["operation"] for entry in reversed(DeltaTable(str(target.table_path(name))).history())]


def append(target: DeltaTarget, cycle: int) -> None:
    target.apply(cycle, counted(EVENTS, [({"what": f"e{cycle}", "n": cycle}, 1)]))


def test_a_keyless_table_appended_every_cycle_keeps_few_files_and_every_row(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP, compact_min_files=4)
    for cycle in range(1, 11):
        append(target, cycle)
    # Ten appends, each a file; every fourth small file compacts them into one.
    assert files(target, "app.events") < 4
    assert operations(target, "app.events").count("OPTIMIZE") == 3
    assert rows_of(target, "app.events") == sorted(({"what": f"e{i}", "n": i} for i in range(1, 11)), key=repr)
    # The OPTIMIZE commits change no row: the held cycle is the last data commit's, and it is not applied twice.
    assert target.committed_cycle("app.events") == 10
    before = DeltaTable(str(target.table_path("app.events"))).version()
    append(target, 10)
    assert DeltaTable(str(target.table_path("app.events"))).version() == before
    assert len(rows_of(target, "app.events")) == 10


def test_a_keyed_table_whose_merges_insert_keeps_few_files_and_its_last_rows(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, APP, compact_min_files=3)
    for cycle in range(1, 9):  # each MERGE inserts a key, into a file of its own, and the last one updates key 1
        upserts = [{"id": cycle, "note": "new"}] + ([{"id": 1, "note": "last"}] if cycle == 8 else [])
        target.apply(cycle, keyed(ITEMS, upserts))
    assert files(target, "app.items") < 3
    assert "OPTIMIZE" in operations(target, "app.items")
    assert rows_of(target, "app.items") == sorted(
        [{"id": 1, "note": "last"}, *({"id": i, "note": "new"} for i in range(2, 9))], key=repr
    )
    assert target.committed_cycle("app.items") == 8


def test_no_compaction_when_turned_off_or_when_the_files_are_not_small(tmp_path: Path) -> None:
    off = DeltaTarget(tmp_path / "off", APP, compact_min_files=0)
    for cycle in range(1, 7):
        append(off, cycle)
    assert files(off, "app.events") == 6 and "OPTIMIZE" not in operations(off, "app.events")

    large = DeltaTarget(tmp_path / "large", APP, compact_min_files=2)
    append(large, 1)
    path = large.table_path("app.events")
    DeltaTable(str(path)).alter.set_table_properties({"delta.targetFileSize": "1"})  # no file is smaller
    assert delta_compact.small_files(DeltaTable(str(path))) == 0
    for cycle in range(2, 6):
        append(large, cycle)
    assert files(large, "app.events") == 5 and "OPTIMIZE" not in operations(large, "app.events")


def test_a_failing_compaction_is_a_warning_and_the_cycle_stays_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    target = DeltaTarget(tmp_path, APP, compact_min_files=2)
    append(target, 1)

    class Unwritable(DeltaTable):  # delta-rs failing to write (a full disk, a storage error): not to be made here
        @property
        def optimize(self) -> Any:
            raise OSError("No space left on device")

    monkeypatch.setattr(delta_compact, "DeltaTable", Unwritable)
    with caplog.at_level(logging.WARNING, logger="applier.targets.delta"):
        append(target, 2)
    assert "table app.events: compacting its small files failed, left for a later cycle" in caplog.text
    assert "No space left on device" in caplog.text
    assert target.committed_cycle("app.events") == 2 and files(target, "app.events") == 2
    monkeypatch.undo()
    append(target, 3)  # the next cycle compacts what was left
    assert files(target, "app.events") == 1 and len(rows_of(target, "app.events")) == 3


def test_the_setting_defaults_to_fifty_small_files_and_refuses_a_negative_count(tmp_path: Path) -> None:
    base = [f"configuration_name={APP}", f"intermediate_dir={tmp_path}", f"output_dir={tmp_path}"]
    base.append(f"target.path={tmp_path / 'target'}")
    assert load_config(None, base).target.compact_min_files == 50
    assert load_config(None, [*base, "target.compact_min_files=0"]).target.compact_min_files == 0
    with pytest.raises(ConfigError, match=r"target\.compact_min_files"):
        load_config(None, [*base, "target.compact_min_files=-1"])


def checkpoints(target: DeltaTarget, name: str) -> list[str]:
    return sorted(p.name for p in (target.table_path(name) / "_delta_log").glob("*.checkpoint.parquet"))


def test_the_tables_it_creates_are_checkpointed_every_ten_commits_and_a_found_table_keeps_its_own(
    tmp_path: Path,
) -> None:
    target = DeltaTarget(tmp_path, APP, compact_min_files=0)
    found = target.table_path("app.found")  # made by its owner before the Applier's first cycle, delta-rs's defaults
    DeltaTable.create(str(found), pa.schema([pa.field("id", pa.int64(), nullable=False), ("note", pa.string())]))
    found_def = table_def("app.found", [("id", "bigint", False), ("note", "string", True)], ("id",))
    target.apply(1, keyed(ITEMS, [], [{"id": 0}]))  # nothing to write: created empty
    for cycle in range(1, 13):
        append(target, cycle)  # created with its first rows, then appended to
        target.apply(cycle + 1, keyed(ITEMS, [{"id": cycle, "note": "n"}]))  # merged into
        target.apply(cycle, keyed(found_def, [{"id": cycle, "note": "n"}]))
    for name in ("app.events", "app.items"):
        table = DeltaTable(str(target.table_path(name)))
        assert table.metadata().configuration == {"delta.checkpointInterval": "10"}
        assert checkpoints(target, name) == [f"{9:020d}.checkpoint.parquet"], name  # at the tenth commit
    assert len(rows_of(target, "app.events")) == 12 and len(rows_of(target, "app.items")) == 12
    assert DeltaTable(str(found)).metadata().configuration == {} and checkpoints(target, "app.found") == []
