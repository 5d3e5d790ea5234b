"""Net-change helpers of applier.engine.changes that guard a target's writes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from applier.engine.changes import COUNT_COLUMN, expand_copies, filtered, repeated_keys


@pytest.mark.parametrize(
    ("ids", "repeated"),
    [
        ([1, 2, 3], 0),
        ([], 0),
        ([1, 2, 1, 3, 2, 1], 2),
        ([None, 1, None], 1),  # null equals null
        ([None, 1, 2], 0),
    ],
)
def test_repeated_keys_counts_key_values_held_by_more_than_one_row(ids: list[int | None], repeated: int) -> None:
    rows = pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array(range(len(ids)), pa.int64())})
    assert repeated_keys(rows, ("id",)) == repeated


def test_repeated_keys_of_a_composite_key_compare_every_key_column() -> None:
    rows = pa.table({"a": [1, 1, 2, 2, 1], "b": ["x", "y", "x", "x", "x"], "v": [0, 1, 2, 3, 4]})
    assert repeated_keys(rows, ("a", "b")) == 2  # (1, x) twice, (2, x) twice
    assert repeated_keys(rows, ("a", "b", "v")) == 0


def test_copies_expand_by_their_counts_and_single_copies_are_the_rows_themselves() -> None:
    schema = pa.schema([pa.field("v", pa.string()), pa.field("n", pa.int64())])
    counted = pa.table({"v": ["a", "b", "c"], "n": [1, 2, 3], COUNT_COLUMN: pa.array([2, 0, 1], pa.int64())})
    assert expand_copies(counted, schema).to_pylist() == [{"v": "a", "n": 1}, {"v": "a", "n": 1}, {"v": "c", "n": 3}]
    once = pa.table({"v": ["a", "b"], "n": [1, 2], COUNT_COLUMN: pa.array([1, 1], pa.int64())})
    rows = expand_copies(once, schema)
    assert rows.to_pylist() == [{"v": "a", "n": 1}, {"v": "b", "n": 2}] and rows.column_names == ["v", "n"]
    assert rows.column("v").chunks[0].buffers()[2].address == once.column("v").chunks[0].buffers()[2].address


def test_a_filter_keeping_every_row_gives_the_rows_themselves_and_any_other_filters() -> None:
    rows = pa.table({"v": ["a", "b", "c"]})
    assert filtered(rows, pa.chunked_array([[True, True, True]])) is rows
    column = rows.column("v")
    assert filtered(column, pa.chunked_array([[True, True, True]])) is column
    assert filtered(rows, pa.chunked_array([[True, False, True]])).column("v").to_pylist() == ["a", "c"]
    assert filtered(rows, pa.chunked_array([[True, None, True]])).column("v").to_pylist() == ["a", "c"]  # null drops
