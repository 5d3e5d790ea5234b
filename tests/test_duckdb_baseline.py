"""The DuckDB baseline of issue 16 (bench/duckdb_apply.py) against the reference applier, and the step's checks.

The baseline checks the engine in the benchmark, so it must be right on its
own: its Delta tables are compared with tests/reference's result for the same
pairs (a generated workload with every feature of the bench profile, and the
conformance vectors), and with explicit rows for a hand-made stream. Fast: no
Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from conftest import spec_dir
from handmade import event, row, write_pair
from reference.applier import canonical_rows, reference_apply

# bench/ is a folder of scripts at the repository root, not an installed package.
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.duckdb_apply import BaselineError, apply_folder  # noqa: E402
from bench.duckdb_bench import compare_targets, run_tree  # noqa: E402

VECTORS = spec_dir() / "vectors"


def _vector_folders(kind: str) -> list[Path]:
    return sorted(p for p in (VECTORS / kind).iterdir() if p.is_dir()) if (VECTORS / kind).is_dir() else []


def _delta_rows(target: Path, name: str, columns_types: list[tuple[str, str]]) -> list[list[Any]]:
    """The rows of the Delta table ``name`` under ``target``, canonical as the reference gives them."""
    rows = DeltaTable(str(target.joinpath(*name.split(".")))).to_pyarrow_table().to_pylist()
    return canonical_rows(columns_types, [[r[c] for c, _ in columns_types] for r in rows])


def _assert_as_reference(pairs: Path, target: Path, through_seq: int | None = None) -> dict[str, int]:
    """Apply ``pairs`` with the baseline and compare every table with the reference's; rows per table."""
    result = apply_folder(pairs, target, through_seq)
    expected = reference_apply(pairs, through_seq)
    assert set(result["rows"]) == set(expected)
    for name, ref in expected.items():
        columns_types = list(zip(ref.columns, ref.types, strict=True))
        assert _delta_rows(target, name, columns_types) == ref.rows, name
    return result["rows"]


def test_a_generated_workload_gives_the_reference_tables(tmp_path: Path) -> None:
    from applier.generate import generate_workload

    summary = generate_workload(tmp_path / "pairs", profile="bench", transactions=800, seed=1, file_size_mb=0.3)
    # The bench profile's awkward cases are all in these pairs (the generator says which it wrote).
    assert {"key_move_composite", "truncate", "nopk_duplicates", "schema_change", "open_at_end"} <= set(
        summary.features
    )
    rows = _assert_as_reference(tmp_path / "pairs", tmp_path / "target")
    assert sum(rows.values()) > 40_000 and summary.pairs > 3


@pytest.mark.parametrize("folder", _vector_folders("valid"), ids=lambda p: p.name)
def test_a_valid_vector_gives_its_expected_tables(folder: Path, tmp_path: Path) -> None:
    expected = json.loads((folder / "expected.json").read_text(encoding="utf-8"))["tables"]
    rows = _assert_as_reference(folder, tmp_path / "target")
    assert {t: n for t, n in rows.items() if n} == {t: len(e["rows"]) for t, e in expected.items() if e["rows"]}


@pytest.mark.parametrize("folder", _vector_folders("invalid"), ids=lambda p: p.name)
def test_the_good_first_pair_of_an_invalid_vector_gives_the_reference_tables(folder: Path, tmp_path: Path) -> None:
    _assert_as_reference(folder, tmp_path / "target", through_seq=1)


KEYED = {"columns": [{"name": "id", "type": "bigint", "nullable": False},
                     {"name": "v", "type": "double", "nullable": True}], "primary_key": ["id"]}  # fmt: skip
BAG = {"columns": [{"name": "k", "type": "string", "nullable": False},
                   {"name": "bin", "type": "binary", "nullable": True}], "primary_key": []}  # fmt: skip


def test_commit_order_key_moves_multisets_and_open_transactions_as_the_spec_says(tmp_path: Path) -> None:
    k, b = "s.keyed", "s.bag"
    pair1 = [
        row(2, "a", "I", after={"id": 1, "v": 1.5}, table=k),
        row(3, "a", "I", after={"id": 2, "v": "NaN"}, table=k),
        row(4, "a", "T", table=b),  # before any row of the bag: empties nothing
        row(5, "a", "I", after={"k": "x", "bin": "AAE="}, table=b),
        row(6, "a", "I", after={"k": "x", "bin": "AAE="}, table=b),
        row(7, "a", "I", after={"k": "y", "bin": None}, table=b),
        row(10, "b", "U", before={"id": 2}, after={"id": 2, "v": 7.0}, table=k),  # b begins first, commits last
        row(12, "c", "U", before={"id": 2}, after={"id": 2, "v": -1.0}, table=k),
        row(13, "c", "D", before={"k": "x", "bin": "AAE="}, table=b),  # one copy of two
        row(16, "r", "D", before={"id": 2}, table=k),  # rolled back
        row(19, "o", "I", after={"id": 9, "v": 0.0}, table=k),  # still open after the last pair
    ]
    events1 = [event("begin", "a", 1), event("commit", "a", 8), event("begin", "b", 9), event("begin", "c", 11)]
    events1 += [event("commit", "c", 14), event("begin", "r", 15), event("rollback", "r", 17), event("begin", "o", 18)]
    write_pair(tmp_path / "pairs", 1, pair1, events1, tables={k: KEYED, b: BAG})
    pair2 = [row(22, "d", "U", before={"id": 1}, after={"id": 3, "v": 4.0}, table=k)]  # a key move
    events2 = [event("commit", "b", 20), event("begin", "d", 21), event("commit", "d", 23)]
    write_pair(tmp_path / "pairs", 2, pair2, events2, tables={k: KEYED})

    result = apply_folder(tmp_path / "pairs", tmp_path / "target")

    keyed = DeltaTable(str(tmp_path / "target" / "s" / "keyed")).to_pyarrow_table().sort_by("id").to_pylist()
    assert keyed == [{"id": 2, "v": 7.0}, {"id": 3, "v": 4.0}]
    bag = DeltaTable(str(tmp_path / "target" / "s" / "bag")).to_pyarrow_table().sort_by("k").to_pylist()
    assert bag == [{"k": "x", "bin": b"\x00\x01"}, {"k": "y", "bin": None}]
    assert result["changes_kept"] == 10 and result["rows"] == {"s.bag": 2, "s.keyed": 2}
    _assert_as_reference(tmp_path / "pairs", tmp_path / "again")


