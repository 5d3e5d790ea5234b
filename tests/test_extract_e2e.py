"""The key end-to-end check: a PostgreSQL source extracted, applied, and compared table by table.

A SQL script covers every mapped type, a composite key with key moves, keyless
duplicates under REPLICA IDENTITY FULL, a long transaction spanning pairs, a
rolled-back transaction, a savepoint rolled back, a truncate of two tables and
an added column; pgbench then runs its TPC-B-like load for a few seconds. The extractor runs twice (once mid-way),
``applier run`` applies the pairs to a Delta and to a PostgreSQL target, and
each source table's row set equals its target's. Under pgbench, the extractor
and then the Applier are SIGKILLed at random moments; nothing is lost or
applied twice.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from applier.engine.api import run_applier
from applier.extract import extract, resume_point
from applier.intermediate.scan import scan_directory
from extract_support import delta_row_set, execute, extract_config, pg_row_set, prepare

pytestmark = [pytest.mark.postgres, pytest.mark.spark, pytest.mark.slow]

SCRIPT_TABLES = (
    "CREATE TABLE every_type (id integer PRIMARY KEY, b boolean, s smallint, big bigint, r real, "
    "d double precision, n numeric(12,2), nu numeric, t text, v varchar(10), c char(4), u uuid, j jsonb, "
    "dt date, ts timestamp, tz timestamptz, by bytea)",
    "CREATE TABLE lines (o int, l int, qty int, PRIMARY KEY (o, l))",
    "CREATE TABLE log (msg text, n int)",
    "ALTER TABLE log REPLICA IDENTITY FULL",
    "CREATE TABLE big (id int PRIMARY KEY, pad text)",
    "CREATE TABLE a (id int PRIMARY KEY, v text)",
    "CREATE TABLE b (id int PRIMARY KEY, v text)",
)
SCRIPT = (
    "INSERT INTO every_type VALUES (1, true, -32768, 9223372036854775807, 1.1, 'NaN', -12.50, "
    "3.141592653589793238, 'é ☃', 'ten chars!', 'ab', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"b\": 2}', "
    "'2024-02-29', '2026-11-21 10:00:00.123456', '2026-11-21 12:00:00+02', '\\x00ff41'), (2, false, 0, 0, "
    "'-Infinity', 2.5e-300, 0, 0, '', '', '', NULL, 'null', '0001-01-01', '9999-12-31 23:59:59.999999', "
    "'1970-01-01 00:00:00+00', '\\x'), (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL)",
    "UPDATE every_type SET t = 'changed', r = 'Infinity' WHERE id = 2",
    "INSERT INTO lines SELECT o, l, o * l FROM generate_series(1, 5) o, generate_series(1, 4) l",
    "UPDATE lines SET l = l + 10 WHERE o = 2",
    "UPDATE lines SET o = 9, qty = 0 WHERE o = 3 AND l = 1",
    "DELETE FROM lines WHERE o = 4 AND l < 3",
    "INSERT INTO log VALUES ('dup', 1), ('dup', 1), ('dup', 1), ('other', 2)",
    "DELETE FROM log WHERE ctid = (SELECT min(ctid) FROM log WHERE msg = 'dup')",
    "UPDATE log SET n = 5 WHERE msg = 'other'",
    "INSERT INTO big SELECT g, repeat(md5(g::text), 4) FROM generate_series(1, 4000) g",
    "BEGIN; INSERT INTO a VALUES (100, 'rolled back'); UPDATE big SET pad = 'no' WHERE id < 100; ROLLBACK",
    "INSERT INTO a VALUES (1, 'x'), (2, 'y'); INSERT INTO b VALUES (1, 'z')",
    "TRUNCATE a, b",
    "INSERT INTO a VALUES (3, 'after the truncate')",
    "BEGIN; INSERT INTO a VALUES (4, 'kept'); SAVEPOINT s; INSERT INTO a VALUES (5, 'rolled back to s'); "
    "ROLLBACK TO s; UPDATE a SET v = 'kept too' WHERE id = 3; COMMIT",
    "BEGIN; UPDATE big SET pad = 'updated' WHERE id % 3 = 0; DELETE FROM big WHERE id % 7 = 0; COMMIT",
    "ALTER TABLE a ADD COLUMN extra int",
    "INSERT INTO a VALUES (6, 'with an added column', 7); UPDATE a SET extra = 1 WHERE id = 3",
)


def _pgbench(url: str, *args: str) -> None:
    params = psycopg.conninfo.conninfo_to_dict(url)
    command = ["pgbench", "-h", str(params["host"]), "-p", str(params.get("port", 5432)), "-U", "postgres"]
    subprocess.run([*command, *args, str(params["dbname"])], check=True, capture_output=True)


def _source_tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT 'public.' || tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
        return [str(r[0]) for r in rows]


def test_source_equals_target_after_extract_and_apply(
    tmp_path: Path, logical_source: tuple[str, str, str], target_settings: list[str], spark: Any
) -> None:
    config = extract_config(tmp_path, logical_source, "extract.max_pair_mb=0.25", *target_settings)
    url = logical_source[0]
    prepare(config, *SCRIPT_TABLES)
    # pgbench's tables get their keys before their rows (-I dtpg): a key added after rows is a change of key.
    _pgbench(url, "-i", "-I", "dtpg", "-s", "1", "-q")
    for statement in SCRIPT[:8]:
        execute(config, statement)
    extract(config)
    for statement in SCRIPT[8:]:
        execute(config, statement)
    _pgbench(url, "-T", "3", "-c", "2", "-j", "1")
    extract(config)

    scan = scan_directory(config.intermediate_dir)
    assert scan.pairs > 2 and not scan.open_xids
    run_applier(config, spark=spark)

    tables = _source_tables(url)
    assert "public.pgbench_accounts" in tables
    for table in tables:
        source = pg_row_set(url, table, source_types=True)
        if config.target.type == "postgres":
            assert config.target.url
            target = pg_row_set(config.target.url, table, source_types=False)
        else:
            schema, name = table.split(".")
            target = delta_row_set(config.target.path / schema / name) if source else source
        assert target == source, table


def test_extractor_killed_at_random_moments_loses_and_duplicates_nothing(
    tmp_path: Path, logical_source: tuple[str, str, str], spark: Any
) -> None:
    config = extract_config(tmp_path, logical_source, "extract.max_pair_mb=0.05", "extract.max_pair_seconds=0.2")
    url, slot, publication = logical_source
    prepare(config)
    _pgbench(url, "-i", "-I", "dtpg", "-s", "1", "-q")
    config_file = tmp_path / "extract.yaml"
    config_file.write_text(
        f"configuration_name: ext\nintermediate_dir: pairs\noutput_dir: out\ntarget:\n  path: target\n"
        f"source:\n  url: '{url}'\n  slot: {slot}\n  publication: {publication}\nextract:\n  max_pair_mb: 0.05\n"
    )
    command = [sys.executable, "-m", "applier.cli", "extract", "--config", str(config_file), "--follow"]
    params = psycopg.conninfo.conninfo_to_dict(url)
    load = subprocess.Popen(
        ["pgbench", "-h", str(params["host"]), "-p", str(params.get("port", 5432)), "-U", "postgres",
         "-T", "10", "-c", "2", "-j", "1", str(params["dbname"])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    chance = random.Random(14)
    kills = 0
    while load.poll() is None:
        before = resume_point(config.intermediate_dir).next_seq
        extractor = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10  # the command starts in a second or two on a busy machine
        while resume_point(config.intermediate_dir).next_seq == before and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(chance.uniform(0.0, 1.0))  # killed while it writes pairs, at a random moment
        extractor.send_signal(signal.SIGKILL)
        extractor.wait()
        kills += 1
    assert load.wait() == 0 and kills >= 3
    assert resume_point(config.intermediate_dir).next_seq > kills  # each killed run wrote pairs
    extract(config)  # the last batch, after the load

    scan = scan_directory(config.intermediate_dir)  # lsn order, one begin and one end per xid: no duplicate
    assert not scan.open_xids

    # The Applier, SIGKILLed at a random moment once it has committed a cycle, then run again to the end.
    applier = subprocess.Popen(
        [sys.executable, "-m", "applier.cli", "run", "--config", str(config_file),
         "--set", "apply.process_intermediate_size_per_job=0.1"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    checkpoint = tmp_path / "out" / "ext" / "checkpoint.json"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and applier.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(chance.uniform(0.0, 3.0))
    killed = applier.poll() is None
    os.killpg(applier.pid, signal.SIGKILL)
    assert applier.wait() in (0, -signal.SIGKILL) and killed and checkpoint.exists()
    run_applier(config, spark=spark)
    for table in ("public.pgbench_accounts", "public.pgbench_branches", "public.pgbench_tellers",
                  "public.pgbench_history"):  # fmt: skip
        schema, name = table.split(".")
        assert delta_row_set(config.target.path / schema / name) == pg_row_set(url, table, source_types=True), table
