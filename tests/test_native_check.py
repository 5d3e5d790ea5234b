"""The C pass over row images vouches only for images the Python check accepts, and for the usual ones.

The reference is the exact Python check (msgspec's strict decoders with each
form's regular expression, :class:`~applier.intermediate.images.ImageRules`):
it shares no code with ``imagecheck.c``. Every image below, good or broken by
a seeded mutation, is put to both: the C pass may doubt a good image (the
Python check then decides), never vouch for a bad one.
"""

from __future__ import annotations

import json
import os
import random
import string
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from applier.intermediate import native
from applier.intermediate.images import ImageProblem, ImageRules, _check_row, check_rows
from applier.intermediate.schema import Column, TableDef

TYPES = (
    "boolean", "int", "bigint", "double", "string", "date", "timestamp", "binary",
    "decimal(10,2)", "decimal(5,0)", "decimal(3,3)", "decimal(38,10)",
)  # fmt: skip
TABLE = TableDef(
    "s.every",
    (
        Column("id", "bigint", False),
        *(Column(f"c_{t.replace('(', '_').replace(',', '_').rstrip(')')}", t, True) for t in TYPES),
        *(Column(f"n_{t.split('(')[0]}{i}", t, False) for i, t in enumerate(TYPES)),
        Column("ünï", "string", True),
    ),
    ("id",),
)
KEYLESS = TableDef("s.bag", (Column("d", "date", True), Column("v", "int", False)), ())

GOOD = {
    "boolean": [True, False],
    "int": [0, -1, 7, 2**31 - 1, -(2**31), 123456789, 1999999999],
    "bigint": [0, -0, 2**63 - 1, -(2**63), 10**17, 999999999999999999, 1000000000000000000],
    "double": [0, 1.5, -2.25e-7, 1e99, "NaN", "Infinity", "-Infinity", 3, 1.5e300, -2e-300, 5e-324],
    "string": ["", "plain", 'quote " and \\ back', "tab\tnewline\n", "ünïcödé ✓ 😀", "\x7f", "\u0001", "NaN"],
    "date": ["2024-02-29", "2000-02-29", "0001-01-01", "9999-12-31", "2023-04-30", "1900-02-28"],
    "timestamp": [
        "2026-11-26T18:00:00Z",
        "2026-11-26T18:00:00.1Z",
        "1970-01-01T00:00:00.123456Z",
        "2024-02-29T23:59:59.999999Z",
    ],
    "binary": ["", "AA==", "AAE=", "AAEC", "////", "+/+/AQ=="],
    "decimal(10,2)": ["0", "-0.5", "12345678.99", "007.10", "1.2000", "-00000000.00", "99999999"],
    "decimal(5,0)": ["0", "12345", "-1", "000012345", "7.000", "5."[:1]],
    "decimal(3,3)": ["0.123", "-0.5", "0", "000.100", "0.0"],
    "decimal(38,10)": ["1234567890123456789012345678.0123456789", "-1", "0.0000000001"],
}
BAD = {
    "boolean": [1, "true", 0],
    "int": [2**31, -(2**31) - 1, 1.0, "1", 10**10, True],
    "bigint": [2**63, -(2**63) - 1, 10**19, 1.5, "5"],
    "double": ["nan", "inf", "1.5", True, [1]],
    "string": [1, True, {"a": 1}],
    "date": [
        "2023-02-29",
        "1900-02-29",
        "2024-13-01",
        "2024-00-10",
        "2024-04-31",
        "24-01-01",
        "2024-1-01",
        "2024-01-01\n",
        "2024-01-01T00:00:00Z",
        20240101,
    ],
    "timestamp": [
        "2026-11-26T18:00:00",
        "2026-11-26T24:00:00Z",
        "2026-11-26T18:60:00Z",
        "2026-11-26T18:00:00.Z",
        "2026-11-26T18:00:00.1234567Z",
        "2026-11-26 18:00:00Z",
        "2026-11-26T18:00:00+00:00",
    ],
    "binary": ["A", "AA=", "AAE", "A===", "AA=A", "AA-_", "AA\n=="],
    "decimal(10,2)": ["1.005", "123456789.0", "1e3", "+1", ".5", "1.", "--1", "NaN", 1.5],
    "decimal(5,0)": ["123456", "1.5", "0.01"],
    "decimal(3,3)": ["1.0", "0.1234", "10"],
    "decimal(38,10)": ["123456789012345678901234567890", "0.00000000001"],
}


