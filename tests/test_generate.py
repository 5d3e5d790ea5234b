"""The workload generator: every required case is in the stream, and the stream is one a database could log.

The pairs are read back here with pyarrow and json only, independently of the
project's reader, and checked against a small replay of the source database
written for this test.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from applier.generate import PROFILES, generate_workload
from applier.intermediate.schema import value_checker

SEEDS = (1, 2, 3)
SMALL_RUN = 200  # transactions; the special scenarios must all fit in this
NON_ASCII_TEXT = {
    "accent": lambda ch: 0xC0 <= ord(ch) <= 0x24F,
    "cjk": lambda ch: 0x4E00 <= ord(ch) <= 0x9FFF,
    "emoji": lambda ch: ord(ch) >= 0x1F300,
}


@dataclass
class Change:
    lsn: int
    seq: int
    xid: str
    table: str
    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@dataclass
class Txn:
    xid: str
    begin: int
    begin_seq: int
    end: int | None = None
    outcome: str | None = None
    changes: list[Change] = field(default_factory=list)

    @property
    def pairs(self) -> set[int]:
        return {c.seq for c in self.changes}


@dataclass
class Stream:
    """A generated stream as read back from disk."""

    changes: list[Change]
    txns: dict[str, Txn]
    defs: dict[int, dict[str, Any]]  # seq -> cdc.tables of that pair
    lsns: list[int]  # every row and event lsn, in file order
    times: list[str]  # event ts, in file order


def read_stream(directory: Path) -> Stream:
    """Read every pair of ``directory`` with pyarrow and json alone."""
    stream = Stream([], {}, {}, [], [])
    trn_files = sorted(directory.glob("*.trn"))
    assert [int(p.stem) for p in trn_files] == list(range(1, len(trn_files) + 1))
    for trn in trn_files:
        seq = int(trn.stem)
        header, *events = [json.loads(line) for line in trn.read_text(encoding="utf-8").splitlines()]
        assert header["record"] == "header" and header["seq"] == seq
        table = pq.read_table(trn.with_suffix(".dat"))
        stream.defs[seq] = json.loads(table.schema.metadata[b"cdc.tables"])
        rows = table.to_pylist()
        for row in rows:
            before = None if row["before"] is None else json.loads(row["before"])
            after = None if row["after"] is None else json.loads(row["after"])
            stream.changes.append(Change(row["lsn"], seq, row["xid"], row["table"], row["op"], before, after))
        _merge_events(stream, seq, events, rows)
    return stream


def _merge_events(stream: Stream, seq: int, events: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    items = sorted([(e["lsn"], "event", e) for e in events] + [(r["lsn"], "row", r) for r in rows], key=lambda x: x[0])
    changes = iter(stream.changes[len(stream.changes) - len(rows) :])
    for lsn, kind, item in items:
        stream.lsns.append(lsn)
        if kind == "row":
            change = next(changes)
            txn = stream.txns[change.xid]  # a row before its begin fails here
            assert txn.end is None, f"row after the end of {change.xid}"
            txn.changes.append(change)
        elif item["record"] == "begin":
            assert item["xid"] not in stream.txns, f"second begin of {item['xid']}"
            stream.txns[item["xid"]] = Txn(item["xid"], lsn, seq)
            stream.times.append(item["ts"])
        else:
            txn = stream.txns[item["xid"]]
            assert txn.end is None, f"second end of {item['xid']}"
            txn.end, txn.outcome = lsn, item["record"]
            stream.times.append(item["ts"])


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Stream]:
    out = {}
    for seed in SEEDS:
        directory = tmp_path_factory.mktemp(f"seed{seed}")
        generate_workload(directory, seed=seed, transactions=SMALL_RUN)
        out[seed] = read_stream(directory)
    return out


def _key(defs: dict[str, Any], table: str, image: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(image[c] for c in defs[table]["primary_key"])


def _last_defs(stream: Stream) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for seq in sorted(stream.defs):
        merged.update(stream.defs[seq])
    return merged


def _committed(stream: Stream) -> list[Txn]:
    return sorted((t for t in stream.txns.values() if t.outcome == "commit"), key=lambda t: t.end or 0)


# --- the stream follows the spec's ordering rules -------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_lsns_and_times_strictly_increase_over_the_whole_stream(streams: dict[int, Stream], seed: int) -> None:
    stream = streams[seed]
    assert all(a < b for a, b in zip(stream.lsns, stream.lsns[1:], strict=False))
    assert all(a < b for a, b in zip(stream.times, stream.times[1:], strict=False))
    for txn in stream.txns.values():
        assert txn.changes == [] or txn.begin < txn.changes[0].lsn
        assert txn.end is None or not txn.changes or txn.changes[-1].lsn < txn.end
        assert not txn.changes or txn.changes[0].seq == txn.begin_seq


@pytest.mark.parametrize("seed", SEEDS)
def test_every_image_carries_its_tables_columns_with_values_of_their_type(
    streams: dict[int, Stream], seed: int
) -> None:
    stream = streams[seed]
    checkers: dict[str, Any] = {}
    for change in stream.changes:
        definition = stream.defs[change.seq][change.table]
        columns = {c["name"]: c for c in definition["columns"]}
        if change.after is not None:
            assert list(change.after) == list(columns), f"after image of {change.table} at {change.lsn}"
        for image in (change.before, change.after):
            for name, value in (image or {}).items():
                column = columns[name]
                if value is None:
                    assert column["nullable"], f"{change.table}.{name} is not nullable"
                    continue
                check = checkers.setdefault(column["type"], value_checker(column["type"]))
                assert check(value), f"{change.table}.{name}={value!r} is not a {column['type']}"


# --- every required case is present ----------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_tables_cover_composite_keys_a_keyless_log_and_every_column_type(streams: dict[int, Stream], seed: int) -> None:
    stream = streams[seed]
    defs = _last_defs(stream)
    keys = {name: d["primary_key"] for name, d in defs.items()}
    assert len(defs) >= 5 and [] in keys.values() and any(len(k) == 2 for k in keys.values())
    seen: dict[str, Any] = {}
    for change in stream.changes:
        columns = {c["name"]: c["type"] for c in stream.defs[change.seq][change.table]["columns"]}
        for name, value in (change.after or {}).items():
            if value is not None:
                seen.setdefault(columns[name].split("(")[0], []).append(value)
    assert set(seen) == {"boolean", "int", "bigint", "double", "decimal", "string", "date", "timestamp", "binary"}
    assert {"NaN", "Infinity", "-Infinity"} <= {v for v in seen["double"] if isinstance(v, str)}
    assert any(isinstance(v, float) and math.isfinite(v) and v != int(v) for v in seen["double"])
    assert any(not v.endswith(".000000Z") for v in seen["timestamp"])
    assert {True, False} <= set(seen["boolean"])
    for script, is_script in NON_ASCII_TEXT.items():
        assert any(any(map(is_script, v)) for v in seen["string"]), f"no {script} text"


@pytest.mark.parametrize("seed", SEEDS)
def test_transactions_interleave_and_commit_out_of_begin_order(streams: dict[int, Stream], seed: int) -> None:
    stream = streams[seed]
    interleaved = 0
    for txn in stream.txns.values():
        if len(txn.changes) > 1:
            first, last = txn.changes[0].lsn, txn.changes[-1].lsn
            others = {c.xid for c in stream.changes if first < c.lsn < last and c.xid != txn.xid}
            interleaved += len(others) >= 2
    assert interleaved >= 10
    committed = _committed(stream)
    begins = [t.begin for t in committed]
    assert begins != sorted(begins)


@pytest.mark.parametrize("seed", SEEDS)
def test_long_transactions_span_three_pairs_and_commit_or_roll_back_after_thousands_of_rows(
    streams: dict[int, Stream], seed: int
) -> None:
    txns = streams[seed].txns.values()
    assert any(t.outcome == "commit" and len(t.pairs) >= 3 and len(t.changes) >= 1000 for t in txns)
    assert any(t.outcome == "rollback" and len(t.pairs) >= 3 and len(t.changes) >= 1000 for t in txns)


@pytest.mark.parametrize("seed", SEEDS)
def test_key_moves_and_repeated_changes_of_one_key_are_present(streams: dict[int, Stream], seed: int) -> None:
    stream = streams[seed]
    defs = _last_defs(stream)
    moves, same_txn_repeats, insert_delete, delete_insert = set(), 0, 0, 0
    updated_by: dict[tuple[str, tuple[Any, ...]], set[str]] = {}
    for txn in _committed(stream):
        ops: dict[tuple[str, tuple[Any, ...]], list[str]] = {}
        for c in txn.changes:
            if not defs[c.table]["primary_key"] or c.op == "T":
                continue
            key = _key(defs, c.table, c.before or c.after or {})
            if c.op == "U" and c.after is not None and _key(defs, c.table, c.after) != key:
                moves.add(len(defs[c.table]["primary_key"]))
            ops.setdefault((c.table, key), []).append(c.op)
            if c.op == "U":
                updated_by.setdefault((c.table, key), set()).add(txn.xid)
        histories = ["".join(o) for o in ops.values()]
        same_txn_repeats += any(h.count("U") >= 2 for h in histories)
        insert_delete += any(re.search("IU*D", h) for h in histories)
        delete_insert += any("DI" in h for h in histories)
    assert moves == {1, 2}, "key moves on a single and on a composite key"
    assert same_txn_repeats and insert_delete and delete_insert
    assert max(len(xids) for xids in updated_by.values()) >= 3


@pytest.mark.parametrize("seed", SEEDS)
def test_truncates_are_followed_by_inserts_into_the_emptied_table(streams: dict[int, Stream], seed: int) -> None:
    stream = streams[seed]
    truncates = [c for c in stream.changes if c.op == "T"]
    assert truncates and all(c.before is None and c.after is None for c in truncates)
    for t in truncates:
        assert any(c.lsn > t.lsn and c.table == t.table and c.op == "I" for c in stream.txns[t.xid].changes)


@pytest.mark.parametrize("seed", SEEDS)
def test_keyless_log_holds_duplicates_and_deletes_remove_one_copy(streams: dict[int, Stream], seed: int) -> None:
    stream = streams[seed]
    defs = _last_defs(stream)
    keyless = [name for name, d in defs.items() if not d["primary_key"]]
    copies: Counter[tuple[str, str]] = Counter()
    deletes_of_duplicates = 0
    for txn in _committed(stream):
        for c in txn.changes:
            if c.table not in keyless:
                continue
            if c.op in ("D", "U"):
                value = (c.table, json.dumps(c.before, sort_keys=True))
                deletes_of_duplicates += c.op == "D" and copies[value] >= 2
                copies[value] -= 1
            if c.op in ("I", "U"):
                copies[(c.table, json.dumps(c.after, sort_keys=True))] += 1
    assert max(copies.values()) >= 2
    assert deletes_of_duplicates >= 1


@pytest.mark.parametrize("seed", SEEDS)
def test_empty_open_and_schema_changing_transactions_are_present(streams: dict[int, Stream], seed: int) -> None:
    stream = streams[seed]
    txns = stream.txns.values()
    assert any(t.outcome == "commit" and not t.changes for t in txns)
    open_at_end = [t for t in txns if t.outcome is None]
    assert open_at_end and all(t.changes for t in open_at_end)
    customer_defs = [d["shop.customers"] for d in stream.defs.values() if "shop.customers" in d]
    columns = [[c["name"] for c in d["columns"]] for d in customer_defs]
    assert "phone" not in columns[0] and columns[-1] == [*columns[0], "phone"]
    assert any(c.after and c.after.get("phone") for c in stream.changes if c.table == "shop.customers")


# --- the stream is one a real database could have logged -------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_replaying_committed_transactions_in_commit_order_never_misses_a_row(
    streams: dict[int, Stream], seed: int
) -> None:
    stream = streams[seed]
    defs = _last_defs(stream)
    keyed: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {t: {} for t in defs}
    bag: Counter[tuple[str, str]] = Counter()
    for txn in _committed(stream):
        for c in txn.changes:
            where = f"{c.op} on {c.table} at lsn {c.lsn} in {c.xid}"
            if c.op == "T":
                keyed[c.table].clear()
            elif not defs[c.table]["primary_key"]:
                if c.before is not None:
                    value = (c.table, json.dumps(c.before, sort_keys=True))
                    assert bag[value] > 0, f"{where}: no such row"
                    bag[value] -= 1
                if c.after is not None:
                    bag[(c.table, json.dumps(c.after, sort_keys=True))] += 1
            else:
                _replay_keyed(keyed[c.table], defs, c, where)


def _replay_keyed(rows: dict[tuple[Any, ...], dict[str, Any]], defs: dict[str, Any], c: Change, where: str) -> None:
    if c.before is not None:
        key = _key(defs, c.table, c.before)
        assert key in rows, f"{where}: no row {key}"
        current = rows.pop(key)
        for name, value in c.before.items():  # a column added later reads as null
            assert current.get(name) == value, f"{where}: before-image {name}={value!r}, row has {current.get(name)!r}"
    if c.after is not None:
        key = _key(defs, c.table, c.after)
        assert key not in rows, f"{where}: key {key} already exists"
        rows[key] = c.after


def _spans(stream: Stream, lock_of: Any) -> dict[Any, dict[str, tuple[int, int]]]:
    """For each lock, each transaction's span from its first change under the lock to its end."""
    end_of_stream = stream.lsns[-1] + 1
    spans: dict[Any, dict[str, tuple[int, int]]] = {}
    for txn in stream.txns.values():
        for c in txn.changes:
            for lock in lock_of(c):
                spans.setdefault(lock, {}).setdefault(txn.xid, (c.lsn, txn.end or end_of_stream))
    return spans


