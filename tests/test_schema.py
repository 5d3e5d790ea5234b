"""Value checks of the spec's types, at their edges; table definitions as Spark ships them."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from applier.intermediate.schema import Column, TableDef, value_checker


@pytest.mark.parametrize(
    ("type_name", "value", "fits"),
    [
        ("decimal(4,2)", "12.50", True),
        ("decimal(4,2)", "0012.5", True),
        ("decimal(4,2)", "12.500", True),
        ("decimal(4,2)", "-0.00", True),
        ("decimal(4,2)", "12.505", False),
        ("decimal(4,2)", "123.5", False),
        ("decimal(4,2)", "1.", False),
        ("decimal(4,2)", ".5", False),
        ("decimal(4,2)", "-", False),
        ("decimal(4,2)", "+1.00", False),
        ("decimal(4,2)", "1e2", False),
        ("decimal(4,2)", 12.5, False),
        ("decimal(2,2)", "0.99", True),
        ("decimal(2,2)", "1.00", False),
        ("decimal(3,0)", "999", True),
        ("decimal(3,0)", "5.0", True),
        ("decimal(3,0)", "5.1", False),
        ("decimal(3,0)", "1000", False),
        ("date", "2024-02-29", True),
        ("date", "2023-02-29", False),
        ("date", "2023-04-31", False),
        ("date", "0000-01-01", False),
        ("date", "2023-1-01", False),
        ("timestamp", "2024-02-29T23:59:59.999999Z", True),
        ("timestamp", "2026-11-21T10:00:00Z", True),
        ("timestamp", "2026-11-21T24:00:00Z", False),
        ("timestamp", "2026-11-21T10:60:00Z", False),
        ("timestamp", "2026-11-21T10:00:00.0000001Z", False),
        ("timestamp", "2026-11-21 10:00:00Z", False),
        ("double", "NaN", True),
        ("double", "-Infinity", True),
        ("double", "Inf", False),
        ("double", 7, True),
        ("double", [1], False),
        ("int", 2**31 - 1, True),
        ("int", -(2**31) - 1, False),
        ("bigint", 1.0, False),
        ("boolean", 0, False),
        ("binary", "AP8=", True),
        ("binary", "AP8", False),
        ("string", "", True),
    ],
)
def test_a_value_fits_its_type_exactly_at_the_edges(type_name: str, value: object, fits: bool) -> None:
    assert value_checker(type_name)(value) is fits


def test_a_definition_pickles_as_itself_and_unpickles_once_per_process() -> None:
    """Spark ships a cycle's definitions to every task: each comes back equal, and one object per definition."""
    columns = (
        Column("id", "bigint", False),
        Column('prénom "x"', "string", True),
        Column("amount", "decimal(38,9)", True),
    )
    keyed, keyless = TableDef("s.t", columns, ("id",)), TableDef("s.u", columns, ())
    shipped = pickle.dumps({1: {"s.t": keyed, "s.u": keyless}, 2: {"s.t": keyed}})
    first, again = pickle.loads(shipped), pickle.loads(shipped)
    assert first == {1: {"s.t": keyed, "s.u": keyless}, 2: {"s.t": keyed}}
    assert first[1]["s.u"].primary_key == () and first[2]["s.t"].column('prénom "x"').nullable
    assert first[1]["s.t"] is first[2]["s.t"] is again[1]["s.t"]
    assert pickle.loads(pickle.dumps(replace(keyed, primary_key=("amount",)))) != keyed