def _image(rng: random.Random, table: TableDef, good: bool = True) -> dict[str, object]:
    row: dict[str, object] = {}
    for c in table.columns:
        if c.nullable and rng.random() < 0.2:
            row[c.name] = None
        else:
            row[c.name] = rng.choice(GOOD[c.type])
    if not good:
        column = rng.choice(table.columns)
        row[column.name] = rng.choice(BAD[column.type] + ([] if column.nullable else [None]))
    items = list(row.items())
    if rng.random() < 0.3:
        rng.shuffle(items)
    return dict(items)


def _text(rng: random.Random, image: dict[str, object]) -> str:
    style = rng.random()
    if style < 0.4:
        return json.dumps(image, separators=(",", ":"), ensure_ascii=False)
    if style < 0.7:
        return json.dumps(image, ensure_ascii=rng.random() < 0.5)
    return json.dumps(image, indent=rng.choice([None, 1]), ensure_ascii=True).replace(": ", " :\t ")


def _mutate(rng: random.Random, text: str) -> str:
    """A few random edits: bytes changed, dropped, doubled or inserted, a key renamed, a value cut."""
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(chars) + 1)
        action = rng.random()
        if action < 0.3 and chars:
            chars[min(at, len(chars) - 1)] = rng.choice(string.printable + '\\"{}[],:ü\x00')
        elif action < 0.5 and chars:
            del chars[min(at, len(chars) - 1)]
        elif action < 0.7:
            chars.insert(at, rng.choice(['"', ",", "}", "\\", "0", "-", ".", "e", " ", "\\u0041", "\\ud800"]))
        elif chars:
            chars.insert(at, chars[min(at, len(chars) - 1)])
    return "".join(chars)


def _python_accepts(rules: ImageRules, text: str, after: bool) -> bool:
    try:
        _check_row("I", None, text, rules) if after else _check_row("D", text, None, rules)
    except ImageProblem:
        return False
    except UnicodeDecodeError:  # bytes that are not UTF-8: never arrive from Parquet, and never vouched for
        return False
    return True


def _native_vouches(rules: ImageRules, texts: list[str], after: bool) -> list[bool]:
    column = pa.array(texts, pa.string())
    rule = rules.native[0 if after else 1]
    vouched = []
    for i in range(len(texts)):
        one = column.slice(i, 1)  # a slice: offsets that do not start at 0
        vouched.append(native.first_doubt(one, np.zeros(1, np.int32), [rule]) == 1)
    return vouched


def test_the_library_is_built() -> None:
    # make setup compiles it; without it every image is checked in Python, and this suite would not test the C pass.
    assert native.LIBRARY is not None, f"{native.LIBRARY_PATH} is missing: run make setup"


@pytest.mark.parametrize("table", [TABLE, KEYLESS], ids=["every-type", "keyless"])
@pytest.mark.parametrize("after", [True, False], ids=["after", "before"])
def test_vouches_for_no_image_the_python_check_refuses(table: TableDef, after: bool) -> None:
    rng = random.Random(20261207)
    rules = ImageRules.of(table)
    texts = [_text(rng, _image(rng, table, good=rng.random() < 0.5)) for _ in range(1500)]
    texts += [_mutate(rng, t) for t in texts[:1500]]
    if not after:  # before images: the key columns alone, as a delete's
        key = set(table.primary_key) or set(table.column_names)
        texts += [_text(rng, {k: v for k, v in _image(rng, table).items() if k in key}) for _ in range(300)]
    accepted = [_python_accepts(rules, t, after) for t in texts]
    vouched = _native_vouches(rules, texts, after)
    wrongly = [t for t, ok, v in zip(texts, accepted, vouched, strict=True) if v and not ok]
    assert not wrongly, f"vouched for {len(wrongly)} refused images, such as {wrongly[:3]}"
    # Both verdicts occur, and the C pass vouches for most good images (else it saves nothing).
    assert 0.2 < sum(accepted) / len(texts) < 0.8
    assert sum(vouched) > 0.6 * sum(accepted)
    if after:  # the images that pass parse in C to the values Python gives them
        from applier.engine.identity import rules_of

        good = [t for t, ok in zip(texts, accepted, strict=True) if ok]
        parsed = native.parse(pa.array(good, pa.string()), rules_of(table)._native_parse, table.columns)
        assert parsed is not None
        python = rules_of(table).parse(good)
        assert all(_same(a, b) for a, b in zip(parsed, python, strict=True))


