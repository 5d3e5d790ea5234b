"""A mapping applied to a column in Arrow: what each value maps to, found by a hash join, not a Python loop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def looked_up(column: Any, mapping: Mapping[str, int]) -> Any:
    """Per value of ``column`` (an Arrow array or chunked array of strings), the integer ``mapping`` gives it.

    Returns:
        An int64 array shaped like ``column``: null for a value ``mapping`` does not hold.
    """
    keys = pa.array(list(mapping), column.type)
    return pc.take(pa.array(list(mapping.values()), pa.int64()), pc.index_in(column, keys))
