"""The data files the Delta target writes itself, against what delta-rs's own writer makes of the same rows."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from applier.errors import TargetError
from applier.targets.delta import DeltaTarget
from applier.targets.delta_parquet import NullInNotNull, create, file_slices
from test_delta_target import keyed, table_def

UTC = dt.UTC
APP = "demo"


def stats_of(path: Path) -> list[dict[str, Any]]:
    """Each data file's stats as its log's add actions hold them (read back from the JSON commits)."""
    found = []
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            add = json.loads(line).get("add")
            if add:
                found.append(json.loads(add["stats"]))
    return found


def sample() -> pa.Table:
    return pa.table({
        "id": pa.array([3, -7, 12], pa.int64()),
        "n": pa.array([None, 5, -2], pa.int32()),
        "name": pa.array(["b", None, "a é"]),
        "day": pa.array([dt.date(2020, 2, 29), dt.date(1970, 1, 1), None]),
        "at": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6789, tzinfo=UTC), dt.datetime(1, 1, 1, tzinfo=UTC), None],
                        pa.timestamp("us", tz="UTC")),
        "price": pa.array([None, None, None], pa.decimal128(10, 2)),
        "flag": pa.array([True, None, False]),
        "ratio": pa.array([0.5, float("nan"), None]),
        "b": pa.array([b"\x00", None, b""]),
    })  # fmt: skip


def test_a_create_matches_delta_rs_own_write_of_the_same_rows(tmp_path: Path) -> None:
    rows = sample()
    props = CommitProperties(app_transactions=[Transaction(APP, 7)], custom_metadata={"k": "v"})
    write_deltalake(str(tmp_path / "theirs"), rows, name="s.t")
    create(tmp_path / "ours", "s.t", rows, rows.schema, props)
    theirs, ours = DeltaTable(str(tmp_path / "theirs")), DeltaTable(str(tmp_path / "ours"))
    [their_stats], [our_stats] = stats_of(tmp_path / "theirs"), stats_of(tmp_path / "ours")

    # delta-rs counts no binary column's nulls
    assert our_stats == {"numRecords": 3, "nullCount": {**their_stats["nullCount"], "b": 1}}
    assert ours.schema() == theirs.schema() and ours.protocol() == theirs.protocol()
    assert ours.metadata().name == "s.t" and ours.version() == 0 and ours.transaction_version(APP) == 7
    assert ours.history(1)[0]["k"] == "v"
    back = ours.to_pyarrow_table()
    assert back.drop_columns(["ratio"]) == rows.drop_columns(["ratio"])
    assert str(back["ratio"].to_pylist()) == "[0.5, nan, None]"  # NaN is not equal to itself


def test_readers_that_skip_files_by_their_stats_find_every_row(tmp_path: Path) -> None:
    rows = sample()
    create(tmp_path, "s.t", rows, rows.schema, CommitProperties())
    write_deltalake(str(tmp_path), rows, mode="append")  # a file of delta-rs's own beside it, with its bounds
    dataset = DeltaTable(str(tmp_path)).to_pyarrow_dataset()  # its fragments carry what the files' stats allow
    for name in rows.column_names:
        for value in rows[name]:
            wanted = pc.field(name) == value if value.is_valid else pc.field(name).is_null()
            assert dataset.to_table(filter=wanted).num_rows == 2 * rows.filter(wanted).num_rows, (name, value)


def test_file_slices_cover_every_row_once_in_order() -> None:
    rows = pa.table({"id": pa.array(range(300_000), pa.int64())})  # 2.4 MB of Arrow data
    parts = list(file_slices(rows, file_bytes=1_000_000))
    assert len(parts) == 3 and pa.concat_tables(parts) == rows
    assert [p.num_rows for p in file_slices(rows, file_bytes=1)] == [65_536] * 4 + [300_000 - 4 * 65_536]
    assert [p.num_rows for p in file_slices(rows)] == [300_000] and list(file_slices(rows.slice(0, 0))) == []


def test_a_table_created_in_several_files_merges_into_the_right_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("applier.targets.delta_parquet.FILE_BYTES", 200_000)
    td = table_def("s.items", [("id", "bigint", False), ("label", "string", True)], ("id",))
    target = DeltaTarget(tmp_path, APP)
    target.apply(1, keyed(td, [{"id": i, "label": f"v{i}"} for i in range(150_000)]))
    path = target.table_path("s.items")
    assert [s["numRecords"] for s in stats_of(path)] == [65_536, 65_536, 150_000 - 2 * 65_536]
    assert DeltaTable(str(path)).transaction_version(APP) == 1

    # Keys at both ends and in the middle: a file skipped by wrong bounds would leave a row unchanged.
    target.apply(2, keyed(td, [{"id": i, "label": "new"} for i in (0, 70_000, 149_999)] + [{"id": -1, "label": "x"}],
                          [{"id": 1}, {"id": 140_000}]))  # fmt: skip
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    got = {r["id"]: r["label"] for r in rows}
    assert len(got) == len(rows)  # no key twice
    want = {i: f"v{i}" for i in range(150_000) if i not in (1, 140_000)}
    want.update({0: "new", 70_000: "new", 149_999: "new", -1: "x"})
    assert got == want


def test_a_null_in_a_not_null_column_refuses_the_create_and_leaves_nothing(tmp_path: Path) -> None:
    td = table_def("s.people", [("id", "bigint", False), ("name", "string", False)], ("id",))
    change = keyed(td, [{"id": 1, "name": "a"}, {"id": 2, "name": None}])
    target = DeltaTarget(tmp_path, APP)

    with pytest.raises(TargetError, match=r"table s\.people: applying cycle 3 failed: 1 rows have a null in NOT NULL "
                                          r"column 'name'$") as caught:  # fmt: skip
        target.apply(3, change)
    assert caught.value.error_class == "check" and isinstance(caught.value.__cause__, NullInNotNull)
    path = target.table_path("s.people")
    assert not DeltaTable.is_deltatable(str(path)) and not list(path.glob("*.parquet"))


def test_a_failed_commit_removes_the_files_it_wrote(tmp_path: Path) -> None:
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    write_deltalake(str(tmp_path), rows)  # the table exists: a create must not commit over it
    before = set(tmp_path.glob("*.parquet"))
    props = CommitProperties(app_transactions=[Transaction(APP, 1)])
    with pytest.raises(Exception, match="already exists"):
        create(tmp_path, "s.t", rows, rows.schema, props)
    assert set(tmp_path.glob("*.parquet")) == before and DeltaTable(str(tmp_path)).version() == 0