@pytest.mark.parametrize("type_name", sorted(GOOD))
def test_every_good_value_is_vouched_for_and_no_bad_one(type_name: str) -> None:
    table = TableDef("s.one", (Column("id", "int", False), Column("v", type_name, False)), ("id",))
    rules = ImageRules.of(table)
    good = [json.dumps({"id": 1, "v": v}, ensure_ascii=False) for v in GOOD[type_name]]
    bad = [json.dumps({"id": 1, "v": v}) for v in [*BAD[type_name], None]]
    assert all(_python_accepts(rules, t, True) for t in good)
    assert not any(_python_accepts(rules, t, True) for t in bad)
    assert _native_vouches(rules, good, True) == [True] * len(good)
    assert _native_vouches(rules, bad, True) == [False] * len(bad)


def test_doubts_what_it_does_not_judge_and_the_python_check_decides() -> None:
    columns = (Column("id", "int", False), Column("d", "date", True), Column("x", "double", True))
    table = TableDef("s.one", columns, ("id",))
    rules = ImageRules.of(table)
    unusual = [
        '{"id": 1, "x": null, "d": "2024-01-0\\u0031"}',  # an escaped character in a date
        '{"id": 1, "x": null, "d": "0000-02-29"}',  # the form's year 0 leap day
        '{"id": 1, "d": null, "x": 1.7976931348623157e308}',  # the largest double: near overflow, left to msgspec
        '{"id": 1, "d": null, "x": 1e400}',  # beyond it
        '\ufeff{"id": 1, "d": null, "x": null}',  # not JSON for either
    ]
    assert _native_vouches(rules, unusual, True) == [False] * 5
    assert [_python_accepts(rules, t, True) for t in unusual] == [True, True, True, False, False]


def test_escaped_column_names_are_read_as_their_names() -> None:
    table = TableDef("s.one", (Column("id", "int", False), Column("ünï", "string", True)), ("id",))
    rules = ImageRules.of(table)
    texts = [
        '{"i\\u0064": 1, "\\u00fcn\\u00ef": "x"}',  # both names escaped
        '{"id": 1, "\\u00fcnï": null}',  # partly
        '{"id": 1, "\\u00fcn": null}',  # another name: unknown
        '{"id": 1, "id": 2}',  # twice
        '{"\\ud800": 1}',  # a lone surrogate: left to msgspec
    ]
    assert _native_vouches(rules, texts, True) == [True, True, False, False, False]
    assert [_python_accepts(rules, t, True) for t in texts] == [True, True, False, False, False]


def test_check_rows_finds_the_same_first_wrong_row_either_way() -> None:
    rng = random.Random(7)
    rules = ImageRules.of(TABLE)
    for bad_at in (None, 0, 1, 517, 999):
        ops, befores, afters = [], [], []
        for i in range(1000):
            image = _image(rng, TABLE, good=i != bad_at)
            op = rng.choice("IUD")
            after = _text(rng, image) if op in "IU" else None
            before = _text(rng, {"id": image["id"]}) if op in "UD" else None
            if i == bad_at and op == "D":
                before = json.dumps({"id": "x"})
            ops.append(op)
            befores.append(before)
            afters.append(after)
        keys = ["s.every"] * len(ops)
        arrays = (pa.array(befores, pa.string()), pa.array(afters, pa.string()))
        python = check_rows(keys, ops, befores, afters, lambda _: rules)
        both = check_rows(keys, ops, befores, afters, lambda _: rules, arrays)
        if bad_at is None:
            assert python.problem is None and both.problem is None
        else:
            assert python.problem is not None and both.problem is not None
            assert python.problem[0] == both.problem[0] == bad_at
            assert (python.problem[1].code, python.problem[1].detail) == (both.problem[1].code, both.problem[1].detail)


PLAIN = TableDef(
    "s.plain",
    (
        Column("note", "string", True),
        Column("k2", "string", False),
        Column("x", "double", True),
        Column("k1", "bigint", False),
        Column("flag", "boolean", True),
    ),
    ("k1", "k2"),  # key order differs from column order
)


