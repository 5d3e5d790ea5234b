"""Materialization against a real PostgreSQL source: a table added to running replication, in each mode.

A writer keeps changing the table while it is copied. The pairs are then
replayed by the small reference below (commit order, a ``T`` empties the
table, an insert of a held key or an update of a missing one writes the row,
as the Applier's autocorrection does) and must equal the source. The
reference shares no code with the extractor or the Applier.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from applier.extract import extract
from applier.extract import run as run_module
from applier.extract.subscriptions import Registry
from applier.intermediate.pairs import list_pairs
from applier.intermediate.scan import scan_directory
from extract_support import execute, extract_config, prepare, trn_events

pytestmark = pytest.mark.postgres
Source = tuple[str, str, str]
ROWS = 6000


def replay(directory: Path, table: str, key: tuple[str, ...] = ("id",)) -> Counter[tuple[Any, ...]]:
    """The table as the pairs leave it: committed transactions in commit order, rows in lsn order."""
    scan_directory(directory)
    rows_of: dict[str, list[dict[str, Any]]] = {}
    commits: list[tuple[int, str]] = []
    for pair in list_pairs(directory).pairs:
        for row in pq.read_table(pair.dat_path).to_pylist():
            if row["table"] == table:
                rows_of.setdefault(row["xid"], []).append(row)
        for line in pair.trn_path.read_text().splitlines()[1:]:
            event = json.loads(line)
            if event["record"] == "commit":
                commits.append((event["lsn"], event["xid"]))
    state: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for _, xid in sorted(commits):
        for row in sorted(rows_of.get(xid, []), key=lambda r: r["lsn"]):
            before = json.loads(row["before"]) if row["before"] else None
            after = json.loads(row["after"]) if row["after"] else None
            if row["op"] == "T":
                state.clear()
            if before is not None:
                state.pop(tuple(before[k] for k in key), None)
            if after is not None:
                state[tuple(after[k] for k in key)] = tuple(after.values())
    return Counter(state.values())


def source_rows(url: str, table: str) -> Counter[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return Counter(tuple(r) for r in conn.execute(f"SELECT * FROM {table}"))  # type: ignore[arg-type]


@contextmanager
def writer(url: str, table: str) -> Iterator[list[Any]]:
    """A thread changing ``table`` in short transactions until the block ends; yields [its commit count, its xids]."""
    stop = threading.Event()
    done: list[Any] = [0, set()]

    def run() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            n = 0
            while not stop.is_set():
                n += 1
                with conn.transaction():
                    xid = conn.execute("SELECT pg_current_xact_id()::xid::text").fetchone()
                    conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", (n * 7 % ROWS + 1,))  # type: ignore[arg-type]
                    conn.execute(f"DELETE FROM {table} WHERE id = %s", (n * 13 % ROWS + 1,))  # type: ignore[arg-type]
                    conn.execute(
                        f"INSERT INTO {table} VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = 0",
                        (n * 13 % ROWS + 1, n),
                    )  # type: ignore[arg-type]
                    conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (ROWS + n, n))  # type: ignore[arg-type]
                done[1].add(xid[0] if xid else None)
                done[0] = n

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join()


def _setup(tmp_path: Path, source: Source, *settings: str) -> Any:
    config = extract_config(tmp_path, source, "source.include=public.base", *settings)
    prepare(
        config,
        "CREATE TABLE base (id int PRIMARY KEY, v int)",
        "CREATE TABLE t (id int PRIMARY KEY, v int)",
        f"INSERT INTO t SELECT g, g FROM generate_series(1, {ROWS}) g",
    )
    execute(config, "INSERT INTO base VALUES (1, 1)", "UPDATE t SET v = -1 WHERE id = 1")
    extract(config)  # replication runs; t is not in it yet
    return config


@pytest.mark.parametrize("mode", ["atomic", "incremental", "nonatomic"])
def test_a_table_copied_while_it_is_written_equals_the_source(
    tmp_path: Path, logical_source: Source, mode: str
) -> None:
    config = _setup(tmp_path, logical_source, "materialize.chunk_rows=1500", "extract.max_pair_mb=0.2")
    url = logical_source[0]
    with writer(url, "t") as commits:
        while commits[0] < 20:
            pass
        Registry(config.intermediate_dir).add("public.t", mode)
        extract(config)  # materializes while the writer goes on
        written_during = commits[0]
    extract(config)
    assert written_during > 20
    assert replay(config.intermediate_dir, "public.t") == source_rows(url, "t")

    sub = Registry(config.intermediate_dir).load()["public.t"]
    assert (sub.state, sub.recovering, sub.error) == ("activating", False, None)
    assert sub.activation_lsn is not None and sub.valid_lsn is not None and sub.valid_lsn >= sub.activation_lsn
    truncates = [r for r in _rows(config.intermediate_dir) if r["table"] == "public.t" and r["op"] == "T"]
    assert len(truncates) == 1  # the copy (or the nonatomic start) replaces what a target holds, once
    copy_xids = {r["xid"] for r in _rows(config.intermediate_dir) if r["table"] == "public.t" and r["before"] is None
                 and r["op"] == "I" and r["xid"] == truncates[0]["xid"]}  # fmt: skip
    if mode == "atomic":
        assert len(copy_xids) == 1 and _inserts_of(config.intermediate_dir, truncates[0]["xid"]) >= ROWS - 50
    autocorrected = _autocorrect_ranges(config.intermediate_dir)
    assert bool(autocorrected) == (mode == "nonatomic")
    if mode == "nonatomic":
        assert {name for ranges in autocorrected for name in ranges} == {"public.t"}
        ops: dict[str, set[str]] = {}
        sizes: Counter[str] = Counter()
        for r in _rows(config.intermediate_dir):
            if r["table"] == "public.t":
                ops.setdefault(r["xid"], set()).add(r["op"])
                sizes[r["xid"]] += 1
        # The chunks only insert what their window left. The writer's transactions update, delete and insert, but
        # may only insert (the row to update and the one to delete both gone): they are told apart by their xids.
        chunks = [xid for xid in sizes if ops[xid] == {"I"} and xid not in commits[1]]
        assert sub.copied_rows == sum(sizes[xid] for xid in chunks) > ROWS // 2


def _rows(directory: Path) -> list[dict[str, Any]]:
    return [row for pair in list_pairs(directory).pairs for row in pq.read_table(pair.dat_path).to_pylist()]


def _inserts_of(directory: Path, xid: str) -> int:
    return sum(1 for r in _rows(directory) if r["xid"] == xid and r["op"] == "I")


def _autocorrect_ranges(directory: Path) -> list[dict[str, Any]]:
    found = []
    for pair in list_pairs(directory).pairs:
        metadata = pq.read_metadata(pair.dat_path).metadata or {}
        if b"cdc.autocorrect" in metadata:
            found.append(json.loads(metadata[b"cdc.autocorrect"]))
    return found


def test_incremental_copy_is_one_transaction_per_chunk(tmp_path: Path, logical_source: Source) -> None:
    config = _setup(tmp_path, logical_source)
    Registry(config.intermediate_dir).add("public.t", "incremental", chunk_rows=1000)
    extract(config)
    chunks = Counter(r["xid"] for r in _rows(config.intermediate_dir) if r["table"] == "public.t" and r["op"] == "I")
    assert sorted(chunks.values()) == [1000] * (ROWS // 1000)
    assert replay(config.intermediate_dir, "public.t") == source_rows(logical_source[0], "t")


def test_a_crash_during_the_copy_rolls_it_back_and_copies_again(
    tmp_path: Path, logical_source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _setup(tmp_path, logical_source, "extract.max_pair_mb=0.05")
    Registry(config.intermediate_dir).add("public.t", "atomic")
    pairs: list[int] = []
    real = run_module._Extraction._pair_written

    def dies_after_two_pairs(self: Any, seq: int, size: int) -> None:
        pairs.append(seq)
        if len(pairs) == 3:  # the process dies mid-copy, two of its pairs in place
            raise KeyboardInterrupt
        real(self, seq, size)

    monkeypatch.setattr(run_module._Extraction, "_pair_written", dies_after_two_pairs)
    with pytest.raises(KeyboardInterrupt):
        extract(config)
    monkeypatch.undo()
    assert Registry(config.intermediate_dir).load()["public.t"].state == "materializing"
    execute(config, "UPDATE t SET v = 42 WHERE id < 10", "DELETE FROM t WHERE id = 20")
    extract(config)

    events = trn_events(config.intermediate_dir)
    rolled_back = [e["xid"] for e in events if e["record"] == "rollback"]
    assert len(rolled_back) == 1  # the cut copy: its rows are taken back
    assert replay(config.intermediate_dir, "public.t") == source_rows(logical_source[0], "t")
    sub = Registry(config.intermediate_dir).load()["public.t"]
    assert (sub.state, sub.recovering) == ("activating", False)


def test_lock_timeout_leaves_it_recovering_until_resumed(tmp_path: Path, logical_source: Source) -> None:
    config = _setup(tmp_path, logical_source, "materialize.lock_timeout_s=0.5")
    registry = Registry(config.intermediate_dir)
    registry.add("public.t", "atomic")
    with psycopg.connect(logical_source[0]) as holder:
        holder.execute("LOCK TABLE t IN ROW EXCLUSIVE MODE")  # an open writer
        extract(config)
        holder.rollback()
    sub = registry.load()["public.t"]
    assert sub.recovering and sub.error and "lock timeout" in sub.error
    extract(config)  # an error waits for --resume
    assert (registry.load()["public.t"].state, registry.load()["public.t"].recovering) == ("defined", True)
    registry.ask("public.t", resume=True)
    extract(config)
    assert registry.load()["public.t"].state == "activating"
    assert replay(config.intermediate_dir, "public.t") == source_rows(logical_source[0], "t")


def test_nonatomic_needs_a_key_and_says_so(tmp_path: Path, logical_source: Source) -> None:
    config = _setup(tmp_path, logical_source)
    execute(config, "CREATE TABLE bag (v int)", "ALTER TABLE bag REPLICA IDENTITY FULL")
    Registry(config.intermediate_dir).add("public.bag", "nonatomic")
    extract(config)
    sub = Registry(config.intermediate_dir).load()["public.bag"]
    assert (
        sub.recovering
        and sub.error == "table public.bag has no primary key: subscribe it in atomic or incremental mode"
    )


def test_drop_with_purge_truncates_then_leaves_the_table_out(tmp_path: Path, logical_source: Source) -> None:
    config = _setup(tmp_path, logical_source)
    registry = Registry(config.intermediate_dir)
    registry.add("public.t", "atomic")
    extract(config)
    execute(config, "UPDATE t SET v = 7 WHERE id = 2")
    registry.ask("public.t", drop="purge")
    extract(config)
    execute(config, "UPDATE t SET v = 8 WHERE id = 3")
    extract(config)
    assert registry.load()["public.t"].state == "dropped"
    assert replay(config.intermediate_dir, "public.t") == Counter()  # purged at the drop
    images = [json.loads(r["after"]) for r in _rows(config.intermediate_dir) if r["table"] == "public.t" and r["after"]]
    assert {"id": 2, "v": 7} in images and {"id": 3, "v": 8} not in images  # before the drop, and nothing after


def test_cli_subscribe_lists_and_refuses_with_exit_codes(
    tmp_path: Path, logical_source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    from applier.cli import main

    config = _setup(tmp_path, logical_source)
    execute(config, "CREATE TABLE bag (v int)", "ALTER TABLE bag REPLICA IDENTITY FULL")
    url, slot, publication = logical_source
    config_file = tmp_path / "c.yaml"
    config_file.write_text(
        f"configuration_name: ext\nintermediate_dir: {tmp_path / 'pairs'}\noutput_dir: {tmp_path / 'out'}\n"
        f"target:\n  path: {tmp_path / 'target'}\n"
        f"source:\n  url: '{url}'\n  slot: {slot}\n  publication: {publication}\n  include: [public.base]\n"
    )
    args = ["--config", str(config_file)]
    assert main(["subscribe", *args, "--table", "public.t", "--mode", "incremental", "--chunk-rows", "2500"]) == 0
    out = capsys.readouterr().out
    assert "subscription public.t (incremental) defined" in out and "public.t  incremental  activating" in out
    assert "6000 rows copied" in out
    assert main(["subscribe", *args, "--table", "public.t"]) == 2  # one subscription a table
    assert "has a subscription already (activating)" in capsys.readouterr().err
    assert main(["subscribe", *args, "--table", "public.bag", "--mode", "nonatomic"]) == 8
    assert "error: table public.bag has no primary key" in capsys.readouterr().out
    assert main(["subscriptions", *args, "--drop", "public.nope"]) == 2
    assert "table public.nope has no subscription" in capsys.readouterr().err
    assert main(["status", *args]) == 0
    status = capsys.readouterr().out
    assert "subscriptions: 2" in status and "  public.t (incremental): activating, 6000 rows copied" in status
    assert "  public.bag (nonatomic): defined, recovering, 0 rows copied: table public.bag has no primary key" in status
    assert main(["subscriptions", *args]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[:3] for line in listing] == [
        ["public.bag", "nonatomic", "defined recovering"],
        ["public.t", "incremental", "activating"],
    ]
