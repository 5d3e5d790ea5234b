"""The C passes over row images (``csrc/``), loaded with ctypes: which images they vouch for, and identities.

``make setup`` compiles ``csrc/*.c`` into ``libimages.so`` beside this
module (:func:`build`). Both passes read an Arrow string column's buffers as
they are, without making a Python object:

- :func:`first_doubt` finds the first row whose image the pass cannot vouch
  for: every row before it surely passes the spec's check of its table
  (:mod:`applier.intermediate.images`), so only that row and the rest are
  decoded in Python;
- :func:`identities` writes the identity of each image (its key's columns, or
  all of a keyless table's), the same bytes as
  :meth:`applier.engine.identity.TableRules.key`, and leaves to it the images
  it does not expect (a string with an escape, say);
- :func:`parse` parses a table's final images into its typed Arrow columns,
  the values :meth:`applier.engine.identity.TableRules.parse` gives, or leaves
  the whole chunk to it;
- :func:`salts` is ``zlib.crc32`` of each identity modulo its table's spread.

Without the library (:data:`LIBRARY` None), all of it is done in Python, as
before it existed: the verdicts and identities are the same, only slower.
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
import pyarrow.compute as pc

from applier.intermediate.schema import Column, TableDef, decimal_precision_scale

SOURCES = Path(__file__).with_name("csrc")
LIBRARY_PATH = Path(__file__).with_name("libimages.so")

_TYPES = {"boolean": 0, "int": 1, "bigint": 2, "double": 3, "string": 4, "date": 5, "timestamp": 6, "binary": 7}
_DECIMAL = 8
_MAX_COLUMNS = 4096  # as csrc/images.h's MAX_COLUMNS: a wider table's images are all left to Python
MAX_KEYS = 256  # as csrc/images.h's MAX_KEYS: an identity of more columns is written in Python
_OFFSETS = {pa.string(): 0, pa.large_string(): 1}


def build(compiler: str = "cc") -> Path:
    """Compile the library beside this module (``make setup`` runs ``python -m applier.intermediate.native``)."""
    part = LIBRARY_PATH.with_suffix(f".{os.getpid()}.tmp")
    sources = sorted(str(path) for path in SOURCES.glob("*.c"))
    command = [compiler, "-O2", "-Wall", "-Wextra", "-shared", "-fPIC", "-o", str(part), *sources, "-lm"]
    subprocess.run(command, check=True)
    os.replace(part, LIBRARY_PATH)
    return LIBRARY_PATH


def _load() -> ctypes.CDLL | None:
    if os.environ.get("APPLIER_NATIVE") == "off" or not LIBRARY_PATH.exists():
        return None
    try:
        library = ctypes.CDLL(str(LIBRARY_PATH))
        return _declared(library)
    except (OSError, AttributeError):  # built for another version of the sources: make setup builds it again
        return None


def _declared(library: ctypes.CDLL) -> ctypes.CDLL:
    library.ic_rule_new.restype = ctypes.c_void_p
    library.ic_rule_new.argtypes = [ctypes.c_int32, *[ctypes.c_char_p] * 6, ctypes.c_void_p, ctypes.c_int32,
                                    ctypes.c_void_p]  # fmt: skip
    library.ic_rule_free.argtypes = [ctypes.c_void_p]
    library.ic_first_doubt.restype = ctypes.c_int64
    library.ic_first_doubt.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_void_p, ctypes.c_void_p,
    ]  # fmt: skip
    library.ic_parse.restype = ctypes.c_int32
    library.ic_parse.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
    ]  # fmt: skip
    library.ic_salts.restype = None
    library.ic_salts.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 2
    # Named for its identities' forms: a library built before typed identities lacks it, and is not used.
    library.ic_typed_identities.restype = ctypes.c_int64
    library.ic_typed_identities.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
    ]  # fmt: skip
    return library


LIBRARY = _load()
"""The loaded library; None when not built (or ``APPLIER_NATIVE=off``): images are then read in Python only."""


class NativeRule:
    """One table definition's image rule in C: every column's type and nullability, which columns must be present.

    ``keys`` names the identity's columns, in key order, for :func:`identities` (none: it writes no identity).
    """

    def __init__(self, table: TableDef, required: Collection[str], keys: Sequence[str] = ()) -> None:
        assert LIBRARY is not None
        columns = table.columns
        types = bytes(_DECIMAL if decimal_precision_scale(c.type) else _TYPES[c.type] for c in columns)
        scales = [decimal_precision_scale(c.type) or (0, 0) for c in columns]
        names = [c.name.encode() for c in columns]
        ends = np.cumsum([len(n) for n in names], dtype=np.int32)
        key_columns = np.array([table.column_names.index(k) for k in keys], np.int32)
        pointer = LIBRARY.ic_rule_new(
            len(columns) if len(columns) <= _MAX_COLUMNS else -1,
            types,
            bytes(c.nullable for c in columns),
            bytes(c.name in required for c in columns),
            bytes(p for p, _ in scales),
            bytes(s for _, s in scales),
            b"".join(names),
            ends.ctypes.data,
            len(key_columns),
            key_columns.ctypes.data,
        )
        self.pointer: int | None = pointer  # None (NULL): C vouches for no image of the table

    def __del__(self) -> None:
        if LIBRARY is not None and self.pointer:
            LIBRARY.ic_rule_free(self.pointer)
            self.pointer = None


def _column(images: pa.Array, rules: Sequence[NativeRule]) -> tuple[list[int | None], ctypes.Array[ctypes.c_void_p]]:
    """An Arrow string column's buffers as the C passes take them (data, offsets, wide, validity), and the rules."""
    validity, offsets, data = images.buffers()
    table = (ctypes.c_void_p * max(len(rules), 1))(*[r.pointer for r in rules])
    has_nulls = validity is not None and images.null_count
    buffers = [data.address if data is not None else None, offsets.address, _OFFSETS[images.type],
               validity.address if has_nulls else None]  # fmt: skip
    return buffers, table


