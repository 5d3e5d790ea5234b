"""Large Delta tables committed by Spark executor tasks: the same tables, once, and the same errors as the driver's."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from applier.engine.compile import compile_cycle
from applier.engine.compiled import CompiledCycle
from applier.errors import TargetError
from applier.generate import generate_workload
from applier.intermediate.schema import Column, TableDef
from applier.targets.delta import DeltaTarget
from applier.targets.delta_tasks import CycleCommit, apply_beside_executors
from applier.targets.executor_tasks import TableWrite, executor_threshold, executor_writes, task_tables
from engine_support import assert_target_equals_reference, make_config, run

pytestmark = pytest.mark.spark

APP = "exec"
COMMITTED_DDL = "lsn long, xid string, `table` string, op string, before string, after string, commit_lsn long"
ACCOUNTS = TableDef(
    "bank.accounts",
    (Column("id", "bigint", False), Column("owner", "string", True), Column("balance", "decimal(10,2)", True)),
    ("id",),
)
LEDGER = TableDef("bank.ledger", (Column("entry", "string", True), Column("amount", "double", True)), ())
TABLES = {t.name: t for t in (ACCOUNTS, LEDGER)}


def row(lsn: int, table: TableDef, op: str, before: Any = None, after: Any = None) -> tuple:
    """One committed change, its own transaction, committed right after it."""
    dump = lambda image: None if image is None else json.dumps(image)  # noqa: E731
    return (lsn, f"x{lsn}", table.name, op, dump(before), dump(after), lsn + 1)


def first_cycle() -> list[tuple]:
    """3,000 accounts, and ledger entries of which some values are held twice."""
    rows = [row(10 * i, ACCOUNTS, "I", after={"id": i, "owner": f"o{i}", "balance": f"{i}.25"}) for i in range(3000)]
    entries = [{"entry": f"e{i % 40}", "amount": float(i % 40) / 4} for i in range(60)]
    rows += [row(100_000 + 10 * i, LEDGER, "I", after=e) for i, e in enumerate(entries)]
    return rows


def second_cycle() -> list[tuple]:
    """Accounts updated and deleted, one copy of some ledger values deleted, one new NaN entry."""
    rows = [
        row(200_000 + 10 * i, ACCOUNTS, "U", before={"id": i}, after={"id": i, "owner": f"n{i}", "balance": "1.00"})
        for i in range(0, 3000, 3)
    ]
    rows += [row(300_000 + 10 * i, ACCOUNTS, "D", before={"id": i}) for i in range(1, 3000, 7)]
    rows += [row(400_000 + 10 * i, LEDGER, "D", before={"entry": f"e{i}", "amount": i / 4}) for i in range(0, 20, 2)]
    rows.append(row(500_000, LEDGER, "I", after={"entry": "nan", "amount": "NaN"}))
    return rows


@pytest.fixture
def compiled_cycles(spark: Any) -> Iterator[list[CompiledCycle]]:
    """The two cycles compiled by the Spark job, each table's changes in chunk files."""
    made = [
        compile_cycle(spark.createDataFrame(rows, COMMITTED_DDL), TABLES, {}, list(TABLES))
        for rows in (first_cycle(), second_cycle())
    ]
    yield made
    for one in made:
        one.close()


def executor_target(root: Path, spark: Any, mib: float = 0.0) -> DeltaTarget:
    target = DeltaTarget(root, APP, executor_write_mb=mib)
    target.use_spark(spark)
    return target


def contents(target: DeltaTarget, name: str) -> list[tuple[Any, ...]]:
    table = target.read_arrow(name)
    assert table is not None
    plain = [
        tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in r.values()) for r in table.to_pylist()
    ]
    return sorted(plain, key=repr)


def test_executor_tasks_leave_the_tables_the_driver_leaves_and_skip_a_cycle_held(
    spark: Any, tmp_path: Path, compiled_cycles: list[CompiledCycle]
) -> None:
    on_driver = DeltaTarget(tmp_path / "driver", APP)  # with a local master, by default, the driver commits
    on_driver.use_spark(spark)
    on_executors = executor_target(tmp_path / "executors", spark)
    for cycle_id, compiled in enumerate(compiled_cycles, start=1):
        driver_load = on_driver.apply_cycle(cycle_id, compiled, {})
        executor_load = on_executors.apply_cycle(cycle_id, compiled, {})
        assert all("apply" in s for s in driver_load.table_seconds.values())
        assert {n: list(s) for n, s in executor_load.table_seconds.items()} == {
            n: ["apply_on_executor"] for n in TABLES
        }
        assert executor_load.held == driver_load.held == dict.fromkeys(TABLES, cycle_id)
        assert executor_load.skipped_tables == driver_load.skipped_tables == []
    for name in TABLES:
        assert contents(on_executors, name) == contents(on_driver, name)
        assert on_executors.committed_cycle(name) == 2
    assert len(contents(on_executors, "bank.accounts")) == 3000 - len(range(1, 3000, 7))

    versions = {n: DeltaTable(str(on_executors.table_path(n))).version() for n in TABLES}
    again = on_executors.apply_cycle(2, compiled_cycles[1], {})  # a re-run after a crash past the commits
    assert sorted(again.skipped_tables) == sorted(TABLES)
    assert {n: DeltaTable(str(on_executors.table_path(n))).version() for n in TABLES} == versions