def _overlapping(spans: list[tuple[int, int]]) -> bool:
    spans = sorted(spans)
    return any(start <= end for (_, end), (start, _) in itertools.pairwise(spans))


@pytest.mark.parametrize("seed", SEEDS)
def test_no_key_is_changed_by_two_transactions_open_at_the_same_time(streams: dict[int, Stream], seed: int) -> None:
    stream = streams[seed]
    defs = _last_defs(stream)

    def key_locks(c: Change) -> list[tuple[str, tuple[Any, ...]]]:
        if c.op == "T" or not defs[c.table]["primary_key"]:
            return []
        return [(c.table, _key(defs, c.table, i)) for i in (c.before, c.after) if i is not None]

    for lock, users in _spans(stream, key_locks).items():
        assert not _overlapping(list(users.values())), f"{lock} changed by two transactions open at the same time"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_truncating_transaction_has_its_table_to_itself(streams: dict[int, Stream], seed: int) -> None:
    stream = streams[seed]
    by_table = _spans(stream, lambda c: [c.table])
    truncators = {(c.table, c.xid) for c in stream.changes if c.op == "T"}
    for table, xid in truncators:
        mine = by_table[table][xid]
        for other, span in by_table[table].items():
            assert other == xid or not _overlapping([mine, span]), f"{other} uses {table} while {xid} truncates it"


