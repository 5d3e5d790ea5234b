"""applier extract against the real server: real decoding, one database, slot and publication per test.

Every test checks the pairs it wrote against the spec (``scan_directory``,
what ``applier check`` runs) before it looks at their rows.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from applier.cli import main
from applier.engine.runlock import RunLock
from applier.errors import ExtractError, RunLockedError
from applier.extract import extract, resume_point
from applier.extract.source import advance, readiness_problems, slot_state
from applier.intermediate.pairs import list_pairs
from extract_support import execute, extract_config, pair_rows, prepare, trn_events

pytestmark = pytest.mark.postgres
Source = tuple[str, str, str]

TYPES_TABLE = """CREATE TABLE public.every_type (
    id integer PRIMARY KEY, b boolean, s smallint, i integer, big bigint, r real, d double precision,
    n numeric(12,2), nu numeric, t text, v varchar(10), c char(4), u uuid, j json, jb jsonb,
    dt date, ts timestamp, tz timestamptz, by bytea)"""


def test_every_type_maps_to_its_spec_value(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, TYPES_TABLE)
    execute(
        config,
        "INSERT INTO every_type VALUES (1, true, -32768, 2147483647, -9223372036854775808, 1.1, 'NaN', -12.50, "
        "3.141592653589793238, 'é ☃', 'ten chars!', 'ab', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"a\": [1]}', "
        "'{\"b\": 2}', '2024-02-29', '2026-11-21 10:00:00.123456', '2026-11-21 12:00:00+02', '\\x00ff41')",
        "INSERT INTO every_type (id, d) VALUES (2, '-Infinity')",
    )
    extract(config)
    rows = pair_rows(config.intermediate_dir)
    assert [r["after"] for r in rows] == [
        {
            "id": 1, "b": True, "s": -32768, "i": 2147483647, "big": -9223372036854775808, "r": 1.100000023841858,
            "d": "NaN", "n": "-12.50", "nu": "3.141592653589793238", "t": "é ☃", "v": "ten chars!", "c": "ab  ",
            "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "j": '{"a": [1]}', "jb": '{"b": 2}', "dt": "2024-02-29",
            "ts": "2026-11-21T10:00:00.123456Z", "tz": "2026-11-21T10:00:00.000000Z", "by": "AP9B",
        },
        {"id": 2, "d": "-Infinity", **dict.fromkeys(("b", "s", "i", "big", "r", "n", "nu", "t", "v", "c", "u", "j",
                                                      "jb", "dt", "ts", "tz", "by"))},
    ]  # fmt: skip


def test_composite_key_updates_key_moves_and_deletes(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE lines (o int, l int, qty int, PRIMARY KEY (l, o))")
    execute(
        config,
        "INSERT INTO lines VALUES (1, 1, 5), (1, 2, 6)",
        "UPDATE lines SET qty = 7 WHERE o = 1 AND l = 1",
        "UPDATE lines SET l = 3 WHERE o = 1 AND l = 2",
        "DELETE FROM lines WHERE o = 1 AND l = 1",
    )
    extract(config)
    rows = [(r["op"], r["before"], r["after"]) for r in pair_rows(config.intermediate_dir)]
    assert rows[2:] == [
        ("U", {"l": 1, "o": 1}, {"o": 1, "l": 1, "qty": 7}),
        ("U", {"l": 2, "o": 1}, {"o": 1, "l": 3, "qty": 6}),
        ("D", {"l": 1, "o": 1}, None),
    ]


def test_keyless_duplicates_with_replica_identity_full(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE log (msg text, n int)", "ALTER TABLE log REPLICA IDENTITY FULL")
    execute(
        config,
        "INSERT INTO log VALUES ('x', 1), ('x', 1)",
        "DELETE FROM log WHERE ctid = (SELECT min(ctid) FROM log)",
        "UPDATE log SET n = 2",
    )
    extract(config)
    rows = [(r["op"], r["before"], r["after"]) for r in pair_rows(config.intermediate_dir)]
    assert rows == [
        ("I", None, {"msg": "x", "n": 1}),
        ("I", None, {"msg": "x", "n": 1}),
        ("D", {"msg": "x", "n": 1}, None),
        ("U", {"msg": "x", "n": 1}, {"msg": "x", "n": 2}),
    ]


def test_rolled_back_transaction_leaves_nothing(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY)")
    assert config.source.url
    with psycopg.connect(config.source.url) as conn:
        conn.execute("INSERT INTO t VALUES (1)")
        conn.rollback()
    execute(config, "INSERT INTO t VALUES (2)")
    extract(config)
    assert [r["after"] for r in pair_rows(config.intermediate_dir)] == [{"id": 2}]
    assert [e["record"] for e in trn_events(config.intermediate_dir)] == ["begin", "commit"]


def test_truncate_of_two_tables_is_one_row_each_in_one_transaction(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)")
    execute(config, "INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (1)", "TRUNCATE a, b")
    extract(config)
    truncates = [(r["table"], r["xid"]) for r in pair_rows(config.intermediate_dir) if r["op"] == "T"]
    assert sorted(t for t, _ in truncates) == ["public.a", "public.b"]
    assert len({xid for _, xid in truncates}) == 1


def test_transaction_larger_than_max_pair_mb_spans_pairs(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source, "extract.max_pair_mb=0.02")
    prepare(config, "CREATE TABLE big (id int PRIMARY KEY, pad text)")
    execute(config, "INSERT INTO big SELECT g, repeat('x', 100) FROM generate_series(1, 3000) g")
    summary = extract(config)
    assert summary.pairs >= 3
    events = trn_events(config.intermediate_dir)
    assert [(e["record"], e["seq"]) for e in events] == [("begin", 1), ("commit", summary.pairs)]
    assert len(pair_rows(config.intermediate_dir)) == 3000


def test_added_nullable_column_is_a_new_definition(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY)")
    execute(config, "INSERT INTO t VALUES (1)", "ALTER TABLE t ADD COLUMN note text", "INSERT INTO t VALUES (2, 'n')")
    extract(config)
    assert [r["after"] for r in pair_rows(config.intermediate_dir)] == [{"id": 1}, {"id": 2, "note": "n"}]


def test_column_type_change_stops_extraction_naming_the_table(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY, qty int)")
    execute(config, "INSERT INTO t VALUES (1, 1)", "ALTER TABLE t ALTER COLUMN qty TYPE bigint", "UPDATE t SET qty = 2")
    with pytest.raises(ExtractError, match=r"table public\.t: column qty changed from int to bigint"):
        extract(config)


def test_unmappable_value_is_refused_naming_table_column_and_value(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY, n numeric)")
    execute(config, "INSERT INTO t VALUES (1, 'NaN')")
    with pytest.raises(ExtractError, match=r"table public\.t, column n: value 'NaN'"):
        extract(config)


def test_unmappable_type_is_refused_naming_table_and_column(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY, at time)")
    execute(config, "INSERT INTO t VALUES (1, '10:00')")
    with pytest.raises(ExtractError, match=r"table public\.t, column at: type oid 1083 has no spec type"):
        extract(config)


def test_setup_warns_of_keyless_table_without_full_identity(tmp_path: Path, logical_source: Source) -> None:
    from applier.extract import setup_source

    config = extract_config(tmp_path, logical_source)
    execute(config, "CREATE TABLE log (msg text)")
    report = setup_source(config)
    assert report.publication_created and report.slot_created
    assert report.warnings == [
        "table public.log has no primary key: PostgreSQL refuses its updates and deletes while it is published, "
        "and they cannot be extracted; run ALTER TABLE public.log REPLICA IDENTITY FULL"
    ]
    assert not setup_source(config).slot_created  # idempotent
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="does not have a replica identity"):
        execute(config, "INSERT INTO log VALUES ('m')", "UPDATE log SET msg = 'n'")  # what the warning is about
    execute(config, "ALTER TABLE log REPLICA IDENTITY FULL", "UPDATE log SET msg = 'n'")
    assert setup_source(config).warnings == []


def test_setup_names_a_missing_replication_right(logical_source: Source) -> None:
    url, slot, _ = logical_source
    role = f"applier_norep_{slot[-12:]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")  # type: ignore[arg-type]
    try:
        with psycopg.connect(url, user=role, autocommit=True) as conn:
            assert readiness_problems(conn, slot) == [
                f"role {role} lacks the REPLICATION right: ALTER ROLE {role} REPLICATION"
            ]
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")  # type: ignore[arg-type]


def test_crash_after_pair_before_slot_advance_duplicates_nothing(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source, "extract.max_pair_mb=0.02")
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY, pad text)")
    execute(config, *(f"INSERT INTO t SELECT g, repeat('y', 100) FROM generate_series({k}, {k + 499}) g"
                      for k in range(1, 2001, 500)))  # fmt: skip

    assert config.source.url
    with psycopg.connect(config.source.url) as conn:
        confirmed_before = slot_state(conn, logical_source[1]).confirmed_flush

    def crash(position: int) -> None:
        raise RuntimeError("killed between the pair and the slot")

    with pytest.raises(RuntimeError, match="killed"):
        extract(config, advance=crash)
    # Pairs are in place up to the first that holds a commit; the slot has not moved.
    written = resume_point(config.intermediate_dir).next_seq - 1
    assert written >= 2
    assert config.source.url
    with psycopg.connect(config.source.url) as conn:
        state = slot_state(conn, logical_source[1])
    assert state.confirmed_flush == confirmed_before
    extract(config)
    ids = [r["after"]["id"] for r in pair_rows(config.intermediate_dir)]
    assert ids == list(range(1, 2001))
    assert [e["record"] for e in trn_events(config.intermediate_dir)] == ["begin", "commit"] * 4


def test_half_written_pair_is_ignored_and_written_again(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY)")
    execute(config, "INSERT INTO t VALUES (1)")
    pairs = config.intermediate_dir
    pairs.mkdir(parents=True)
    (pairs / ".000000000001.dat.tmp").write_bytes(b"half")
    (pairs / ".000000000001.trn.tmp").write_bytes(b"{")
    (pairs / "000000000001.dat").write_bytes(b"renamed, but its .trn never was")
    extract(config)
    assert [r["after"] for r in pair_rows(pairs)] == [{"id": 1}]
    assert sorted(p.name for p in pairs.iterdir()) == [
        ".extract.lock", ".extract.status.json", "000000000001.dat", "000000000001.trn"
    ]  # fmt: skip


def test_second_run_continues_after_the_first(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY)")
    execute(config, "INSERT INTO t VALUES (1)")
    extract(config)
    assert extract(config).pairs == 0  # nothing new: no pair
    execute(config, "INSERT INTO t VALUES (2)")
    assert extract(config).pairs == 1
    assert [r["after"] for r in pair_rows(config.intermediate_dir)] == [{"id": 1}, {"id": 2}]


def test_follow_delivers_a_pair_from_a_quiet_source(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source, "extract.max_pair_seconds=1")
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY)")
    execute(config, "INSERT INTO t VALUES (1)")
    started = time.monotonic()
    delivered: list[float] = []

    def stop() -> bool:
        if list_pairs(config.intermediate_dir).pairs and not delivered:
            delivered.append(time.monotonic() - started)
        return bool(delivered) or time.monotonic() - started > 20

    extract(config, follow=True, should_stop=stop)
    assert delivered, "no pair while following"
    assert [r["after"] for r in pair_rows(config.intermediate_dir)] == [{"id": 1}]


def test_cli_setup_then_extract_and_refusal_exit_code(
    tmp_path: Path, logical_source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    url, slot, publication = logical_source
    execute(extract_config(tmp_path, logical_source), "CREATE TABLE t (id int PRIMARY KEY, d date)")
    config_file = tmp_path / "extract.yaml"
    config_file.write_text(
        f"configuration_name: ext\nintermediate_dir: pairs\noutput_dir: out\ntarget:\n  path: target\n"
        f"source:\n  url: '{url}'\n  slot: {slot}\n  publication: {publication}\n  include: [public.t]\n"
    )
    assert main(["extract", "--config", str(config_file), "--setup"]) == 0
    assert f"publication {publication} created, slot {slot} created" in capsys.readouterr().out
    execute(extract_config(tmp_path, logical_source), "INSERT INTO t VALUES (1, '2026-01-01')")
    assert main(["extract", "--config", str(config_file)]) == 0
    assert "1 pairs written, 1 transactions, 1 rows" in capsys.readouterr().out
    assert main(["check", str(tmp_path / "pairs")]) == 0
    execute(extract_config(tmp_path, logical_source), "INSERT INTO t VALUES (2, 'infinity')")
    assert main(["extract", "--config", str(config_file)]) == 8
    err = capsys.readouterr().err
    assert err.startswith("applier: error: table public.t, column d: value 'infinity' cannot be extracted exactly")
    assert len(err.strip().splitlines()) == 1


def test_crash_right_after_each_slot_advance_loses_nothing(tmp_path: Path, logical_source: Source) -> None:
    """The reverse order cannot happen (the slot moves only once the pair is in place); a crash just after it."""
    config = extract_config(tmp_path, logical_source, "extract.max_pair_mb=0.01")
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY, pad text)")
    execute(config, *(f"INSERT INTO t SELECT g, repeat('z', 50) FROM generate_series({k}, {k + 99}) g"
                      for k in range(1, 1001, 100)))  # fmt: skip
    assert config.source.url
    seen: list[tuple[int, int]] = []

    def advance_then_crash(position: int) -> None:
        with psycopg.connect(config.source.url or "", autocommit=True) as conn:
            advance(conn, logical_source[1], position)
        in_place = resume_point(config.intermediate_dir)
        seen.append((position, in_place.next_seq))
        raise RuntimeError("killed after the slot moved")

    for _ in range(50):
        try:
            extract(config, advance=advance_then_crash)
            break
        except RuntimeError:
            continue
    assert len(seen) >= 5
    ids = [r["after"]["id"] for r in pair_rows(config.intermediate_dir)]
    assert ids == list(range(1, 1001))


def test_column_type_change_after_a_restart_is_refused_too(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY, qty int)")
    execute(config, "INSERT INTO t VALUES (1, 1)")
    extract(config)
    execute(config, "ALTER TABLE t ALTER COLUMN qty TYPE bigint", "UPDATE t SET qty = 2")
    with pytest.raises(ExtractError, match=r"table public\.t: column qty changed from int to bigint"):
        extract(config)


def test_batches_bounded_by_wal_size_continue_exactly(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY, pad text)")
    assert config.source.url
    with psycopg.connect(config.source.url, autocommit=True) as conn:
        long_one = psycopg.connect(config.source.url)  # open across many bounded batches, committed last
        long_one.execute("INSERT INTO t VALUES (0, 'long')")
        for k in range(1, 41):
            conn.execute(f"INSERT INTO t SELECT g, repeat('w', 200) FROM generate_series({k * 10}, {k * 10 + 9}) g")
        long_one.execute("UPDATE t SET pad = 'long, last' WHERE id = 0")
        long_one.commit()
        long_one.close()
        end = slot_state(conn, logical_source[1]).wal_end
    # Ten batches of 10 KiB of WAL each stop mid-stream (other databases' WAL counts too, so
    # they may not reach the end), then one batch to the end.
    reached = [extract(config, max_wal_mb=0.01).confirmed_lsn for _ in range(10)]
    assert reached == sorted(reached) and reached[0] < end
    extract(config)
    rows = pair_rows(config.intermediate_dir)
    assert sorted(r["after"]["id"] for r in rows if r["op"] == "I") == [0, *range(10, 410)]
    assert rows[-1]["op"] == "U" and rows[-1]["after"] == {"id": 0, "pad": "long, last"}


def test_second_extractor_on_one_folder_is_refused(tmp_path: Path, logical_source: Source) -> None:
    config = extract_config(tmp_path, logical_source)
    prepare(config, "CREATE TABLE t (id int PRIMARY KEY)")
    holder = RunLock(config.intermediate_dir, "ext", file_name=".extract.lock", activity="extracting into")
    with holder, pytest.raises(RunLockedError, match=r"another run is extracting into this configuration: the lock"):
        extract(config)
    assert RunLockedError.exit_code == 6


def test_a_chunk_is_read_in_one_snapshot_that_an_open_transaction_does_not_hold_up(logical_source: Source) -> None:
    """A nonatomic chunk's read (``select_settled``): one repeatable-read snapshot; a transaction still open is
    simply not in it, and the read does not wait for it (only a commit not yet visible is waited out)."""
    from applier.extract.source import relation, select_settled

    url = logical_source[0]
    with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url) as writer:
        conn.execute("CREATE TABLE public.chunked (id integer PRIMARY KEY, v text)")
        conn.execute("INSERT INTO public.chunked VALUES (1, 'a'), (2, 'b')")
        writer.execute("INSERT INTO public.chunked VALUES (3, 'c')")  # open: in progress for every snapshot
        writer.execute("UPDATE public.chunked SET v = 'z' WHERE id = 1")
        started = time.monotonic()
        rows = select_settled(conn, relation(conn, "public.chunked"), psycopg.sql.SQL("ORDER BY id"))
        assert rows == [("1", "a"), ("2", "b")]
        assert time.monotonic() - started < 5
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE and conn.isolation_level is None
        writer.commit()
        assert select_settled(conn, relation(conn, "public.chunked"), psycopg.sql.SQL("ORDER BY id")) == [
            ("1", "z"),
            ("2", "b"),
            ("3", "c"),
        ]
        conn.execute("DROP TABLE public.chunked")