def test_a_cycle_goes_to_the_executors_from_its_size_on_and_its_tables_are_shared_by_weight(
    spark: Any, tmp_path: Path, compiled_cycles: list[CompiledCycle]
) -> None:
    compiled = compiled_cycles[0]
    sizes = {}
    for name in TABLES:
        found = compiled.in_files(name)
        assert found is not None and found[0], f"{name}'s changes are in chunk files"
        sizes[name] = found[1]
    total = sum(sizes.values())
    assert [w.table.name for w in executor_writes(compiled, total, {})] == sorted(TABLES)
    assert executor_writes(compiled, total + 1, {}) == []
    constrained = {"bank.accounts": {"positive": "balance > 0"}}
    assert [w.table.name for w in executor_writes(compiled, 0, constrained)] == ["bank.ledger"]
    assert executor_writes(dict(compiled.items()), 0, {}) == []  # changes already in memory stay on the driver

    small = executor_target(tmp_path / "small", spark, (total + 1) / 2**20)
    assert {n: list(s) for n, s in small.apply_cycle(1, compiled, {}).table_seconds.items()} == {
        n: ["apply"] for n in TABLES
    }
    large = executor_target(tmp_path / "large", spark, total / 2**20)
    assert {n: list(s) for n, s in large.apply_cycle(1, compiled, {}).table_seconds.items()} == {
        n: ["apply_on_executor"] for n in TABLES
    }
    for name in TABLES:
        assert contents(large, name) == contents(small, name)


def test_the_default_with_a_local_master_is_the_driver_and_a_size_or_off_holds_wherever(spark: Any) -> None:
    assert spark.sparkContext.master.startswith("local[")
    assert executor_threshold(None, spark, "write") is None
    assert executor_threshold(2.5, spark, "write") == int(2.5 * 2**20)
    assert executor_threshold(0.0, spark, "write") == 0
    assert executor_threshold(float("inf"), spark, "write") is None
    assert executor_threshold(0.0, None, "write") is None  # no session, no executors


def test_tables_are_shared_among_tasks_heaviest_first_each_to_the_lightest_task() -> None:
    def write(name: str, nbytes: int) -> TableWrite:
        return TableWrite(TableDef(f"s.{name}", (Column("c", "int", True),), ()), False, (f"/{name}",), nbytes)

    writes = [write("a", 10), write("b", 70), write("c", 40), write("d", 30), write("e", 20)]
    bins = task_tables(writes, 2)
    assert [[w.table.name for w in b] for b in bins] == [["s.b", "s.e"], ["s.c", "s.d", "s.a"]]
    assert [[w.table.name for w in b] for b in task_tables(writes[:1], 4)] == [["s.a"]]  # no empty task


def test_an_executors_failure_is_the_driver_s_error_naming_the_table(
    spark: Any, tmp_path: Path, compiled_cycles: list[CompiledCycle]
) -> None:
    errors = []
    for where, target in (
        ("driver", DeltaTarget(tmp_path / "driver", APP, executor_write_mb=float("inf"))),
        ("executors", executor_target(tmp_path / "executors", spark)),
    ):
        # The accounts table is already there, its balance a string: the cycle's decimals cannot land.
        wrong = pa.table({"id": pa.array([1], pa.int64()), "owner": ["x"], "balance": ["1.00"]})
        write_deltalake(str(target.table_path("bank.accounts")), wrong)
        with pytest.raises(TargetError) as caught:
            target.apply_cycle(1, compiled_cycles[0], {})
        assert caught.value.table == "bank.accounts", where
        assert "\n" not in str(caught.value)
        assert target.committed_cycle("bank.accounts") == 0
        assert target.committed_cycle("bank.ledger") == 1  # the other table committed; the cycle's re-run skips it
        errors.append((str(caught.value), caught.value.error_class, caught.value.transient, caught.value.code))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("executor_write_mb", [0, "off", "null"])
def test_runs_committing_on_the_executors_or_the_driver_equal_the_reference(
    tmp_path: Path, spark: Any, executor_write_mb: Any
) -> None:
    generate_workload(tmp_path / "in", seed=7, transactions=250, file_size_mb=0.05, profile="demo")
    config = make_config(
        tmp_path, tmp_path / "in", process_intermediate_size_per_job=0.2, executor_write_mb=executor_write_mb
    )
    summary = run(config, spark)
    assert len(summary.reports) > 1
    assert_target_equals_reference(config, tmp_path / "in")
    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]
    where = {step for r in reports for steps in r["table_seconds"].values() for step in steps}
    assert where == ({"apply_on_executor"} if executor_write_mb == 0 else {"apply"})


class _KillsItsWorker:
    """Stands for a table whose task dies with its Python worker: unpickled there, it ends the process."""

    name = ACCOUNTS.name

    def __reduce__(self) -> tuple[Any, ...]:
        return (os._exit, (7,))


def test_a_failed_commit_job_is_a_transient_error_and_the_driver_s_tables_commit(
    spark: Any, tmp_path: Path, compiled_cycles: list[CompiledCycle]
) -> None:
    compiled = compiled_cycles[0]
    lost = TableWrite(_KillsItsWorker(), False, (), 1)  # type: ignore[arg-type]
    target = executor_target(tmp_path / "target", spark)
    commit = CycleCommit(str(target.root), APP, target.collisions, 1, None, target.compact_min_files)
    with pytest.raises(TargetError) as caught:
        apply_beside_executors(target, spark, commit, [lost], compiled)
    assert caught.value.transient and caught.value.error_class == "connection"
    assert "cycle 1: the Delta commits on the executors failed: Job aborted" in str(caught.value)
    assert "Python worker exited unexpectedly" in str(caught.value)  # Spark's cause, not py4j's call
    assert "\n" not in str(caught.value)
    assert target.committed_cycle("bank.ledger") == 1  # committed by the driver meanwhile
    assert target.committed_cycle("bank.accounts") == 0