def first_doubt(images: pa.Array, rule_of: np.ndarray, rules: Sequence[NativeRule]) -> int:
    """The first row of ``images`` the C pass does not vouch for, or ``len(images)`` when it vouches for all.

    Row ``i`` is checked against ``rules[rule_of[i]]`` (``rule_of[i]`` negative:
    not checked, nor is a null image). A column that is not plain strings
    (a string view, say) is vouched for nowhere.
    """
    assert LIBRARY is not None
    count = len(images)
    if count == 0 or images.null_count == count or (rule_of < 0).all():
        return count
    if images.type not in _OFFSETS:
        return 0
    buffers, table = _column(images, rules)
    indices = np.ascontiguousarray(rule_of, dtype=np.int32)
    found = LIBRARY.ic_first_doubt(*buffers, images.offset, count, indices.ctypes.data, table)
    return count if found < 0 else int(found)


def identities(images: pa.Array, rule_of: np.ndarray, rules: Sequence[NativeRule]) -> tuple[pa.Array, np.ndarray]:
    """The identities C writes for ``images`` (binary, empty where it writes none) and which rows it wrote.

    Row ``i`` follows ``rules[rule_of[i]]`` (negative: none); a row written
    has the bytes :meth:`applier.engine.identity.TableRules.key` gives it. A
    column that is not plain strings has none written.
    """
    assert LIBRARY is not None
    count = len(images)
    done = np.zeros(count, np.uint8)
    if count == 0 or images.type not in _OFFSETS or images.null_count == count:
        return pa.nulls(count, pa.binary()), done.astype(bool)
    buffers, table = _column(images, rules)
    offsets = np.empty(count + 1, np.int32)
    # A canonical text is at most twice its token and 48 bytes more (a double's 16 hex digits from "0", say).
    room = 2 * int(pc.sum(pc.binary_length(images)).as_py() or 0) + 64 * count
    if room >= 2**31:
        return pa.nulls(count, pa.binary()), done.astype(bool)
    data = np.empty(max(room, 1), np.uint8)
    indices = np.ascontiguousarray(rule_of, dtype=np.int32)
    written = LIBRARY.ic_typed_identities(
        *buffers, images.offset, count, indices.ctypes.data, table, offsets.ctypes.data, data.ctypes.data, room,
        done.ctypes.data,
    )  # fmt: skip
    keys = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data[:written])])
    return keys, done.astype(bool)


