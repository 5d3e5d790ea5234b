"""Collisions and log order on the PostgreSQL target: where the log and the table disagree about a row.

The table is changed behind the Applier's back (a row inserted, another
deleted) before a cycle that inserts, updates and deletes those rows. Set-wise
and change by change, the target counts what collided, applies it as an
upsert by default, and refuses it when ``errors.actions.collision`` says so;
``apply.command_convert`` makes the conversions intended and uncounted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from applier.engine.changes import TableChanges
from applier.engine.parts import log_changes
from applier.errors import TargetError
from applier.summary import collisions_line, read_summary
from applier.targets import Part
from applier.targets.collisions import Collisions, describe
from applier.targets.postgres import PostgresTarget
from engine_support import run
from test_bad_rows import TRANSACTIONS, configured, ids, ids_of, write_workload
from test_delta_target import counted, keyed, table_def
from test_postgres_target import checkpoint_row, rows

pytestmark = pytest.mark.postgres

ITEMS = table_def("shop.items", [("id", "bigint", False), ("qty", "int", True), ("note", "string", True)], ("id",))
EVENTS = table_def("shop.events", [("kind", "string", True), ("value", "double", True)])
STRICT = Collisions(refuse=True, action="stop")


def with_new(change: TableChanges, new: list[bool]) -> TableChanges:
    """``change`` with each upsert marked a net insert (True) or update (False), as the compile marks them."""
    return TableChanges(**{**change.__dict__, "new": pa.array(new)})


def behind_the_back(url: str) -> None:
    """Row 2 appears and row 3 vanishes without the log knowing."""
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO shop.items VALUES (2, 0, 'made by hand')")
        conn.execute("DELETE FROM shop.items WHERE id = 3")


def seeded(url: str, **kwargs: Any) -> PostgresTarget:
    t = PostgresTarget(url, "demo", **kwargs)
    t.apply_cycle(1, {ITEMS.name: keyed(ITEMS, [{"id": 1, "qty": 1}, {"id": 3, "qty": 3}, {"id": 4, "qty": 4}])}, {})
    behind_the_back(url)
    return t


def colliding_cycle() -> TableChanges:
    """Insert 2 (held by hand), update 3 (gone) and 1 (there), delete 4 (there) and 9 (never was)."""
    change = keyed(ITEMS, [{"id": 2, "qty": 20}, {"id": 3, "qty": 30}, {"id": 1, "qty": 10}], [{"id": 4}, {"id": 9}])
    return with_new(change, [True, False, False])


def test_set_wise_counts_each_kind_and_applies_them_as_upserts(pg_url: str) -> None:
    t = seeded(pg_url)
    load = t.apply_cycle(2, {ITEMS.name: colliding_cycle()}, {})
    assert load.collisions == {ITEMS.name: {"insert": 1, "update": 1, "delete": 1}}
    assert rows(pg_url, "shop.items", "id") == [(1, 10, None), (2, 20, None), (3, 30, None)]
    assert describe(load.collisions[ITEMS.name]) == (
        "1 insert found its key already held, 1 update found no row, 1 delete found no row"
    )


def test_a_clean_cycle_counts_no_collision(pg_url: str) -> None:
    t = PostgresTarget(pg_url, "demo")
    t.apply_cycle(1, {ITEMS.name: with_new(keyed(ITEMS, [{"id": 1}, {"id": 2}]), [True, True])}, {})
    load = t.apply_cycle(2, {ITEMS.name: with_new(keyed(ITEMS, [{"id": 1, "qty": 5}], [{"id": 2}]), [False])}, {})
    assert load.collisions == {}
    assert rows(pg_url, "shop.items", "id") == [(1, 5, None)]


def test_a_refusing_action_rolls_the_cycle_back_naming_the_table(pg_url: str) -> None:
    t = seeded(pg_url, collisions=STRICT)
    with pytest.raises(TargetError, match=r"table shop\.items: 1 insert found its key already held") as refused:
        t.apply_cycle(2, {ITEMS.name: colliding_cycle()}, {})
    assert refused.value.error_class == "collision" and not refused.value.transient
    assert rows(pg_url, "shop.items", "id") == [(1, 1, None), (2, 0, "made by hand"), (4, 4, None)]
    assert checkpoint_row(pg_url) == (1, 0, 0, 0)


def test_command_convert_makes_the_conversions_intended_and_uncounted(pg_url: str) -> None:
    t = seeded(pg_url, collisions=Collisions(frozenset({"i2di", "u2di", "d2none"}), refuse=True, action="stop"))
    load = t.apply_cycle(2, {ITEMS.name: colliding_cycle()}, {})
    assert load.collisions == {}
    assert rows(pg_url, "shop.items", "id") == [(1, 10, None), (2, 20, None), (3, 30, None)]


def test_a_keyless_delete_of_missing_copies_is_a_delete_collision(pg_url: str) -> None:
    row = {"kind": "a", "value": 1.0}
    t = PostgresTarget(pg_url, "demo")
    t.apply_cycle(1, {EVENTS.name: counted(EVENTS, [(row, 1)])}, {})
    assert t.apply_cycle(2, {EVENTS.name: counted(EVENTS, [(row, -2)])}, {}).collisions == {EVENTS.name: {"delete": 1}}
    assert rows(pg_url, "shop.events", "kind") == []
    strict = PostgresTarget(pg_url, "demo", collisions=STRICT)
    strict.apply_cycle(3, {EVENTS.name: counted(EVENTS, [(row, 1)])}, {})
    with pytest.raises(TargetError, match=r"shop\.events: 2 deletes found no row"):
        strict.apply_cycle(4, {EVENTS.name: counted(EVENTS, [(row, -3)])}, {})
    assert rows(pg_url, "shop.events", "kind") == [("a", 1.0)]


# ------------------------------------------------------------------ log order


def changes(*rows_: tuple[int, str, str, str | None, str | None]) -> pa.Table:
    """A transaction's rows as the pairs hold them: ``(lsn, table, op, before, after)``."""
    names = ("lsn", "table", "op", "before", "after")
    columns = list(zip(*rows_, strict=True))
    return pa.table(
        {
            "lsn": pa.array(columns[0], pa.int64()),
            "xid": pa.array(["x"] * len(rows_), pa.string()),
            **{n: pa.array(c, pa.string()) for n, c in zip(names[1:], columns[1:], strict=True)},
        }
    )


