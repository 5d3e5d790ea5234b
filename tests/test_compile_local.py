"""The driver's compile of small parts gives exactly the Spark compile's net changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from applier.engine.compile import compile_cycle
from applier.engine.compile_local import committed_rows_locally, compile_locally
from applier.engine.compiled import CompiledCycle
from applier.engine.queue import MemoryQueue
from applier.engine.reading import read_cycle
from applier.engine.sources import read_tasks
from applier.engine.touches import last_truncates
from applier.generate import generate_workload
from applier.intermediate.pairs import list_pairs
from applier.intermediate.stream import StreamValidator

pytestmark = pytest.mark.spark


def holder(tmp_path: Path, name: str, tables: Any, truncates: Any) -> CompiledCycle:
    folder = tmp_path / name
    folder.mkdir()
    return CompiledCycle(tables, frozenset(truncates), MemoryQueue(2**40), folder, name)


def canonical(table: pa.Table | None) -> list[str]:
    return [] if table is None else sorted(map(repr, table.to_pylist()))


@pytest.mark.parametrize("profile", ["demo", "long-transactions"])
def test_a_generated_cycle_compiles_the_same_in_the_driver_and_in_spark(
    tmp_path: Path, spark: Any, profile: str
) -> None:
    generate_workload(tmp_path / "in", seed=7, transactions=150, file_size_mb=0.05, profile=profile)
    validator = StreamValidator()
    cycle = read_cycle(list(list_pairs(tmp_path / "in", 1).pairs), validator)
    tables = validator.state.tables
    (touched,) = cycle.tables_by_group([cycle.commits])
    truncates = last_truncates(cycle.commits, cycle.truncates)
    names = {n: tables[n] for n in sorted(touched | set(truncates))}
    assert truncates or profile != "demo", "the demo workload truncates a table"

    local = compile_locally(
        committed_rows_locally(cycle, {}, None), tables, truncates, touched, holder(tmp_path, "local", names, truncates)
    )
    tasks = read_tasks(spark, cycle, {}, None)
    in_spark = compile_cycle(tasks, tables, truncates, touched, holder(tmp_path, "spark", names, truncates))
    assert sorted(local) == sorted(in_spark) and len(local) > 3
    keyless = 0
    for name in sorted(in_spark):
        want, got = in_spark[name], local[name]
        assert got.stats == want.stats and got.truncate == want.truncate, name
        assert canonical(got.upserts) == canonical(want.upserts), name
        assert canonical(got.deletes) == canonical(want.deletes), name
        assert canonical(got.counted) == canonical(want.counted), name
        keyless += want.counted is not None
    assert keyless, "the workload has a table without a key"
