"""The compile job's Python steps on Arrow batches, without Spark: identities, events, typed final rows."""

from __future__ import annotations

import datetime as dt
import gc
import json
import math
import sys
import zipfile
import zipimport
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from applier.engine.events import _texts, event_batch, event_batches
from applier.engine.identity import (
    COUNT,
    NET_OP,
    chunk_batches,
    final_table,
    rules_of,
)
from applier.engine.netting import table_spreads
from applier.engine.spill import read_spill
from applier.engine.worker_path import COLLECTOR_THRESHOLDS
from applier.intermediate.schema import Column, TableDef

KEYED = TableDef(
    "s.keyed",
    (Column("id", "bigint", False), Column("price", "decimal(6,2)", True), Column("note", "string", True)),
    ("id",),
)
BY_VALUE = TableDef("s.bag", (Column("x", "double", True), Column("at", "timestamp", True)), ())
COMPOSITE = TableDef("s.comp", (Column("a", "decimal(4,1)", False), Column("b", "binary", False)), ("a", "b"))
TABLES = {t.name: t for t in (KEYED, BY_VALUE, COMPOSITE)}


def rows(*changes: tuple[str, str, dict[str, Any] | None, dict[str, Any] | None, int, int]) -> pa.RecordBatch:
    """Committed rows: ``(table, op, before, after, commit_lsn, lsn)``."""
    return pa.RecordBatch.from_pydict(
        {
            "table": [c[0] for c in changes],
            "op": [c[1] for c in changes],
            "before": [None if c[2] is None else json.dumps(c[2]) for c in changes],
            "after": [None if c[3] is None else json.dumps(c[3]) for c in changes],
            "commit_lsn": pa.array([c[4] for c in changes], pa.int64()),
            "lsn": pa.array([c[5] for c in changes], pa.int64()),
        }
    )


def test_keys_are_equal_exactly_for_equal_typed_values() -> None:
    keyed, comp, bag = rules_of(KEYED), rules_of(COMPOSITE), rules_of(BY_VALUE)
    assert keyed.key('{"id": 7, "note": "x"}') == keyed.key('{"note": "y", "id": 7}') == b"[7]"
    assert keyed.key('{"id": 7}') != keyed.key('{"id": 8}')
    assert comp.key('{"a": "1.5", "b": "AAE="}') == comp.key('{"a": "1.50", "b": "AAE="}')
    assert comp.key('{"a": "-0.0", "b": "AA=="}') == comp.key('{"a": "0", "b": "AA=="}')
    assert comp.key('{"a": "1.5", "b": "AAE="}') != comp.key('{"a": "1.5", "b": "AAI="}')
    wide = rules_of(TableDef("s.w", (Column("d", "decimal(38,10)", False),), ("d",)))
    most = "9" * 28 + "." + "9" * 10  # 38 digits: more than Python's default decimal context holds
    at_scale = f"[{'9' * 38}]".encode()  # the decimal's integer at its scale, 10
    assert wide.key(f'{{"d": "{most}"}}') == wide.key(f'{{"d": "{most}000"}}') == at_scale
    same_instant = ('{"x": 1, "at": "2026-01-01T00:00:00Z"}', '{"x": 1.0, "at": "2026-01-01T00:00:00.000000Z"}')
    assert bag.key(same_instant[0]) == bag.key(same_instant[1])
    assert bag.key('{"x": "NaN", "at": null}') == bag.key('{"x": "NaN", "at": null}')
    assert bag.key('{"x": -0.0, "at": null}') == bag.key('{"x": 0.0, "at": null}')
    assert bag.key('{"x": "Infinity", "at": null}') != bag.key('{"x": "-Infinity", "at": null}')
    assert bag.key('{"x": null, "at": null}') != bag.key('{"x": 0, "at": null}')


def test_events_of_each_operation() -> None:
    batch = rows(
        ("s.keyed", "I", None, {"id": 1, "price": "1.00", "note": None}, 10, 1),
        ("s.keyed", "U", {"id": 1}, {"id": 1, "price": "2.00", "note": "a"}, 10, 2),
        ("s.keyed", "U", {"id": 1}, {"id": 2, "price": "2.00", "note": "a"}, 10, 3),
        ("s.keyed", "D", {"id": 2}, None, 10, 4),
        ("s.bag", "U", {"x": 1, "at": None}, {"x": 1, "at": None}, 10, 5),
        ("s.keyed", "T", None, None, 10, 6),
    )
    events = sorted(event_batch(batch, TABLES, {}).to_pylist(), key=lambda e: (e["lsn"], e["present"]))  # any order
    summary = [(e["key"], e["present"], e["existed"], e["n"], e["lsn"]) for e in events]
    assert summary == [
        (b"[1]", True, False, 1, 1),
        (b"[1]", True, True, 1, 2),
        (b"[1]", False, True, -1, 3),  # a key move: the old key goes...
        (b"[2]", True, False, 1, 3),  # ...and the new one comes
        (b"[2]", False, True, -1, 4),
        (b'["3ff0000000000000",null]', False, True, -1, 5),  # a keyless update always removes one copy...
        (b'["3ff0000000000000",null]', True, False, 1, 5),  # ...and adds one, even of the same value
    ]
    assert events[1]["image"] == json.dumps({"id": 1, "price": "2.00", "note": "a"})