def test_log_order_applies_every_change_as_a_statement_in_source_order(pg_url: str) -> None:
    t = PostgresTarget(pg_url, "demo")
    tables = {ITEMS.name: ITEMS, EVENTS.name: EVENTS}
    txn = changes(
        (1, "shop.items", "I", None, '{"id": 1, "qty": 1}'),
        (2, "shop.items", "U", '{"id": 1}', '{"id": 5, "qty": 2, "note": "moved"}'),  # the key moves
        (3, "shop.items", "I", None, '{"id": 1, "qty": 7}'),  # the old key is free again
        (4, "shop.events", "I", None, '{"kind": "k", "value": 1.5}'),
        (5, "shop.events", "I", None, '{"kind": "k", "value": 1.5}'),
        (6, "shop.events", "D", '{"kind": "k", "value": 1.5}', None),  # one copy of two
        (7, "shop.items", "D", '{"id": 1}', None),
    )
    load = t.apply_log_order(1, Part(0, 1, 2), {}, txn, tables)
    assert load.collisions == {}
    assert load.statements == {ITEMS.name: {"I": 2, "U": 1, "D": 1}, EVENTS.name: {"I": 2, "D": 1}}
    assert log_changes(txn) == {ITEMS.name: (False, 1), EVENTS.name: (False, 1)}
    assert rows(pg_url, "shop.items", "id") == [(5, 2, "moved")]
    assert rows(pg_url, "shop.events", "kind") == [("k", 1.5)]
    assert t.applied_through(1) == 1
    again = t.apply_log_order(1, Part(0, 1, 2), {}, txn, tables)  # a re-run: the part is held
    assert again.skipped_tables == [EVENTS.name, ITEMS.name]
    assert rows(pg_url, "shop.items", "id") == [(5, 2, "moved")]


