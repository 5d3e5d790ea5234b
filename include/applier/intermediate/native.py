"""The C pass over row images (``imagecheck.c``), loaded with ctypes: which images it vouches for.

``make setup`` compiles ``imagecheck.c`` into ``libimagecheck.so`` beside
this module (:func:`build`). The pass reads an Arrow string column's buffers
as they are, and finds the first row whose image it cannot vouch for: every
row before it surely passes the spec's check of its table
(:mod:`applier.intermediate.images`), so only that row and the rest are
decoded in Python. Without the library (:data:`LIBRARY` None), every image is
checked in Python, as before it existed: the verdicts are the same, only slower.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from applier.intermediate.schema import TableDef, decimal_precision_scale

SOURCE = Path(__file__).with_name("imagecheck.c")
LIBRARY_PATH = Path(__file__).with_name("libimagecheck.so")

_TYPES = {"boolean": 0, "int": 1, "bigint": 2, "double": 3, "string": 4, "date": 5, "timestamp": 6, "binary": 7}
_DECIMAL = 8
_MAX_COLUMNS = 4096  # as imagecheck.c's MAX_COLUMNS: a wider table's images are all left to Python
_OFFSETS = {pa.string(): 0, pa.large_string(): 1}


def build(compiler: str = "cc") -> Path:
    """Compile the library beside this module (``make setup`` runs ``python -m applier.intermediate.native``)."""
    part = LIBRARY_PATH.with_suffix(f".{os.getpid()}.tmp")
    command = [compiler, "-O2", "-Wall", "-Wextra", "-shared", "-fPIC", "-o", str(part), str(SOURCE)]
    subprocess.run(command, check=True)
    os.replace(part, LIBRARY_PATH)
    return LIBRARY_PATH


def _load() -> ctypes.CDLL | None:
    if os.environ.get("APPLIER_NATIVE_CHECK") == "off" or not LIBRARY_PATH.exists():
        return None
    library = ctypes.CDLL(str(LIBRARY_PATH))
    library.ic_rule_new.restype = ctypes.c_void_p
    library.ic_rule_new.argtypes = [ctypes.c_int32, *[ctypes.c_char_p] * 6, ctypes.c_void_p]
    library.ic_rule_free.argtypes = [ctypes.c_void_p]
    library.ic_first_doubt.restype = ctypes.c_int64
    library.ic_first_doubt.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_void_p, ctypes.c_void_p,
    ]  # fmt: skip
    return library


LIBRARY = _load()
"""The loaded library; None when not built (or ``APPLIER_NATIVE_CHECK=off``): images are then checked in Python."""


class NativeRule:
    """One table definition's image rule in C: every column's type and nullability, which columns must be present."""

    def __init__(self, table: TableDef, required: Collection[str]) -> None:
        assert LIBRARY is not None
        columns = table.columns
        types = bytes(_DECIMAL if decimal_precision_scale(c.type) else _TYPES[c.type] for c in columns)
        scales = [decimal_precision_scale(c.type) or (0, 0) for c in columns]
        names = [c.name.encode() for c in columns]
        ends = np.cumsum([len(n) for n in names], dtype=np.int32)
        self._ends = ends  # kept alive while C copies from it
        pointer = LIBRARY.ic_rule_new(
            len(columns) if len(columns) <= _MAX_COLUMNS else -1,
            types,
            bytes(c.nullable for c in columns),
            bytes(c.name in required for c in columns),
            bytes(p for p, _ in scales),
            bytes(s for _, s in scales),
            b"".join(names),
            ends.ctypes.data,
        )
        self.pointer: int | None = pointer  # None (NULL): C vouches for no image of the table

    def __del__(self) -> None:
        if LIBRARY is not None and self.pointer:
            LIBRARY.ic_rule_free(self.pointer)
            self.pointer = None


def first_doubt(images: pa.Array, rule_of: np.ndarray, rules: Sequence[NativeRule]) -> int:
    """The first row of ``images`` the C pass does not vouch for, or ``len(images)`` when it vouches for all.

    Row ``i`` is checked against ``rules[rule_of[i]]`` (``rule_of[i]`` negative:
    not checked, nor is a null image). A column that is not plain strings
    (a string view, say) is vouched for nowhere.
    """
    assert LIBRARY is not None
    count = len(images)
    wide = _OFFSETS.get(images.type)
    if count == 0 or images.null_count == count or (rule_of < 0).all():
        return count
    if wide is None:
        return 0
    validity, offsets, data = images.buffers()
    table = (ctypes.c_void_p * max(len(rules), 1))(*[r.pointer for r in rules])
    indices = np.ascontiguousarray(rule_of, dtype=np.int32)
    found = LIBRARY.ic_first_doubt(
        data.address if data is not None else None,
        offsets.address,
        wide,
        validity.address if validity is not None and images.null_count else None,
        images.offset,
        count,
        indices.ctypes.data,
        table,
    )
    return count if found < 0 else int(found)


if __name__ == "__main__":
    print(build(*sys.argv[1:]))