def test_rows_at_or_before_the_last_truncate_give_no_events() -> None:
    batch = rows(
        ("s.keyed", "I", None, {"id": 1, "price": None, "note": None}, 10, 1),
        ("s.keyed", "I", None, {"id": 2, "price": None, "note": None}, 20, 11),
        ("s.keyed", "I", None, {"id": 3, "price": None, "note": None}, 20, 13),
        ("s.bag", "I", None, {"x": 1, "at": None}, 10, 2),
    )
    events = event_batch(batch, TABLES, {"s.keyed": (20, 12)}).to_pylist()
    one = b'["3ff0000000000000",null]'  # 1.0's bits
    assert sorted((e["table"], e["key"]) for e in events) == [("s.bag", one), ("s.keyed", b"[3]")]


def _aggregated(*identities: tuple[bool, bool, dict[str, Any] | None, int]) -> pa.Table:
    return pa.table(
        {
            "existed": [i[0] for i in identities],
            "present": [i[1] for i in identities],
            "image": [None if i[2] is None else json.dumps(i[2]) for i in identities],
            "n": pa.array([i[3] for i in identities], pa.int64()),
        }
    )


def test_final_rows_of_a_keyed_table_are_typed_net_operations() -> None:
    aggregated = _aggregated(
        (False, True, {"id": 1, "price": "1.5", "note": "new"}, 1),
        (True, True, {"id": 2, "price": "-0.25", "note": None}, 1),
        (True, False, {"id": 3}, -1),
        (False, False, {"id": 4}, 0),  # inserted and deleted within the cycle: nothing
    )
    final = final_table(rules_of(KEYED), False, aggregated)
    assert final.column_names == [NET_OP, "id", "price", "note"]
    assert final.schema.field("price").type == pa.decimal128(6, 2)
    assert final.to_pylist() == [
        {NET_OP: "I", "id": 1, "price": Decimal("1.50"), "note": "new"},
        {NET_OP: "U", "id": 2, "price": Decimal("-0.25"), "note": None},
        {NET_OP: "D", "id": 3, "price": None, "note": None},
    ]
    after_truncate = final_table(rules_of(KEYED), True, aggregated)
    assert after_truncate.column(NET_OP).to_pylist() == ["I", "I"]  # nothing existed before the truncate


def test_final_rows_of_a_keyless_table_are_signed_copy_counts() -> None:
    aggregated = _aggregated(
        (True, True, {"x": "NaN", "at": "2026-01-02T03:04:05.123456Z"}, 2),
        (True, False, {"x": -1.5, "at": None}, -1),
        (True, True, {"x": 3, "at": None}, 0),
    )
    final = final_table(rules_of(BY_VALUE), False, aggregated)
    assert final.column_names == ["x", "at", COUNT]
    values = final.to_pylist()
    assert math.isnan(values[0]["x"]) and values[0][COUNT] == 2
    assert values[0]["at"] == dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)
    assert values[1:] == [{"x": -1.5, "at": None, COUNT: -1}]