def test_identities_are_the_python_identities_byte_for_byte() -> None:
    from applier.engine.events import _keys, _texts
    from applier.engine.identity import rules_of

    rng = random.Random(11)
    strings = ["", "a", "ü😀", 'q"uote', "back\\slash", "tab\t", "\u0001", "/", "\x7f", "NaN"]
    texts: list[str | None] = []
    for _ in range(3000):
        row = {
            "note": rng.choice(strings),
            "k2": rng.choice(strings),
            "x": rng.choice([1.5, "NaN", None]),
            "k1": rng.choice([0, -0, 1, -(2**63), 2**63 - 1, 42]),
            "flag": rng.choice([True, False, None]),
        }
        text = _text(rng, dict(rng.sample(list(row.items()), len(row))))
        if rng.random() < 0.05:
            text = text.replace('"k1"', '"k\\u0031"', 1)  # an escaped name: read as its name
        if rng.random() < 0.03:
            text = text[:-1] + ', "k1": 7}'  # named twice: msgspec keeps the last, C leaves it to Python
        texts.append(None if rng.random() < 0.1 else text)
    texts[5] = '{"k1": -0, "k2": "z", "note": null, "x": null, "flag": null}'
    column = pa.array(texts, pa.string()).slice(3)  # offsets that do not start at 0
    names = ["s.plain"] * len(column)
    rules = {"s.plain": rules_of(PLAIN)}
    assert rules["s.plain"].native_keys is not None
    python = [None if t is None else rules["s.plain"].key_of(t) for t in texts[3:]]
    both = _keys(rules, names, _texts(column), None, column, pa.array(names, pa.string()))
    assert both.to_pylist() == python
    rule_of = np.zeros(len(column), np.int32)
    _, done = native.identities(column, rule_of, [rules["s.plain"].native_keys])
    assert 0.3 * len(column) < done.sum() < column.is_valid().true_count  # many in C, those with escapes in Python
    assert python[2] == b'[0,"z"]'


def test_typed_and_keyless_identities_are_the_python_identities_byte_for_byte() -> None:
    from applier.engine.events import _keys, _texts
    from applier.engine.identity import rules_of

    rng = random.Random(12)
    keyless = TableDef("s.every_bag", TABLE.columns, ())  # every type, no key: the whole row is its identity
    typed_key = TableDef("s.typed", TABLE.columns, tuple(c.name for c in TABLE.columns if c.name.startswith("n_")))
    for table in (keyless, typed_key, KEYLESS):
        texts = []
        for _ in range(1500):
            row = {
                c.name: None if c.nullable and rng.random() < 0.15 else rng.choice(GOOD[c.type] + EXTRA.get(c.type, []))
                for c in table.columns
            }
            texts.append(_text(rng, row))
        column = pa.array(texts, pa.string())
        rules = {table.name: rules_of(table)}
        assert rules[table.name].native_keys is not None
        python = [rules[table.name].key_of(t) for t in texts]
        _, done = native.identities(column, np.zeros(len(column), np.int32), [rules[table.name].native_keys])
        assert done.sum() > 150, table.name  # many in C; those with an escaped string (most, here) in Python
        names = pa.array([table.name] * len(column), pa.string())
        assert _keys(rules, names.to_pylist(), _texts(column), None, column, names).to_pylist() == python