def test_log_order_counts_collisions_and_a_refusing_action_leaves_nothing(pg_url: str) -> None:
    t = seeded(pg_url)
    txn = changes(
        (1, "shop.items", "I", None, '{"id": 2, "qty": 20}'),  # held by hand
        (2, "shop.items", "U", '{"id": 3}', '{"id": 3, "qty": 30}'),  # gone
        (3, "shop.items", "D", '{"id": 9}', None),  # never was
        (4, "shop.items", "U", '{"id": 1}', '{"id": 1, "qty": 10}'),
    )
    strict = PostgresTarget(pg_url, "demo", collisions=STRICT)
    with pytest.raises(TargetError, match="1 insert found its key already held, 1 update found no row"):
        strict.apply_log_order(2, Part(0, 1, 1), {}, txn, {ITEMS.name: ITEMS})
    assert rows(pg_url, "shop.items", "id") == [(1, 1, None), (2, 0, "made by hand"), (4, 4, None)]
    load = t.apply_log_order(2, Part(0, 1, 1), {"applied_seq": 2}, txn, {ITEMS.name: ITEMS})
    assert load.collisions == {ITEMS.name: {"insert": 1, "update": 1, "delete": 1}}
    assert rows(pg_url, "shop.items", "id") == [(1, 10, None), (2, 20, None), (3, 30, None), (4, 4, None)]
    assert checkpoint_row(pg_url) == (2, 2, 0, 0)  # the part was the cycle's last: the cycle is in


def test_log_order_refuses_a_bad_row_naming_the_table_and_applies_nothing(pg_url: str, tmp_path: Path) -> None:
    t = PostgresTarget(pg_url, "demo")
    t.apply_cycle(1, {ITEMS.name: keyed(ITEMS, [{"id": 1, "qty": 1}])}, {})
    with psycopg.connect(pg_url) as conn:
        conn.execute("ALTER TABLE shop.items ADD CONSTRAINT qty_positive CHECK (qty > 0)")
    txn = changes(
        (1, "shop.items", "I", None, '{"id": 2, "qty": 2}'),
        (2, "shop.items", "U", '{"id": 1}', '{"id": 1, "qty": -1}'),
    )
    with pytest.raises(TargetError, match="qty_positive") as refused:
        t.apply_log_order(2, Part(0, 1, 3), {}, txn, {ITEMS.name: ITEMS})
    assert refused.value.error_class == "check"
    assert rows(pg_url, "shop.items", "id") == [(1, 1, None)]
    assert t.applied_through(2) == 0


def test_the_row_counts_of_a_log_order_transaction_are_what_its_log_says() -> None:
    txn = changes(
        (1, "shop.items", "I", None, "{}"),
        (2, "shop.items", "T", None, None),
        (3, "shop.items", "I", None, "{}"),
        (4, "shop.events", "D", "{}", None),
        (5, "shop.events", "U", "{}", "{}"),
    )
    assert log_changes(txn) == {ITEMS.name: (True, 1), EVENTS.name: (False, -1)}


