"""Large Delta tables committed by Spark executor tasks: the same tables, once, and the same errors as the driver's."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from applier.engine.compile import compile_cycle
from applier.engine.compiled import CompiledCycle
from applier.errors import TargetError
from applier.intermediate.schema import Column, TableDef
from applier.targets.delta import DeltaTarget
from applier.targets.delta_tasks import executor_writes

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
    on_driver = DeltaTarget(tmp_path / "driver", APP, executor_write_mb=None)
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


def test_only_tables_at_or_above_the_size_go_to_the_executors(
    spark: Any, tmp_path: Path, compiled_cycles: list[CompiledCycle]
) -> None:
    compiled = compiled_cycles[0]
    sizes = {}
    for name in TABLES:
        found = compiled.in_files(name)
        assert found is not None and found[0], f"{name}'s changes are in chunk files"
        sizes[name] = found[1]
    assert sizes["bank.accounts"] > sizes["bank.ledger"]
    threshold = (sizes["bank.accounts"] + sizes["bank.ledger"]) / 2
    assert [w.table.name for w in executor_writes(compiled, int(threshold), {})] == ["bank.accounts"]
    assert executor_writes(compiled, 0, {"bank.accounts": {"positive": "balance > 0"}})[0].table.name == "bank.ledger"
    assert executor_writes(dict(compiled.items()), 0, {}) == []  # changes already in memory stay on the driver

    target = executor_target(tmp_path, spark, threshold / 2**20)
    load = target.apply_cycle(1, compiled, {})
    assert list(load.table_seconds["bank.accounts"]) == ["apply_on_executor"]
    assert list(load.table_seconds["bank.ledger"]) == ["apply"]
    assert {n: target.committed_cycle(n) for n in TABLES} == dict.fromkeys(TABLES, 1)


def test_an_executors_failure_is_the_driver_s_error_naming_the_table(
    spark: Any, tmp_path: Path, compiled_cycles: list[CompiledCycle]
) -> None:
    errors = []
    for where, target in (
        ("driver", DeltaTarget(tmp_path / "driver", APP, executor_write_mb=None)),
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