def test_equal_typed_values_are_one_identity_in_c_and_in_python() -> None:
    from applier.engine.identity import rules_of

    table = TableDef(
        "s.forms",
        (Column("d", "decimal(10,2)", False), Column("x", "double", True), Column("t", "timestamp", True),
         Column("b", "binary", True), Column("day", "date", True)),
        (),
    )  # fmt: skip
    spellings = [
        '{"d": "1.5", "x": -0.0, "t": "2026-01-01T00:00:00.5Z", "b": "QR==", "day": "2026-01-02"}',
        '{"day": "2026-01-02", "d": "001.50", "x": 0, "t": "2026-01-01T00:00:00.500000Z", "b": "QQ=="}',
        '{"d": "1.50", "x": 0.0, "t": "2026-01-01T00:00:00.50Z", "b": "QQ==", "day": "2026-01-02"}',
    ]
    others = [
        '{"d": "1.51", "x": 0, "t": "2026-01-01T00:00:00.5Z", "b": "QQ==", "day": "2026-01-02"}',
        '{"d": "1.5", "x": "NaN", "t": "2026-01-01T00:00:00.5Z", "b": "QQ==", "day": "2026-01-02"}',
        '{"d": "1.5", "x": 0, "t": "2026-01-01T00:00:00.5Z", "b": "QUE=", "day": "2026-01-02"}',
        '{"d": "1.5", "x": 0, "t": null, "b": "QQ==", "day": "2026-01-02"}',
    ]
    rules = rules_of(table)
    column = pa.array(spellings + others, pa.string())
    written, done = native.identities(column, np.zeros(len(column), np.int32), [rules.native_keys])
    assert done.all()
    python = [rules.key_of(t) for t in spellings + others]
    assert written.to_pylist() == python
    assert len(set(python[: len(spellings)])) == 1 and len(set(python)) == 1 + len(others)
    nan = '{"d": "0", "x": "NaN", "t": null, "b": null, "day": null}'
    assert rules.key_of(nan) == rules.key_of(nan.replace('"NaN"', '"NaN" ')) != rules.key_of(nan.replace('"NaN"', "1"))


def _same(a: pa.Array, b: pa.Array) -> bool:
    """Equal values and types, two NaNs equal, -0.0 and 0.0 apart."""

    def norm(v: object) -> object:
        return repr(v) if isinstance(v, float) else v

    return a.type == b.type and [norm(v) for v in a.to_pylist()] == [norm(v) for v in b.to_pylist()]


EXTRA = {
    "double": [-0.0, 12345678901234567890123, 1e300, -1e-300, "-Infinity", 0.1, 2.5e-320],
    "string": ["é\u2028", "\\u0041", "a\\/b"],
    "timestamp": ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "1969-12-31T23:59:59.5Z",
                  "1900-03-01T12:34:56.000001Z"],
    "date": ["1969-12-31", "1600-02-29", "0004-02-29"],
    "binary": ["QR==", "QUJ=", "AAAA" * 50],
    "decimal(38,10)": ["-99999999999999999999999999.9999999999", "0.00000000010000", "-0"],
}  # fmt: skip
"""Values beyond GOOD's: extremes, and forms the C passes must read as Python does."""


def test_final_images_parse_in_c_to_the_python_values() -> None:
    from applier.engine.identity import rules_of

    rng = random.Random(3)
    extra = EXTRA
    images = []
    for _ in range(2000):
        row = {}
        for c in TABLE.columns:
            if rng.random() < 0.1:
                continue  # a column missing from the image: null
            pool = GOOD[c.type] + extra.get(c.type, [])
            row[c.name] = None if c.nullable and rng.random() < 0.15 else rng.choice(pool)
        images.append(_text(rng, row))
    column = pa.array(["{}", *images], pa.string()).slice(1)
    rules = rules_of(TABLE)
    python = rules.parse(column.to_pylist())
    parsed = native.parse(column, rules._native_parse, TABLE.columns)
    assert parsed is not None
    for c, a, b in zip(TABLE.columns, parsed, python, strict=True):
        assert _same(a, b), c.name
    assert all(_same(a, b) for a, b in zip(rules.parse_column(column), python, strict=True))


def test_final_images_c_does_not_expect_are_parsed_in_python() -> None:
    from applier.engine.identity import rules_of

    rules = rules_of(PLAIN)
    texts = ['{"k1": 1, "k2": "a", "k1": 3}', '{"k1": 2, "k2": "\\ud83d\\ude00", "flag": true}']
    column = pa.array(texts, pa.string())
    assert native.parse(column, rules._native_parse, PLAIN.columns) is None  # k1 named twice: msgspec keeps the last
    assert native.parse(column.slice(1), rules._native_parse, PLAIN.columns) is not None  # a surrogate pair
    parsed = rules.parse_column(column)
    assert parsed[1].to_pylist() == ["a", "😀"] and parsed[3].to_pylist() == [3, 2]
    assert parsed[4].to_pylist() == [None, True]


def test_no_final_images_parse_to_empty_typed_columns() -> None:
    from applier.engine.changes import arrow_type
    from applier.engine.identity import rules_of

    parsed = rules_of(TABLE).parse_column(pa.array([], pa.string()))
    assert [a.type for a in parsed] == [arrow_type(c.type) for c in TABLE.columns]
    assert all(len(a) == 0 for a in parsed)