_WIDTHS = {"boolean": 1, "int": 4, "date": 4, "bigint": 8, "double": 8, "timestamp": 8, "string": 0, "binary": 0}


def parse(images: pa.Array, rule: NativeRule, columns: Sequence[Column]) -> list[pa.Array] | None:
    """``images`` parsed in C into the typed columns of ``rule``'s table (``columns``, its definition's); None
    when C leaves them to Python (a null image, or one it does not expect)."""
    from applier.engine.changes import arrow_type

    assert LIBRARY is not None
    count = len(images)
    if images.null_count or images.type not in _OFFSETS or not rule.pointer:
        return None
    widths = [16 if decimal_precision_scale(c.type) else _WIDTHS[c.type] for c in columns]
    values: list[np.ndarray | None] = [np.zeros(count * w, np.uint8) if w else None for w in widths]
    offsets: list[np.ndarray | None] = [None if w else np.empty(count + 1, np.int32) for w in widths]
    valid = [np.zeros(count, np.uint8) for _ in columns]
    room = max(int(pc.sum(pc.binary_length(images)).as_py() or 0), 1)
    out, starts = np.empty(room, np.uint8), np.zeros(len(columns), np.int64)

    def pointers(arrays: Sequence[np.ndarray | None]) -> ctypes.Array[ctypes.c_void_p]:
        return (ctypes.c_void_p * max(len(arrays), 1))(*[None if a is None else a.ctypes.data for a in arrays])

    source, _ = _column(images, [])
    failed = LIBRARY.ic_parse(
        source[0], source[1], source[2], images.offset, count, rule.pointer, pointers(values), pointers(offsets),
        pointers(valid), out.ctypes.data, room, starts.ctypes.data,
    )  # fmt: skip
    if failed:
        return None
    arrays = []
    for column, fixed, ends, present, start in zip(columns, values, offsets, valid, starts.tolist(), strict=True):
        valid_count = int(present.sum())
        validity = None if valid_count == count else pa.py_buffer(np.packbits(present, bitorder="little"))
        if ends is not None:
            data = pa.py_buffer(out[start : start + int(ends[-1])])
            buffers = [validity, pa.py_buffer(ends), data]
        elif fixed is not None and column.type == "boolean":
            buffers = [validity, pa.py_buffer(np.packbits(fixed, bitorder="little"))]
        else:
            buffers = [validity, pa.py_buffer(fixed)]
        arrays.append(pa.Array.from_buffers(arrow_type(column.type), count, buffers, null_count=count - valid_count))
    return arrays


def salts(keys: pa.Array, spread: np.ndarray) -> np.ndarray:
    """``zlib.crc32(key) % spread[i]`` for each identity whose ``spread[i]`` exceeds 1, else 0 (int32)."""
    assert LIBRARY is not None and keys.type == pa.binary() and not keys.null_count
    count = len(keys)
    out = np.zeros(count, np.int32)
    if count:
        _, offsets, data = keys.buffers()
        spread = np.ascontiguousarray(spread, np.int32)
        address = data.address if data is not None else None
        LIBRARY.ic_salts(address, offsets.address, keys.offset, count, spread.ctypes.data, out.ctypes.data)
    return out


if __name__ == "__main__":
    print(build(*sys.argv[1:]))
