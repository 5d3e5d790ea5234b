"""Value checks of the spec's types, at their edges."""

from __future__ import annotations

import pytest

from applier.intermediate.schema import value_checker


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