def test_a_truncate_empties_what_was_committed_before_it(tmp_path: Path) -> None:
    k = "s.keyed"
    # b's truncate commits before a, whose first row has a lower lsn: both of a's rows stay.
    rows = [row(2, "a", "I", after={"id": 1, "v": 1.0}, table=k), row(4, "b", "T", table=k)]
    rows += [row(6, "a", "I", after={"id": 2, "v": 2.0}, table=k)]
    events = [event("begin", "a", 1), event("begin", "b", 3), event("commit", "b", 5), event("commit", "a", 7)]
    write_pair(tmp_path / "pairs", 1, rows, events, tables={k: KEYED})
    rows = [row(9, "c", "T", table=k), row(12, "d", "I", after={"id": 6, "v": None}, table=k)]
    events = [event("begin", "c", 8), event("commit", "c", 10), event("begin", "d", 11), event("commit", "d", 13)]
    write_pair(tmp_path / "pairs", 2, rows, events, tables={k: KEYED})

    apply_folder(tmp_path / "pairs", tmp_path / "first", through_seq=1)
    apply_folder(tmp_path / "pairs", tmp_path / "both")

    read = lambda root: DeltaTable(str(root / "s" / "keyed")).to_pyarrow_table().sort_by("id").to_pylist()  # noqa: E731
    assert read(tmp_path / "first") == [{"id": 1, "v": 1.0}, {"id": 2, "v": 2.0}]
    assert read(tmp_path / "both") == [{"id": 6, "v": None}]


def test_the_baseline_writes_new_tables_only(tmp_path: Path) -> None:
    write_pair(tmp_path / "pairs", 1, [row(2, "a", "I", after={"id": 1, "v": 1.0}, table="s.keyed")],
               [event("begin", "a", 1), event("commit", "a", 3)], tables={"s.keyed": KEYED})  # fmt: skip
    apply_folder(tmp_path / "pairs", tmp_path / "target")
    with pytest.raises(BaselineError, match=r"table s.keyed: .*/s/keyed already holds a Delta table"):
        apply_folder(tmp_path / "pairs", tmp_path / "target")


def _write(root: Path, name: str, table: pa.Table) -> None:
    path = root.joinpath(*name.split("."))
    path.mkdir(parents=True)
    write_deltalake(str(path), table)


def test_targets_compare_as_multisets_with_nan_equal_and_name_what_differs(tmp_path: Path) -> None:
    a = pa.table({"id": [2, 1, 1], "v": [float("nan"), 1.0, 1.0], "d": pa.array([Decimal("1.50")] * 3)})
    _write(tmp_path / "one", "s.t", a)
    _write(tmp_path / "two", "s.t", a.take([2, 0, 1]))
    _write(tmp_path / "three", "s.t", a.take([0, 1, 1]).set_column(1, "v", pa.array([float("nan"), 1.0, 1.5])))
    _write(tmp_path / "one", "s.empty", pa.table({"x": pa.array([], pa.int32())}))
    assert compare_targets(tmp_path / "one", tmp_path / "two") == {
        "s.empty": "same (empty, absent from the baseline)",
        "s.t": "same",
    }
    assert compare_targets(tmp_path / "one", tmp_path / "three")["s.t"] == "same count (3), different rows"
    _write(tmp_path / "four", "s.t", a.slice(1))
    assert compare_targets(tmp_path / "one", tmp_path / "four")["s.t"] == "engine 3 rows, baseline 2"


def test_the_process_tree_cpu_includes_a_descendant_its_parent_never_waited_for(tmp_path: Path) -> None:
    # The parent starts a child that spends 0.6 s of CPU and exits at once, as PySpark leaves its JVM behind.
    child = "import time\nwhile time.process_time() < 0.6: pass"
    parent = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {child!r}])"
    before = _children_of_this_process()  # a JVM of an earlier test's Spark session, say
    run = run_tree([sys.executable, "-c", textwrap.dedent(parent)], tmp_path / "log", "orphan")
    assert run["code"] == 0
    assert run["cpu_s"] >= 0.6
    assert _children_of_this_process() <= before, "the orphan was left here, not reaped"


def test_the_process_tree_cpu_includes_children_the_kernel_reaped_for_a_parent_ignoring_them(tmp_path: Path) -> None:
    # PySpark's daemon ignores SIGCHLD: its workers' usage reaches no wait4, so it is sampled (a second, less a sample).
    child = "import time\nwhile time.process_time() < 1.0: pass"
    parent = textwrap.dedent(f"""\
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        worker = subprocess.Popen([sys.executable, '-c', {child!r}])
        while os.path.exists(f'/proc/{{worker.pid}}'): time.sleep(0.05)
        """)
    run = run_tree([sys.executable, "-c", parent], tmp_path / "log", "ignored")
    assert run["code"] == 0
    assert 0.7 <= run["cpu_s"] <= 1.6


def _children_of_this_process() -> set[str]:
    found = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, check=False, text=True)
    return set(found.stdout.split())
