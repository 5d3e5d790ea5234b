"""The shaped workloads: ``wide`` (hundreds of wide tables) and ``many-open`` (thousands open at once).

Each stream is read back three ways: with the project's checking reader
(``scan_directory``, as ``applier check`` does), with the independent
reference applier, and with pyarrow and json alone (``read_stream`` of
``test_generate.py``), replayed here to show it is one a database could have
logged.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from applier.cli import main
from applier.generate import GenerateSummary, generate_workload
from applier.intermediate.scan import scan_directory
from applier.intermediate.schema import value_checker
from reference.applier import reference_apply
from test_generate import Change, Stream, read_stream
from test_generate import _committed as _committed
from test_generate import _last_defs as _defs

SPEC_TYPES = {"boolean", "int", "bigint", "double", "decimal", "string", "date", "timestamp", "binary"}
WIDE_TABLES, WIDE_COLUMNS = 300, (30, 40)
MANY_OPEN = 2_000


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[GenerateSummary, Stream]:
    directory = tmp_path_factory.mktemp("wide")
    summary = generate_workload(
        directory, profile="wide", seed=7, tables=WIDE_TABLES, columns=WIDE_COLUMNS, transactions=700, file_size_mb=1
    )
    return summary, read_stream(directory)


@pytest.fixture(scope="module")
def many_open(tmp_path_factory: pytest.TempPathFactory) -> tuple[GenerateSummary, Stream]:
    directory = tmp_path_factory.mktemp("many_open")
    summary = generate_workload(directory, profile="many-open", seed=5, transactions=MANY_OPEN, file_size_mb=0.12)
    return summary, read_stream(directory)


def _base(type_name: str) -> str:
    return type_name.split("(")[0]


# --- both profiles: the project's reader, the reference applier, a replay ---------------------


@pytest.mark.parametrize("shape", ["wide", "many_open"])
def test_the_projects_reader_accepts_every_pair(shape: str, request: pytest.FixtureRequest) -> None:
    summary, _ = request.getfixturevalue(shape)
    checked = scan_directory(summary.out_dir)
    assert (checked.pairs, checked.bytes, checked.rows) == (summary.pairs, summary.bytes, summary.rows)
    assert (checked.committed, checked.rolled_back) == (summary.committed, summary.rolled_back)
    assert len(checked.open_xids) == summary.left_open
    assert dict(checked.rows_by_table) == dict(summary.rows_per_table)


@pytest.mark.parametrize("shape", ["wide", "many_open"])
def test_the_reference_applier_applies_the_stream_and_agrees_with_a_replay(
    shape: str, request: pytest.FixtureRequest
) -> None:
    summary, stream = request.getfixturevalue(shape)
    tables = reference_apply(summary.out_dir)  # refuses an update or delete of a missing row, an existing key
    replayed = _replay(stream)
    assert set(tables) == set(summary.rows_per_table)
    assert {name: len(t.rows) for name, t in tables.items()} == replayed
    assert sum(replayed.values()) > 0


def _replay(stream: Stream) -> dict[str, int]:
    """Apply committed transactions in commit order, checking each change finds what it expects."""
    defs = _defs(stream)
    keyed: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {t: {} for t in defs}
    bags: dict[str, Counter[str]] = {t: Counter() for t in defs}
    for txn in _committed(stream):
        for c in txn.changes:
            where = f"{c.op} on {c.table} at lsn {c.lsn} in {c.xid}"
            key_columns = defs[c.table]["primary_key"]
            if c.op == "T":
                keyed[c.table].clear()
                bags[c.table].clear()
            elif not key_columns:
                _replay_keyless(bags[c.table], c, where)
            else:
                _replay_keyed(keyed[c.table], key_columns, c, where)
    return {t: len(keyed[t]) + sum(bags[t].values()) for t in defs}


def _replay_keyed(rows: dict[tuple[Any, ...], dict[str, Any]], key_columns: list[str], c: Change, where: str) -> None:
    if c.before is not None:
        key = tuple(c.before[k] for k in key_columns)
        current = rows.pop(key, None)
        assert current is not None, f"{where}: no row {key}"
        assert all(_same(current[n], v) for n, v in c.before.items()), f"{where}: before-image differs from the row"
    if c.after is not None:
        key = tuple(c.after[k] for k in key_columns)
        assert key not in rows, f"{where}: key {key} already exists"
        rows[key] = c.after


def _replay_keyless(bag: Counter[str], c: Change, where: str) -> None:
    if c.before is not None:
        value = json.dumps(c.before, sort_keys=True)
        assert bag[value] > 0, f"{where}: no such row"
        bag[value] -= 1
    if c.after is not None:
        bag[json.dumps(c.after, sort_keys=True)] += 1


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("shape", ["wide", "many_open"])
def test_no_key_is_changed_by_two_transactions_open_at_the_same_time(
    shape: str, request: pytest.FixtureRequest
) -> None:
    _, stream = request.getfixturevalue(shape)
    defs = _defs(stream)
    end_of_stream = stream.lsns[-1] + 1
    holders: dict[tuple[str, tuple[Any, ...]], list[tuple[int, int]]] = {}
    for txn in stream.txns.values():
        held: dict[tuple[str, tuple[Any, ...]], int] = {}
        for c in txn.changes:
            key_columns = defs[c.table]["primary_key"]
            for image in (c.before, c.after) if key_columns and c.op != "T" else ():
                if image is not None:
                    held.setdefault((c.table, tuple(image[k] for k in key_columns)), c.lsn)
        for lock, first in held.items():
            holders.setdefault(lock, []).append((first, txn.end or end_of_stream))
    for lock, spans in holders.items():
        spans.sort()
        assert all(b[0] > a[1] for a, b in itertools.pairwise(spans)), f"{lock} held by two at once"


@pytest.mark.parametrize("shape", ["wide", "many_open"])
def test_every_image_holds_its_tables_columns_with_values_of_their_type(
    shape: str, request: pytest.FixtureRequest
) -> None:
    _, stream = request.getfixturevalue(shape)
    checkers: dict[str, Any] = {}
    for c in stream.changes:
        definition = stream.defs[c.seq][c.table]
        columns = {col["name"]: col for col in definition["columns"]}
        if c.after is not None:
            assert list(c.after) == list(columns), f"after image of {c.table} at {c.lsn}"
        if c.before is not None and not definition["primary_key"]:
            assert list(c.before) == list(columns), f"keyless before image of {c.table} at {c.lsn}"
        for name, value in [*(c.before or {}).items(), *(c.after or {}).items()]:
            column = columns[name]
            if value is None:
                assert column["nullable"], f"{c.table}.{name} is not nullable"
                continue
            check = checkers.setdefault(column["type"], value_checker(column["type"]))
            assert check(value), f"{c.table}.{name}={value!r} is not a {column['type']}"


# --- wide ---------------------------------------------------------------------------------------


def test_wide_has_the_asked_tables_in_a_few_schemas_a_tenth_keyless(wide: tuple[GenerateSummary, Stream]) -> None:
    summary, stream = wide
    defs = _defs(stream)
    assert len(defs) == len(summary.rows_per_table) == WIDE_TABLES
    assert {name.split(".")[0] for name in defs} == {"app", "crm", "erp", "ops"}
    assert {name.split(".")[1] for name in defs} == {f"t{i:04d}" for i in range(1, WIDE_TABLES + 1)}
    assert all(WIDE_COLUMNS[0] <= len(d["columns"]) <= WIDE_COLUMNS[1] for d in defs.values())
    keys = [d["primary_key"] for d in defs.values()]
    assert sum(not k for k in keys) == WIDE_TABLES // 10
    assert sum(len(k) == 2 for k in keys) >= 10
    single = Counter(
        _base(_column(d, d["primary_key"][0])["type"]) for d in defs.values() if len(d["primary_key"]) == 1
    )
    assert set(single) == {"bigint", "int", "string"} and single["bigint"] > single["string"]
    nullable = [c["nullable"] for d in defs.values() for c in d["columns"]]
    assert 0.3 < sum(nullable) / len(nullable) < 0.7


def _column(definition: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in definition["columns"] if c["name"] == name)


def test_every_wide_table_mixes_every_spec_type(wide: tuple[GenerateSummary, Stream]) -> None:
    _, stream = wide
    defs = _defs(stream)
    for name, definition in defs.items():
        assert {_base(c["type"]) for c in definition["columns"]} == SPEC_TYPES, name
    decimals = {c["type"] for d in defs.values() for c in d["columns"] if c["type"].startswith("decimal")}
    assert len(decimals) >= 8 and "decimal(38,10)" in decimals


def test_wide_values_hold_the_edges_of_every_type(wide: tuple[GenerateSummary, Stream]) -> None:
    _, stream = wide
    defs = _defs(stream)
    seen: dict[str, set[Any]] = {t: set() for t in SPEC_TYPES}
    negative_zero = nulls = 0
    for c in stream.changes:
        types = {col["name"]: _base(col["type"]) for col in defs[c.table]["columns"]}
        for name, value in (c.after or {}).items():
            if value is None:
                nulls += 1
            elif types[name] == "double" and value == 0 and math.copysign(1.0, value) < 0:
                negative_zero += 1
            else:
                seen[types[name]].add(value)
    assert {"NaN", "Infinity", "-Infinity"} <= seen["double"] and negative_zero and nulls
    assert any(isinstance(v, float) and v != int(v) for v in seen["double"])
    assert "" in seen["string"] and "" in seen["binary"]
    assert any(not v.isascii() for v in seen["string"]) and max(map(len, seen["string"])) > 200
    assert any(not v.endswith("000Z") for v in seen["timestamp"])
    assert {2**31 - 1, -(2**31)} & seen["int"] and {2**63 - 1, -(2**63)} & seen["bigint"]  # the limits
    assert {True, False} <= seen["boolean"] and len(seen["date"]) > 100


def test_wide_changes_are_skewed_towards_a_few_hot_tables(wide: tuple[GenerateSummary, Stream]) -> None:
    summary, _ = wide
    counts = sorted(summary.rows_per_table.values(), reverse=True)
    assert sum(counts[: WIDE_TABLES // 20]) > 0.4 * summary.rows  # the hottest 5% take a large share
    assert counts[len(counts) // 2] < summary.rows / WIDE_TABLES  # the median table sees less than its even share
    assert min(counts) >= 2  # every table is loaded


def test_wide_has_every_kind_of_change(wide: tuple[GenerateSummary, Stream]) -> None:
    summary, stream = wide
    defs = _defs(stream)
    assert set(summary.rows_per_op) == {"I", "U", "D", "T"}
    kinds = {"key_move", "truncate", "truncate_keyless", "keyless_duplicate_delete", "rollback", "open_at_end"}
    assert kinds | {"long_transaction"} <= set(summary.features)
    assert {bool(defs[c.table]["primary_key"]) for c in stream.changes if c.op == "T"} == {True, False}
    moves = [
        c
        for c in stream.changes
        if c.op == "U" and defs[c.table]["primary_key"] and c.before is not None and c.after is not None
        and any(c.before[k] != c.after[k] for k in defs[c.table]["primary_key"])
    ]  # fmt: skip
    assert moves
    full_before = {c.table for c in stream.changes if c.op == "D" and defs[c.table]["primary_key"] and c.before
                   and len(c.before) == len(defs[c.table]["columns"])}  # fmt: skip
    key_only = {c.table for c in stream.changes if c.op == "D" and defs[c.table]["primary_key"] and c.before
                and len(c.before) == len(defs[c.table]["primary_key"])}  # fmt: skip
    assert full_before and key_only


def test_wide_keyless_tables_hold_duplicates_and_lose_one_copy_at_a_time(
    wide: tuple[GenerateSummary, Stream],
) -> None:
    _, stream = wide
    defs = _defs(stream)
    copies: Counter[tuple[str, str]] = Counter()
    duplicate_deletes = 0
    for txn in _committed(stream):
        for c in txn.changes:
            if defs[c.table]["primary_key"] or c.op == "T":
                continue
            if c.before is not None:
                value = (c.table, json.dumps(c.before, sort_keys=True))
                duplicate_deletes += c.op == "D" and copies[value] >= 2
                copies[value] -= 1
            if c.after is not None:
                copies[(c.table, json.dumps(c.after, sort_keys=True))] += 1
    assert max(copies.values()) >= 2 and duplicate_deletes >= 1


def test_wide_transactions_interleave_span_tables_and_pairs(wide: tuple[GenerateSummary, Stream]) -> None:
    summary, stream = wide
    txns = [t for t in stream.txns.values() if t.changes]
    assert max(len({c.table for c in t.changes}) for t in txns) >= 4
    assert sum(len(t.pairs) >= 2 for t in txns) >= 3  # open across a pair boundary
    begins = [t.begin for t in _committed(stream)]
    assert begins != sorted(begins)
    assert summary.pairs >= 3 and summary.left_open == 2


def test_wide_is_byte_identical_for_a_seed(tmp_path: Path) -> None:
    def files(directory: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}

    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        generate_workload(tmp_path / name, profile="wide", seed=seed, tables=40, transactions=60, file_size_mb=0.2)
    assert files(tmp_path / "a") == files(tmp_path / "b")
    assert files(tmp_path / "a")["000000000001.dat"] != files(tmp_path / "c")["000000000001.dat"]


# --- many-open ----------------------------------------------------------------------------------


def _events_per_pair(directory: Path) -> list[Counter[str]]:
    """For each pair in order, how many ``begin``, ``commit`` and ``rollback`` events its ``.trn`` holds."""
    out = []
    for trn in sorted(directory.glob("*.trn")):
        lines = trn.read_text(encoding="utf-8").splitlines()[1:]
        out.append(Counter(json.loads(line)["record"] for line in lines))
    return out


def test_many_open_keeps_thousands_open_across_many_pairs_and_ends_them_at_the_end(
    many_open: tuple[GenerateSummary, Stream],
) -> None:
    summary, _ = many_open
    events = _events_per_pair(summary.out_dir)
    open_after, now = [], 0
    for counts in events:
        now += counts["begin"] - counts["commit"] - counts["rollback"]
        open_after.append(now)
    assert 20 <= summary.pairs <= 30
    assert max(open_after) == MANY_OPEN
    assert sum(n == MANY_OPEN for n in open_after) >= 8  # all of them open together over many pairs
    ends = [c["commit"] + c["rollback"] for c in events]
    assert sum(ends[-2:]) == MANY_OPEN and open_after[-1] == 0
    assert summary.left_open == 0 and 0 < summary.rolled_back < MANY_OPEN // 10


def test_many_open_transactions_are_small_and_mixed(many_open: tuple[GenerateSummary, Stream]) -> None:
    summary, stream = many_open
    defs = _defs(stream)
    opened = sorted(stream.txns.values(), key=lambda t: t.begin)[-MANY_OPEN:]  # the initial load begins first
    assert all(20 <= len(t.changes) <= 30 for t in opened)
    sizes = [sum(len(json.dumps(c.before or "")) + len(json.dumps(c.after or "")) for c in t.changes) for t in opened]
    assert max(sizes) < 16 * 1024  # well under a 64 KB split buffer
    assert max(len(t.pairs) for t in opened) >= 5
    assert 4 <= len(defs) <= 8 and any(not d["primary_key"] for d in defs.values())
    assert {"I", "U", "D"} <= set(summary.rows_per_op)


# --- arguments ------------------------------------------------------------------------------------


def test_the_cli_lists_the_shaped_profiles_and_sizes_a_wide_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "--list-profiles", "--out", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert "wide: " in listed and "many-open: " in listed and "demo: " in listed
    argv = ["generate", "--out", str(tmp_path / "w"), "--profile", "wide", "--tables", "30", "--columns", "10-12"]
    assert main([*argv, "--transactions", "20"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("wrote ") and "profile wide" in out and "30 tables, the 10 busiest" in out
    assert all(10 <= len(d["columns"]) <= 12 for d in _defs(read_stream(tmp_path / "w")).values())


@pytest.mark.parametrize(
    "args",
    [
        ["--profile", "demo", "--tables", "5"],
        ["--profile", "many-open", "--columns", "5-9"],
        ["--profile", "wide", "--columns", "12-10"],
        ["--profile", "wide", "--columns", "ten"],
        ["--profile", "wide", "--tables", "0"],
    ],
)
def test_the_cli_refuses_sizing_a_profile_cannot_take_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert main(["generate", "--out", str(tmp_path), *args]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_generate_workload_refuses_sizing_for_profiles_that_do_not_take_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not take"):
        generate_workload(tmp_path, profile="demo", tables=10)
    with pytest.raises(ValueError, match="does not take"):
        generate_workload(tmp_path, profile="many-open", columns=(5, 9))
    with pytest.raises(ValueError, match="columns=2-9"):
        generate_workload(tmp_path, profile="wide", columns=(2, 9))


@pytest.mark.parametrize(("tables", "columns", "transactions"), [(1, (3, 3), 5), (2, (3, 4), 1), (3, (200, 300), 30)])
def test_wide_runs_at_the_edges_of_its_options(
    tmp_path: Path, tables: int, columns: tuple[int, int], transactions: int
) -> None:
    summary = generate_workload(
        tmp_path, profile="wide", seed=2, tables=tables, columns=columns, transactions=transactions
    )
    assert scan_directory(tmp_path).rows == summary.rows
    assert len(reference_apply(tmp_path)) == tables