def test_chunks_hold_one_table_each_in_at_most_the_chunk_size(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import applier.engine.identity as identity

    monkeypatch.setattr(identity, "CHUNK_ROWS", 2)
    keyed = [
        {"table": "s.keyed", "group": 0, "existed": False, "present": True, "image": json.dumps({"id": i}), "n": 1}
        for i in range(5)
    ]
    bag = [
        {
            "table": "s.bag",
            "group": 0,
            "existed": True,
            "present": True,
            "image": json.dumps({"x": 1, "at": None}),
            "n": 1,
        }
    ]
    later = [{**bag[0], "group": 1}]  # the same table in the next group: a chunk of its own
    schema = pa.schema(
        [
            ("table", pa.string()),
            ("group", pa.int32()),
            ("existed", pa.bool_()),
            ("present", pa.bool_()),
            ("image", pa.string()),
            ("n", pa.int64()),
        ]
    )
    batches = [
        pa.RecordBatch.from_pylist(keyed[:3], schema),
        pa.RecordBatch.from_pylist(keyed[3:] + bag + later, schema),
    ]
    chunks = [c.to_pylist()[0] for c in chunk_batches(TABLES, frozenset(), str(tmp_path), batches)]
    assert [(c["table"], c["group"], c["rows"], c["I"], c["U"], c["D"]) for c in chunks] == [
        ("s.keyed", 0, 3, 3, 0, 0),
        ("s.keyed", 0, 2, 2, 0, 0),
        ("s.bag", 0, 1, 1, 0, 0),
        ("s.bag", 1, 1, 1, 0, 0),
    ]
    first = pa.Table.from_batches(list(read_spill(chunks[0]["path"])))
    assert first.column("id").to_pylist() == [0, 1, 2] and first.nbytes == chunks[0]["bytes"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(c["path"]).name for c in chunks)


def test_an_event_belongs_to_the_group_its_commit_falls_in() -> None:
    batch = rows(*(("s.keyed", "I", None, {"id": i, "price": None, "note": None}, 10 * i, i) for i in range(6)))
    events = event_batch(batch, TABLES, {}, bounds=[20, 40]).to_pylist()  # groups start at commits 20 and 40
    assert [e["group"] for e in events] == [0, 0, 1, 1, 2, 2]
    assert {e["group"] for e in event_batch(batch, TABLES, {}).to_pylist()} == {0}


def test_a_busy_tables_events_are_salted_by_key_the_same_way_everywhere() -> None:
    batch = rows(*(("s.keyed", "I", None, {"id": i, "price": None, "note": None}, 10, i) for i in range(200)))
    spread = event_batch(batch, TABLES, {}, {"s.keyed": 4}).to_pylist()
    salts = {e["key"]: e["salt"] for e in spread}
    assert set(salts.values()) == {0, 1, 2, 3}  # 200 keys fill every one of 4 salts
    again = event_batch(batch, TABLES, {}, {"s.keyed": 4}).to_pylist()
    assert {e["key"]: e["salt"] for e in again} == salts  # a key's salt does not depend on the process
    # Salts are a function of the key: a key's insert, update and delete share one.
    moves = rows(
        ("s.keyed", "U", {"id": 7}, {"id": 7, "price": "1.00", "note": None}, 11, 300),
        ("s.keyed", "D", {"id": 7}, None, 12, 301),
    )
    assert {e["salt"] for e in event_batch(moves, TABLES, {}, {"s.keyed": 4}).to_pylist()} == {salts[b"[7]"]}
    assert {e["salt"] for e in event_batch(batch, TABLES, {}).to_pylist()} == {0}  # not spread: all in one


def test_only_tables_with_a_large_share_of_the_rows_are_spread() -> None:
    weights = {"big": 900.0, "mid": 80.0, **{f"t{i}": 1.0 for i in range(20)}}
    spreads = table_spreads(weights, 8)
    assert spreads == {"big": 15, "mid": 2}  # ceil(2 * 8 * share); the twenty small tables meet in one partition each
    assert table_spreads({"only": 5.0}, 8) == {"only": 16}  # at most twice the partitions
    assert table_spreads(weights, 1) == {} and table_spreads({}, 8) == {}


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector's thresholds as they were, and nothing frozen, after a test that runs what Spark's workers run."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


@pytest.mark.usefixtures("collector")
def test_spark_workers_forget_cached_zip_importers_and_the_jar(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jar = str(tmp_path / "spark-core_2.13.jar")
    archive = tmp_path / "lib.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("pkg/__init__.py", "")
    inner = f"{archive}/pkg"
    monkeypatch.setattr(sys, "path", [sys.path[0], jar, *sys.path[1:]])
    monkeypatch.setattr(sys, "path_importer_cache", {**sys.path_importer_cache, jar: None})
    sys.path_importer_cache[inner] = zipimport.zipimporter(inner)  # a package imported from an archive
    kept = [p for p in sys.path if p != jar]
    list(event_batches(TABLES, {}, {}, [], None, None, []))  # what Spark runs in its workers trims them first
    assert sys.path == kept and jar not in sys.path_importer_cache and inner not in sys.path_importer_cache
    assert not any(isinstance(f, zipimport.zipimporter) for f in sys.path_importer_cache.values())


@pytest.mark.usefixtures("collector")
def test_spark_workers_run_the_collector_less_often() -> None:
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    list(event_batches(TABLES, {}, {}, [], None, None, []))
    assert gc.get_threshold() == COLLECTOR_THRESHOLDS
    assert COLLECTOR_THRESHOLDS[0] > 700 and gc.isenabled()
    frozen = gc.get_freeze_count()
    assert frozen > 1000  # what the imports left alive is out of the collector's sight
    list(event_batches(TABLES, {}, {}, [], None, None, []))
    assert gc.get_freeze_count() <= frozen  # once per worker (a frozen object may have been freed since)


DATED = TableDef(
    "s.dated",
    (Column("day", "date", False), Column("at", "timestamp", False), Column("v", "int", True)),
    ("day", "at"),
)
EVERY_TYPE = TableDef(
    "s.every",
    tuple(
        Column(name, kind, True)
        for name, kind in [("b", "boolean"), ("i", "int"), ("g", "bigint"), ("x", "double"), ("s", "string"),
                           ("d", "date"), ("t", "timestamp"), ("y", "binary"), ("m", "decimal(9,3)")]
    ),
    (),
)  # fmt: skip
CHECKED_TABLES = {t.name: t for t in (KEYED, BY_VALUE, COMPOSITE, DATED, EVERY_TYPE)}


def _spellings(rng: Any) -> dict[str, Any]:
    """A random value of each type, in one of the spellings that name the same typed value."""
    return {
        "boolean": rng.choice([True, False]),
        "int": rng.choice([0, -1, 2**31 - 1]),
        "bigint": rng.choice([7, 2**63 - 1]),
        "double": rng.choice([1, 1.0, -0.0, 0.0, "NaN", "Infinity", 2.5]),
        "string": rng.choice(["", "a", "ü", "2026-01-01"]),
        "date": rng.choice(["2024-02-29", "0001-01-01"]),
        "timestamp": rng.choice(["2026-01-01T00:00:00Z", "2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:00.5Z"]),
        "binary": rng.choice(["", "AAE=", "AAEC"]),
        "decimal": rng.choice(["1.5", "1.50", "-0.0", "0", "007.100"]),
    }


def _image(rng: Any, table: TableDef, only: tuple[str, ...] = ()) -> dict[str, Any]:
    values = _spellings(rng)
    image = {}
    for column in table.columns:
        if only and column.name not in only:
            continue
        kind = "decimal" if column.type.startswith("decimal") else column.type
        image[column.name] = None if column.nullable and rng.random() < 0.2 else values[kind]
    return image


def test_identities_from_the_checks_decoding_equal_those_decoded_again() -> None:
    import random

    rng = random.Random(5)
    changes = []
    for lsn in range(600):
        table = CHECKED_TABLES[rng.choice(sorted(CHECKED_TABLES))]
        keys = table.primary_key or table.column_names
        op = rng.choice("IUD")
        before = _image(rng, table, tuple(keys)) if op != "I" else None
        after = _image(rng, table) if op != "D" else None
        changes.append((table.name, op, before, after, 10 + lsn // 7, lsn))
    batch = rows(*changes)
    checked = pa.RecordBatch.from_arrays(
        [*batch.columns, pa.array(["x1"] * batch.num_rows), pa.array([1] * batch.num_rows, pa.int64())],
        names=[*batch.schema.names, "xid", "seq"],
    )
    plain = event_batch(batch, CHECKED_TABLES, {}).to_pylist()
    assert len(plain) > 600 and len({e["key"] for e in plain}) > 20
    assert event_batch(checked, CHECKED_TABLES, {}, checks={1: CHECKED_TABLES}).to_pylist() == plain
    # A pair that defines a table otherwise than the cycle (a column added since) has its keys decoded again.
    older = {**CHECKED_TABLES, "s.bag": TableDef("s.bag", BY_VALUE.columns[:1], ())}
    bag = [c for c in changes if c[0] == "s.bag"]
    narrow = [(t, op, b and {"x": b["x"]}, a and {"x": a["x"]}, c, lsn) for t, op, b, a, c, lsn in bag]
    narrowed = rows(*narrow)
    checked = pa.RecordBatch.from_arrays(
        [*narrowed.columns, pa.array(["x1"] * len(narrow)), pa.array([1] * len(narrow), pa.int64())],
        names=[*narrowed.schema.names, "xid", "seq"],
    )
    again = event_batch(checked, CHECKED_TABLES, {}, checks={1: older}).to_pylist()
    assert again == event_batch(narrowed, CHECKED_TABLES, {}).to_pylist() and len(again) >= len(bag)


def test_a_batchs_texts_are_views_of_its_values_nulls_and_slices_included() -> None:
    values = ['{"id": 1}', None, "", '{"name": "é\\u00e9"}', None, '{"id": 22}']
    for kind in (pa.string(), pa.large_string(), pa.string_view()):
        column = pa.array(values, kind)
        for start, length in [(0, 6), (1, 4), (3, 3), (1, 1)]:
            texts = _texts(column.slice(start, length))
            as_text = [t if t is None or isinstance(t, str) else bytes(t).decode() for t in texts]
            assert as_text == values[start : start + length]
        assert list(_texts(pa.array([None, None], kind))) == [None, None]
