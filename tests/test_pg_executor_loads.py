"""PostgreSQL staging tables loaded by Spark executor tasks: the same tables, one commit, the driver's errors."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from applier.engine.compile import compile_cycle
from applier.engine.compiled import CompiledCycle
from applier.errors import TargetError
from applier.exits import error_line
from applier.generate import generate_workload
from applier.targets import pg_sql
from applier.targets.executor_tasks import TableWrite
from applier.targets.pg_connections import Staged
from applier.targets.pg_tasks import StagingJob, load_beside_executors
from applier.targets.postgres import PostgresTarget
from engine_support import assert_target_equals_reference, make_config, run
from pg_support import fresh_database
from test_delta_executor_writes import (
    ACCOUNTS,
    COMMITTED_DDL,
    TABLES,
    _KillsItsWorker,
    compiled_cycles,  # noqa: F401 (the fixture ``compiled`` takes)
    row,
)

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


@pytest.fixture
def compiled(request: pytest.FixtureRequest) -> list[CompiledCycle]:
    """The Delta executor tests' two cycles compiled by the Spark job, each table's changes in chunk files."""
    cycles: list[CompiledCycle] = request.getfixturevalue("compiled_cycles")
    return cycles


@pytest.fixture
def two_databases() -> Iterator[tuple[str, str]]:
    with fresh_database() as one, fresh_database() as other:
        yield one, other


def contents(url: str, name: str) -> list[tuple[Any, ...]]:
    schema, table = name.split(".")
    with psycopg.connect(url) as conn:
        found = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, table))).fetchall()
    return sorted((tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in r) for r in found), key=repr)


def staging_tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", [pg_sql.STAGING_SCHEMA])
        return sorted(name for (name,) in found)


def checkpoint(url: str) -> tuple[Any, ...] | None:
    with psycopg.connect(url) as conn:
        if conn.execute("SELECT to_regclass('applier_checkpoint')").fetchone() == (None,):
            return None
        return conn.execute("SELECT cycle_id, applied_seq FROM applier_checkpoint").fetchone()


def executor_target(url: str, spark: Any, mb: float = 0.0) -> PostgresTarget:
    target = PostgresTarget(url, "exec", executor_write_mb=mb)
    target.use_spark(spark)
    return target


def test_staging_loads_on_the_executors_leave_the_tables_the_driver_leaves_in_one_commit(
    spark: Any, two_databases: tuple[str, str], compiled: list[CompiledCycle]
) -> None:
    driver_url, executors_url = two_databases
    on_driver = PostgresTarget(driver_url, "exec")  # with a local master, by default, the driver loads
    on_driver.use_spark(spark)
    on_executors = executor_target(executors_url, spark)
    for cycle_id, cycle in enumerate(compiled, start=1):
        position = {"applied_seq": cycle_id}
        driver_load = on_driver.apply_cycle(cycle_id, cycle, position)
        executor_load = on_executors.apply_cycle(cycle_id, cycle, position)
        assert driver_load.table_seconds == {} and driver_load.batches == [[n] for n in sorted(TABLES)]
        assert {n: list(s) for n, s in executor_load.table_seconds.items()} == {n: ["load_on_executor"] for n in TABLES}
        assert executor_load.batches == []  # nothing loaded on the driver's connections
        assert executor_load.collisions == driver_load.collisions
        assert checkpoint(executors_url) == checkpoint(driver_url) == (cycle_id, cycle_id)
        assert staging_tables(executors_url) == []  # dropped once the cycle committed
    for name in TABLES:
        assert contents(executors_url, name) == contents(driver_url, name)
    assert len(contents(executors_url, ACCOUNTS.name)) == 3000 - len(range(1, 3000, 7))

    again = on_executors.apply_cycle(2, compiled[1], {"applied_seq": 2})  # a re-run after a crash
    assert sorted(again.skipped_tables) == sorted(TABLES)
    for name in TABLES:
        assert contents(executors_url, name) == contents(driver_url, name)


def test_an_executor_s_load_error_is_the_driver_s_naming_the_table_and_key_and_nothing_is_applied(
    spark: Any, two_databases: tuple[str, str], tmp_path: Path
) -> None:
    # PostgreSQL text holds no NUL character: the COPY of the accounts fails at the row of key 7.
    rows = [row(10 * i, ACCOUNTS, "I", after={"id": i, "owner": f"o{i}", "balance": "1.00"}) for i in range(20)]
    rows[7] = row(70, ACCOUNTS, "I", after={"id": 7, "owner": "o\u00007", "balance": "1.00"})
    compiled = compile_cycle(spark.createDataFrame(rows, COMMITTED_DDL), TABLES, {}, list(TABLES))
    try:
        errors = []
        for url, target in zip(
            two_databases,
            (PostgresTarget(two_databases[0], "exec"), executor_target(two_databases[1], spark)),
            strict=True,
        ):
            with pytest.raises(TargetError) as caught:
                target.apply_cycle(1, compiled, {"applied_seq": 1})
            message = str(caught.value)
            assert caught.value.table == ACCOUNTS.name and "load into staging at key id=7 failed" in message, message
            assert "\n" not in message
            assert checkpoint(url) is None  # the cycle's one transaction never ran
            errors.append((message, caught.value.error_class, caught.value.transient))
            target.close()
        driver, executors = (e[0].split(": table ", 1)[1] for e in errors)
        assert driver == executors and errors[0][1:] == errors[1][1:]
    finally:
        compiled.close()


def test_a_lost_staging_job_is_a_transient_error_after_the_driver_s_tables_loaded(
    spark: Any, two_databases: tuple[str, str]
) -> None:
    url = two_databases[0]
    lost = TableWrite(_KillsItsWorker(), False, (), 1)  # type: ignore[arg-type]
    job = StagingJob(1, {"url": url, "name": "exec", "schema_map": {}, "show_row_values": False,
                         "lock_timeout_s": 5.0, "statement_timeout_s": 0.0},
                     {ACCOUNTS.name: "exec_0", "bank.ledger": "exec_1"})  # fmt: skip
    asked: list[list[str]] = []

    def here(names: list[str]) -> list[Staged]:
        asked.append(names)
        return []

    with pytest.raises(TargetError) as caught:
        load_beside_executors(spark, job, [lost], here)
    assert asked == [["bank.ledger"]]  # the driver loaded the others meanwhile
    assert caught.value.transient and caught.value.error_class == "connection"
    message = str(caught.value)
    assert "cycle 1: the PostgreSQL staging loads on the executors failed: Job aborted" in message
    assert "Python worker exited unexpectedly" in message and "nothing of the cycle was applied" in message
    assert "\n" not in message


@pytest.mark.parametrize("executor_write_mb", [0, "null"])
def test_runs_loading_on_the_executors_or_the_driver_equal_the_reference(
    tmp_path: Path, spark: Any, executor_write_mb: Any
) -> None:
    generate_workload(tmp_path / "in", seed=7, transactions=250, file_size_mb=0.05, profile="demo")
    with fresh_database() as url:
        config = make_config(
            tmp_path,
            tmp_path / "in",
            ["target.type=postgres", f"target.url={url}"],
            process_intermediate_size_per_job=0.2,
            executor_write_mb=executor_write_mb,
        )
        summary = run(config, spark)
        assert len(summary.reports) > 1
        assert_target_equals_reference(config, tmp_path / "in")
        assert staging_tables(url) == []
    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]
    where = {step for r in reports for steps in r["table_seconds"].values() for step in steps}
    assert where == ({"load_on_executor"} if executor_write_mb == 0 else set())


def test_executors_that_cannot_reach_the_database_say_so_and_how_to_keep_the_loads_on_the_driver(
    spark: Any, tmp_path: Path
) -> None:
    unreachable = "host=127.0.0.1 port=1 user=postgres dbname=nowhere connect_timeout=2"
    connect = {"url": unreachable, "name": "exec", "schema_map": {}, "show_row_values": False,
               "lock_timeout_s": 5.0, "statement_timeout_s": 0.0}  # fmt: skip
    job = StagingJob(3, connect, {ACCOUNTS.name: "exec_0"})
    write = TableWrite(ACCOUNTS, False, (str(tmp_path / "never-read.arrow"),), 1)
    with pytest.raises(TargetError) as caught:
        load_beside_executors(spark, job, [write], lambda names: [])
    message = str(caught.value)
    assert message.startswith("PostgreSQL target ") and "port=1" in message and "connect failed" in message
    assert "from a Spark executor: the executors must reach target.url" in message
    assert "apply.executor_write_mb: off" in message
    assert "\n" not in error_line(caught.value)  # libpq's own words span lines; the run shows one
    assert caught.value.transient and caught.value.error_class == "connection"