# --- determinism and arguments ---------------------------------------------------------------


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_same_seed_gives_byte_identical_files_and_another_seed_different_ones(tmp_path: Path) -> None:
    first = generate_workload(tmp_path / "a", seed=11, transactions=120)
    generate_workload(tmp_path / "b", seed=11, transactions=120)
    generate_workload(tmp_path / "c", seed=12, transactions=120)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    other = _files(tmp_path / "c")
    assert all(other.get(name) != data for name, data in _files(tmp_path / "a").items() if name.endswith(".dat"))
    assert first.pairs == len(list((tmp_path / "a").glob("*.trn"))) and first.left_open == 3


def test_files_do_not_depend_on_the_process_hash_seed(tmp_path: Path) -> None:
    script = (
        "import sys, pathlib, applier.generate as g\n"
        "g.generate_workload(pathlib.Path(sys.argv[1]), seed=4, transactions=100)"
    )
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run([sys.executable, "-c", script, str(tmp_path / hash_seed)], env=env, check=True)
    assert _files(tmp_path / "1") == _files(tmp_path / "2")


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_runs_every_scenario_on_a_small_run(tmp_path: Path, name: str) -> None:
    seen = []
    summary = generate_workload(
        tmp_path, seed=5, transactions=150, file_size_mb=0.1, profile=name, progress=lambda d, t: seen.append((d, t))
    )
    profile = PROFILES[name]
    assert {"long_commit", "long_rollback", "key_move", "truncate", "open_at_end", "schema_change"} <= set(
        summary.features
    )
    begins = sum(p.read_text(encoding="utf-8").count('"record": "begin"') for p in tmp_path.glob("*.trn"))
    assert summary.transactions == begins == summary.committed + summary.rolled_back + summary.left_open
    assert summary.left_open == profile.open_at_end + profile.long_open
    assert summary.rows == sum(summary.rows_per_table.values()) == sum(summary.rows_per_op.values())
    assert seen[-1] == (150, 150) and all(d <= t for d, t in seen)


def test_unknown_profile_and_bad_sizes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'nope'.*demo.*bench"):
        generate_workload(tmp_path, profile="nope")
    with pytest.raises(ValueError, match="transactions=0"):
        generate_workload(tmp_path, transactions=0)
    with pytest.raises(ValueError, match="file_size_mb=-1"):
        generate_workload(tmp_path, file_size_mb=-1)
    generate_workload(tmp_path / "full", transactions=50)
    with pytest.raises(ValueError, match="already holds"):
        generate_workload(tmp_path / "full", transactions=50)