def test_a_keyed_table_made_by_hand_without_a_key_index_is_refused_before_it_is_written(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE SCHEMA shop")
        conn.execute("CREATE TABLE shop.items (id bigint NOT NULL, qty integer, note text)")
    t = PostgresTarget(pg_url, "demo")
    with pytest.raises(TargetError, match=r"shop\.items.*no primary key or unique index on \(id\)") as refused:
        t.apply_cycle(1, {ITEMS.name: keyed(ITEMS, [{"id": 1}])}, {})
    assert refused.value.error_class == "schema"
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE UNIQUE INDEX ON shop.items (id)")  # a unique index serves as well as a key
    assert t.apply_cycle(1, {ITEMS.name: with_new(keyed(ITEMS, [{"id": 1}]), [True])}, {}).collisions == {}
    assert rows(pg_url, "shop.items", "id") == [(1, None, None)]


def test_log_order_batches_runs_of_one_kind_and_falls_back_to_each_change_in_order(pg_url: str) -> None:
    t = seeded(pg_url)  # holds 1, 2 (by hand) and 4
    inserts = [(n, "shop.items", "I", None, f'{{"id": {n + 10}, "qty": {n}}}') for n in range(1, 6)]
    held = (6, "shop.items", "I", None, '{"id": 2, "qty": 6}')  # the run's last insert collides
    then = (7, "shop.items", "U", '{"id": 2}', '{"id": 2, "qty": 7}')  # and the update after it sees its row
    deletes = [(8, "shop.items", "D", '{"id": 11}', None), (9, "shop.items", "D", '{"id": 12}', None)]
    load = t.apply_log_order(2, Part(0, 1, 1), {}, changes(*inserts, held, then, *deletes), {ITEMS.name: ITEMS})
    assert load.collisions == {ITEMS.name: {"insert": 1}}
    assert load.statements == {ITEMS.name: {"I": 6, "U": 1, "D": 2}}
    assert rows(pg_url, "shop.items", "id") == [
        (1, 1, None), (2, 7, None), (4, 4, None), (13, 3, None), (14, 4, None), (15, 5, None)
    ]  # fmt: skip


def test_a_refused_change_in_a_batch_is_named_by_its_own_lsn_and_key(pg_url: str) -> None:
    t = PostgresTarget(pg_url, "demo")
    t.apply_cycle(1, {ITEMS.name: keyed(ITEMS, [{"id": 1, "qty": 1}])}, {})
    with psycopg.connect(pg_url) as conn:
        conn.execute("ALTER TABLE shop.items ADD CONSTRAINT qty_positive CHECK (qty > 0)")
    run_ = [(n, "shop.items", "I", None, f'{{"id": {n + 10}, "qty": {-1 if n == 4 else n}}}') for n in range(1, 7)]
    with pytest.raises(TargetError, match=r"table shop\.items: insert at lsn 4 at key id=14 failed.*qty_positive"):
        t.apply_log_order(2, Part(0, 1, 1), {}, changes(*run_), {ITEMS.name: ITEMS})
    assert rows(pg_url, "shop.items", "id") == [(1, 1, None)]


# ------------------------------------------------------------------ through the engine


@pytest.mark.spark
@pytest.mark.parametrize("action", ["warn", "log"])
def test_a_row_added_behind_the_applier_is_a_collision_the_engine_reports_or_sets_aside(
    tmp_path: Path, spark: Any, pg_url: str, action: str
) -> None:
    """Row 6005 (transaction x600's) is inserted by hand between two runs; x600 then inserts it too."""
    write_workload(tmp_path / "pairs", set(), set(), seqs=range(1, 3))
    config = configured(tmp_path, pg_url, f"errors.actions.collision={action}")
    run(config, spark)
    with psycopg.connect(pg_url) as conn:
        conn.execute("INSERT INTO shop.items VALUES (6005, 7, 'by hand')")
    write_workload(tmp_path / "pairs", set(), set(), seqs=range(3, 5))
    summary = run(config, spark)
    report = summary.reports[-1]
    if action == "warn":  # applied as an upsert: the log's row wins, and it is counted
        assert report.collisions == {"shop.items": {"insert": 1}} and report.exceptions == []
        assert ids(pg_url) == ids_of(range(TRANSACTIONS))
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT qty, sku FROM shop.items WHERE id = 6005").fetchone() == (5, "s6005")
        assert collisions_line(read_summary(config).collisions).startswith("collisions: 1, applied as upserts")
    else:  # refused like a constraint: the enhanced retry finds x600, kept in the exceptions store
        assert report.collisions == {}
        assert [(e["xid"], e["class"]) for e in report.exceptions] == [("x600", "collision")]
        assert ids(pg_url) == ids_of(set(range(TRANSACTIONS)) - {600}) | {6005}
