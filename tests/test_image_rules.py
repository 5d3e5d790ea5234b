"""Row images checked in bulk: the first wrong row of many, with what is wrong, and whole-value forms."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from applier.intermediate.images import Checked, ImageProblem, ImageRules, check_images, check_rows
from applier.intermediate.schema import Column, TableDef

WIDE = TableDef(
    "s.wide",
    (
        Column("id", "bigint", False),
        Column("n", "int", True),
        Column("d", "date", True),
        Column("at", "timestamp", True),
        Column("amount", "decimal(10,2)", True),
        Column("blob", "binary", True),
        Column("x", "double", True),
        Column("ok", "boolean", True),
        Column("note", "string", True),
    ),
    ("id",),
)
BAG = TableDef("s.bag", (Column("d", "date", True), Column("v", "int", True)), ())


def _good(rng: random.Random, i: int) -> dict[str, object]:
    return {
        "id": i,
        "n": rng.choice([None, rng.randint(-(2**31), 2**31 - 1)]),
        "d": rng.choice([None, "2024-02-29", "0001-01-01", "9999-12-31"]),
        "at": rng.choice([None, "2026-11-26T18:00:00Z", "2026-11-26T18:00:00.123456Z"]),
        "amount": rng.choice([None, "12345678.99", "-0.5", "007.10"]),
        "blob": rng.choice([None, "", "AAE=", "AAEC", "AA=="]),
        "x": rng.choice([None, 1.5, "NaN", "-Infinity", 3]),
        "ok": rng.choice([None, True, False]),
        "note": rng.choice([None, "", "ü\n", "2026-01-01"]),
    }


# What breaks a row, and the code the check gives: (op, before, after) from a good image.
BREAKS = {
    "date-with-newline": ("value-wrong-type", lambda g: ("I", None, {**g, "d": "2026-01-01\n"})),
    "no-such-day": ("value-wrong-type", lambda g: ("I", None, {**g, "d": "2026-02-30"})),
    "timestamp-not-utc": ("value-wrong-type", lambda g: ("U", {"id": g["id"]}, {**g, "at": "2026-01-01T01:00+01:00"})),
    "decimal-too-precise": ("value-wrong-type", lambda g: ("I", None, {**g, "amount": "1.005"})),
    "binary-unpadded": ("value-wrong-type", lambda g: ("D", {"id": g["id"], "blob": "AAE"}, None)),
    "int-too-big": ("value-wrong-type", lambda g: ("I", None, {**g, "n": 2**31})),
    "string-for-bigint": ("value-wrong-type", lambda g: ("U", {"id": str(g["id"])}, g)),
    "null-key": ("value-wrong-type", lambda g: ("I", None, {**g, "id": None})),
    "column-missing": ("column-missing", lambda g: ("I", None, {k: v for k, v in g.items() if k != "note"})),
    "key-missing": ("key-column-missing", lambda g: ("D", {"n": 1}, None)),
    "column-unknown": ("column-unknown", lambda g: ("I", None, {**g, "extra": 1})),
    "after-on-delete": ("image-unexpected", lambda g: ("D", {"id": g["id"]}, g)),
}


def _text(image: dict[str, object] | None) -> str | None:
    return None if image is None else json.dumps(image)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", sorted(BREAKS))
def test_the_first_wrong_row_is_found_among_many_with_what_is_wrong(name: str, seed: int) -> None:
    rng = random.Random(f"{name}-{seed}")
    count = rng.randint(1, 400)
    rows = []
    for i in range(count):
        good = _good(rng, i)
        rows.append(rng.choice([("I", None, good), ("U", {"id": i}, good), ("D", {"id": i, "n": good["n"]}, None)]))
    code, breaks = BREAKS[name]
    wrong = sorted(rng.sample(range(count), rng.randint(1, min(3, count))))
    for at in wrong:
        rows[at] = breaks(_good(rng, at))
    found = wide_rows(rows).problem
    assert found is not None
    assert (found[0], found[1].code) == (wrong[0], code)
    clean = wide_rows([r for i, r in enumerate(rows) if i not in wrong])
    assert clean.problem is None and clean.afters is not None and clean.befores is not None


def wide_rows(rows: list[tuple[str, dict[str, object] | None, dict[str, object] | None]]) -> Checked:
    """``rows`` (op, before, after) of ``s.wide`` checked in bulk."""
    befores, afters = [_text(r[1]) for r in rows], [_text(r[2]) for r in rows]
    return check_rows(["s.wide"] * len(rows), [r[0] for r in rows], befores, afters, lambda _: ImageRules.of(WIDE))


def test_rows_of_several_tables_give_the_first_wrong_row_of_all() -> None:
    names = ["s.bag", "s.wide", "s.bag", "s.wide", "s.bag"]
    afters = [{"d": None, "v": 1}, _good(random.Random(1), 1), {"d": "2026-13-01", "v": 2}, {"id": "x"}, {"d": None}]
    rules = {"s.bag": ImageRules.of(BAG), "s.wide": ImageRules.of(WIDE)}
    found = check_rows(names, ["I"] * 5, [None] * 5, [_text(a) for a in afters], rules.get).problem
    assert found is not None and found[0] == 2 and found[1].code == "value-wrong-type"
    # Only the rows with rules are checked: without the bag's, the wide table's second row is the first wrong.
    found = check_rows(names, ["I"] * 5, [None] * 5, [_text(a) for a in afters], {"s.wide": rules["s.wide"]}.get)
    assert found.problem is not None and found.problem[0] == 3


@pytest.mark.parametrize(
    ("column", "value"),
    [("d", "2026-01-01\n"), ("at", "2026-01-01T00:00:00Z\n"), ("amount", "1.50\n"), ("blob", "AAE=\n")],
)
def test_a_text_encoded_value_must_match_its_form_whole(column: str, value: str) -> None:
    image = {**_good(random.Random(0), 7), column: value}
    data = pa.table(
        {"lsn": [5], "xid": ["t1"], "table": ["s.wide"], "op": ["I"], "before": [None], "after": [json.dumps(image)]},
        schema=pa.schema([("lsn", pa.int64()), *((c, pa.string()) for c in ("xid", "table", "op", "before", "after"))]),
    )
    with pytest.raises(ImageProblem) as refused:
        check_images(data, {"s.wide": WIDE})
    assert refused.value.code == "value-wrong-type"
    assert str(refused.value).startswith(f"row lsn 5 (xid t1, table s.wide) after image: column {column}: ")
