"""Source tables that cannot land in the target as named are refused as bad input (exit 3).

Nothing of such a table is written, and everything before its pair is applied.

The rules are each target's (PostgreSQL's 63-byte identifiers and the
Applier's own objects there; Delta's folder names); the stream validator asks
them for every table a pair brings or changes, and the engine then applies
everything before that pair.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from applier.errors import IntermediateFileError, UnfitTableError
from applier.intermediate.pairs import list_pairs
from applier.intermediate.reader import read_pair
from applier.intermediate.schema import parse_table_def
from applier.intermediate.stream import StreamValidator
from applier.targets.delta_names import delta_misfit
from applier.targets.pg_sql import CHECKPOINT_COLUMNS, table_misfit
from engine_support import assert_target_equals_reference, make_config, run
from handmade import ACCOUNTS, event, row, write_pair


def table(name: str, columns: tuple[str, ...] = ("id", "owner")) -> Any:
    return parse_table_def(
        name,
        {"columns": [{"name": c, "type": "bigint", "nullable": c != "id"} for c in columns], "primary_key": ["id"]},
    )


# ---------------------------------------------------------------------------- PostgreSQL's rule


def test_postgres_takes_names_of_63_bytes_and_refuses_64() -> None:
    assert table_misfit(table("s." + "t" * 63), [], {}) is None
    problem = table_misfit(table("s." + "t" * 64), [], {})
    assert problem is not None and "64 bytes" in problem and "63" in problem and "table name" in problem
    # Bytes, not characters: 32 two-byte letters make 64 bytes.
    assert "64 bytes" in (table_misfit(table("s." + "é" * 32), [], {}) or "")
    assert "schema" in (table_misfit(table("s" * 64 + ".t"), [], {}) or "")
    column = table_misfit(table("s.t", ("id", "c" * 64)), [], {})
    assert column is not None and column.startswith("its column ccc")


def test_postgres_refuses_the_applier_s_own_objects_and_staging_columns() -> None:
    checkpoint = table_misfit(table("public.applier_checkpoint"), [], {})
    assert checkpoint is not None and "checkpoint table" in checkpoint
    assert "checkpoint table" in (table_misfit(table("sales.applier_checkpoint"), [], {}) or "")
    staging = table_misfit(table("applier_staging.orders"), [], {})
    assert staging is not None and "staging schema" in staging and "target.schema_map" in staging
    # Mapped elsewhere, the source schema is no longer a problem; mapped into it, it is.
    assert table_misfit(table("applier_staging.orders"), [], {"applier_staging": "staged"}) is None
    assert "staging schema" in (table_misfit(table("sales.orders"), [], {"sales": "applier_staging"}) or "")
    op = table_misfit(table("s.t", ("id", "__op")), [], {})
    assert op is not None and "__op" in op and "staging" in op


def test_postgres_refuses_two_source_tables_in_one_target_table() -> None:
    schema_map = {"eu": "sales", "us": "sales"}
    assert table_misfit(table("eu.orders"), ["us.customers"], schema_map) is None
    problem = table_misfit(table("eu.orders"), ["us.orders", "us.customers"], schema_map)
    assert problem is not None and "sales.orders" in problem and "us.orders" in problem
    assert table_misfit(table("eu.orders"), ["us.orders"], {}) is None


# ---------------------------------------------------------------------------- Delta's rule


def test_delta_refuses_hidden_and_oversized_folder_names(tmp_path: Path) -> None:
    assert delta_misfit("public.orders", tmp_path) is None
    for name in ("public._delta_log", "_delta_log.orders", "public._orders", "_applier.demo"):
        problem = delta_misfit(name, tmp_path)
        assert problem is not None and "starts with '_'" in problem, name
    assert delta_misfit("public." + "t" * 255, tmp_path) is None
    long = delta_misfit("public." + "t" * 300, tmp_path)
    assert long is not None and "300 bytes" in long and "255" in long
    deep = tmp_path / ("d" * 200) / ("d" * 200)
    root = Path("/" + "/".join(["r" * 250] * 15))  # 3,765 bytes
    assert delta_misfit("public.orders", deep) is None
    too_deep = delta_misfit("public." + "t" * 250, root)
    assert too_deep is not None and "4096-byte path limit" in too_deep


# ---------------------------------------------------------------------------- the stream validator


def _stream(directory: Path, bad: str, *, columns: dict[str, Any] | None = None) -> None:
    """Pair 1 changes bank.accounts; pair 2 brings ``bad`` (with a row) next to it; pair 3 changes accounts again."""
    write_pair(
        directory,
        1,
        [row(11, "t1", "I", after={"id": 1, "owner": "ann", "balance": "1.50"})],
        [event("begin", "t1", 10), event("commit", "t1", 12)],
    )
    write_pair(
        directory,
        2,
        [
            row(21, "t2", "I", after={"id": 2, "owner": "bob", "balance": "2.00"}),
            row(22, "t2", "I", after={"id": 7, "owner": "eve", "balance": "0.00", **(columns or {})}, table=bad),
        ],
        [event("begin", "t2", 20), event("commit", "t2", 23)],
        tables={"bank.accounts": ACCOUNTS, bad: _with(columns)},
    )
    write_pair(
        directory,
        3,
        [row(31, "t3", "I", after={"id": 3, "owner": "cy", "balance": "3.00"})],
        [event("begin", "t3", 30), event("commit", "t3", 32)],
    )


def _with(columns: dict[str, Any] | None) -> dict[str, Any]:
    extra = [{"name": c, "type": "bigint", "nullable": True} for c in columns or {}]
    return {**ACCOUNTS, "columns": [*ACCOUNTS["columns"], *extra]}


def test_the_validator_refuses_a_pair_bringing_an_unfit_table_and_stays_as_it_was(tmp_path: Path) -> None:
    _stream(tmp_path, "bank._delta_log")
    asked: list[tuple[str, set[str]]] = []

    def admit(t: Any, known: Any) -> str | None:
        asked.append((t.name, set(known)))
        return delta_misfit(t.name, tmp_path)

    validator = StreamValidator(admit=admit)
    first, second = (read_pair(p) for p in list_pairs(tmp_path, 1).pairs[:2])
    validator.check(first)
    before = (dict(validator.state.tables), dict(validator.state.open_xids), validator.state.last_lsn)
    with pytest.raises(UnfitTableError) as refused:
        validator.check(second)
    e = refused.value
    assert e.code == "table-unfit-for-target" and e.exit_code == 3 and e.seq == 2
    assert str(e).startswith(f"{second.ref.dat_path}: table bank._delta_log: its name part '_delta_log' starts with")
    assert (dict(validator.state.tables), dict(validator.state.open_xids), validator.state.last_lsn) == before
    # Asked for each new table once, with the tables known before it; an unchanged definition is not asked again.
    assert asked == [("bank.accounts", set()), ("bank._delta_log", {"bank.accounts"})]


def test_a_table_changed_by_a_pair_is_asked_again(tmp_path: Path) -> None:
    _stream(tmp_path, "bank.audit", columns={"c" * 64: 1})
    validator = StreamValidator(admit=lambda t, known: table_misfit(t, known, {}))
    first, second = (read_pair(p) for p in list_pairs(tmp_path, 1).pairs[:2])
    validator.check(first)
    with pytest.raises(UnfitTableError, match=r"table bank\.audit: its column c{40}… has 64 bytes"):
        validator.check(second)


# ---------------------------------------------------------------------------- the engine, on both targets


@pytest.mark.spark
@pytest.mark.parametrize(
    ("target", "bad", "why"),
    [
        ("delta", "bank._delta_log", "starts with '_'"),
        ("delta", "bank." + "t" * 300, "a folder name has at most 255"),
        pytest.param("postgres", "bank.applier_checkpoint", "checkpoint table", marks=pytest.mark.postgres),
        pytest.param("postgres", "applier_staging.accounts", "staging schema", marks=pytest.mark.postgres),
        pytest.param(
            "postgres", "bank." + "t" * 63 + "_a", "PostgreSQL keeps the first 63", marks=pytest.mark.postgres
        ),
    ],
)
def test_a_run_applies_everything_before_the_unfit_table_and_writes_nothing_of_it(
    tmp_path: Path, spark: Any, target: str, bad: str, why: str, request: pytest.FixtureRequest
) -> None:
    settings: list[str] = []
    if target == "postgres":
        url = request.getfixturevalue("pg_url")
        settings = ["target.type=postgres", f"target.url={url}"]
    _stream(tmp_path / "in", bad)
    config = make_config(tmp_path, tmp_path / "in", settings, process_intermediate_size_per_job=0)

    with pytest.raises(IntermediateFileError) as refused:
        run(config, spark)
    assert refused.value.code == "table-unfit-for-target" and refused.value.exit_code == 3
    assert str(refused.value).startswith(f"{tmp_path / 'in' / '000000000002.dat'}: table {bad}: ")
    assert why in str(refused.value)
    checkpoint = (config.work_dir / "checkpoint.json").read_text()
    assert '"applied_seq": 1,' in checkpoint and bad not in checkpoint
    expected = assert_target_equals_reference(config, tmp_path / "in", through_seq=1)
    assert list(expected) == ["bank.accounts"] and len(expected["bank.accounts"].rows) == 1
    schema, name = bad.split(".")
    if target == "delta":
        assert sorted(p.name for p in (tmp_path / "target" / schema).iterdir()) == ["accounts"]
        return
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT configuration_name, cycle_id FROM applier_checkpoint").fetchall()
        assert rows == [("test_cfg", 1)]
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'applier_checkpoint' "
            "ORDER BY ordinal_position"
        ).fetchall()
        assert [c for (c,) in columns][: len(CHECKPOINT_COLUMNS)] == list(CHECKPOINT_COLUMNS)
        assert not {"id", "owner", "balance"} & {c for (c,) in columns}  # no source table landed in it
        if name != "applier_checkpoint":
            found = conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s AND table_name LIKE %s",
                [schema, name[:40] + "%"],
            ).fetchone()
            assert found == (0,)


@pytest.mark.spark
@pytest.mark.postgres
def test_a_source_schema_mapped_away_from_the_staging_schema_continues(tmp_path: Path, spark: Any, pg_url: str) -> None:
    _stream(tmp_path / "in", "applier_staging.accounts")
    settings = ["target.type=postgres", f"target.url={pg_url}"]
    config = make_config(tmp_path, tmp_path / "in", settings, process_intermediate_size_per_job=0)
    with pytest.raises(UnfitTableError):
        run(config, spark)
    mapped = make_config(
        tmp_path,
        tmp_path / "in",
        [*settings, "target.schema_map.applier_staging=staged"],
        process_intermediate_size_per_job=0,
    )
    summary = run(mapped, spark)
    assert summary.checkpoint.applied_seq == 3
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT id, owner FROM staged.accounts").fetchall() == [(7, "eve")]
        assert conn.execute("SELECT count(*) FROM bank.accounts").fetchone() == (3,)