def test_salts_are_zlib_crc32_modulo_the_spread() -> None:
    import zlib

    rng = random.Random(5)
    keys = [rng.randbytes(rng.randrange(0, 40)) for _ in range(5000)]
    spread = np.array([rng.choice([0, 1, 2, 7, 64]) for _ in keys], np.int32)
    column = pa.array([b"x", *keys], pa.binary()).slice(1)
    expected = [zlib.crc32(k) % s if s > 1 else 0 for k, s in zip(keys, spread.tolist(), strict=True)]
    assert native.salts(column, spread).tolist() == expected


def test_events_are_the_same_with_the_c_passes_and_without(monkeypatch: pytest.MonkeyPatch) -> None:
    from applier.engine.events import event_batch

    rng = random.Random(9)
    rows = []
    for i in range(3000):
        op = rng.choice("IUUD")
        image = _image(rng, TABLE) | {"id": rng.randrange(500)}
        after = _text(rng, image) if op in "IU" else None
        before = _text(rng, {"id": rng.randrange(500)}) if op in "UD" else None
        rows.append({"lsn": i + 1, "xid": f"t{i // 3}", "table": TABLE.name, "op": op, "before": before,
                     "after": after, "commit_lsn": 10_000 + i // 3, "seq": 1})  # fmt: skip
    batch = pa.RecordBatch.from_pylist(rows)
    tables, checks = {TABLE.name: TABLE}, {1: {TABLE.name: TABLE}}
    with_c = event_batch(batch, tables, {}, {TABLE.name: 5}, (10_500,), checks)
    monkeypatch.setattr(native, "LIBRARY", None)
    without = event_batch(batch, tables, {}, {TABLE.name: 5}, (10_500,), checks)
    assert with_c.equals(without)
    assert len(set(with_c.column("salt").to_pylist())) == 5


FUZZ = """
import ctypes, random, sys
import numpy as np, pyarrow as pa
from applier.intermediate import native
native.LIBRARY = native._declared(ctypes.CDLL(sys.argv[1]))
import test_native_check as t
rng = random.Random(1)
for table in (t.TABLE, t.KEYLESS, t.PLAIN, t.TableDef("s.every_bag", t.TABLE.columns, ())):
    identity = table.primary_key or table.column_names  # a keyless table's identity: every column
    check, keys = native.NativeRule(table, table.column_names), native.NativeRule(table, (), identity)
    for _ in range(600):
        text = t._text(rng, t._image(rng, table, good=rng.random() < 0.5))
        for image in (text[: rng.randrange(len(text) + 1)], t._mutate(rng, text), t._mutate(rng, t._mutate(rng, text))):
            column = pa.array([image], pa.string())
            native.first_doubt(column, np.zeros(1, np.int32), [check])
            native.identities(column, np.zeros(1, np.int32), [keys])
            native.parse(column, check, table.columns)
    salted = pa.array([rng.randbytes(rng.randrange(20)) for _ in range(100)], pa.binary())
    native.salts(salted, np.full(100, 7, np.int32))
"""


def test_the_c_passes_read_broken_and_cut_images_within_bounds(tmp_path: Path) -> None:
    # The passes meet checked images in the engine, but a bug must not read or write out of bounds on any input:
    # built with the address and undefined-behaviour sanitizers, aborting on the first report.
    import shutil
    import subprocess
    import sys

    compiler = shutil.which("gcc")
    assert compiler is not None, "gcc builds the C passes (make setup)"
    library = tmp_path / "libimages-sanitized.so"
    sources = sorted(str(p) for p in native.SOURCES.glob("*.c"))
    flags = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-shared", "-fPIC"]
    subprocess.run([compiler, *flags, "-o", str(library), *sources, "-lm"], check=True)
    runtimes = [
        subprocess.run(
            [compiler, f"-print-file-name={name}"], capture_output=True, text=True, check=True
        ).stdout.strip()
        for name in ("libasan.so", "libubsan.so")
    ]
    env = {**os.environ, "LD_PRELOAD": ":".join(runtimes), "ASAN_OPTIONS": "detect_leaks=0",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", FUZZ, str(library)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
