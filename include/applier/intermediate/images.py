"""Checking row images against their table definitions (spec section 3).

Every ``before``/``after`` image is decoded with a strict msgspec decoder
built from its table's definition: a JSON object, every column present in an
``after`` image, the key columns present in a ``before`` image (every column
for a table without a primary key), no unknown columns, and every value of
its column's type. msgspec does this in C, some ten times faster than
checking parsed JSON in Python, which matters at millions of rows.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from applier.intermediate.schema import Column, TableDef, value_pattern, value_type

_NEEDS = {"I": (False, True), "U": (True, True), "D": (True, False), "T": (False, False)}
_NEED_TEXT = {"I": "only an after image", "U": "both images", "D": "only a before image", "T": "no image"}
_PATH = re.compile(r" - at `\$\.(.+)`$")


class ImageProblem(ValueError):
    """A row image breaks the spec; the reader adds the file and raises the project error."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(detail)


def _field(i: int, col: Column, required: bool, quick: bool) -> tuple[Any, ...]:
    kind = str if quick and value_pattern(col.type) is not None else value_type(col.type)
    if col.nullable:
        kind = kind | None
    if required:
        return (f"c{i}", kind)
    # Absent is allowed; an explicit null still has to fit the column's nullability.
    return (f"c{i}", kind | msgspec.UnsetType, msgspec.UNSET)


def _decoder(table: TableDef, required: set[str], quick: bool = False) -> msgspec.json.Decoder[Any]:
    # Columns are named c0, c1... with a rename, so any column name works and
    # required fields come first, as Python's struct fields must.
    order = sorted(range(len(table.columns)), key=lambda i: table.columns[i].name not in required)
    fields = [_field(i, table.columns[i], table.columns[i].name in required, quick) for i in order]
    rename = {f"c{i}": col.name for i, col in enumerate(table.columns)}
    struct = msgspec.defstruct("Image", fields, rename=rename, forbid_unknown_fields=True)
    return msgspec.json.Decoder(struct)


@dataclass(frozen=True)
class _TableRules:
    after: msgspec.json.Decoder[Any]
    before: msgspec.json.Decoder[Any]
    # The same with text-encoded columns (dates, timestamps, binaries, decimals) as any string: their
    # patterns are matched a column at a time (_quick_pass), not by msgspec value by value with Python's re.
    quick_after: msgspec.json.Decoder[Any]
    quick_before: msgspec.json.Decoder[Any]
    patterns: tuple[tuple[str, str], ...]  # (field, pattern) of the text-encoded columns

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def of(table: TableDef) -> _TableRules:
        """The rules of a definition, built once per process (building costs more than checking a small pair)."""
        every = set(table.column_names)
        keys = set(table.primary_key) or every
        patterns = ((f"c{i}", value_pattern(c.type)) for i, c in enumerate(table.columns))
        return _TableRules(
            after=_decoder(table, every),
            before=_decoder(table, keys),
            quick_after=_decoder(table, every, quick=True),
            quick_before=_decoder(table, keys, quick=True),
            patterns=tuple((field, pattern) for field, pattern in patterns if pattern is not None),
        )


def _explain(e: msgspec.MsgspecError, label: str) -> ImageProblem:
    text = str(e)
    if not isinstance(e, msgspec.ValidationError):  # a ValidationError is a DecodeError too
        return ImageProblem("image-not-object", f"{label} is not JSON: {text}")
    if text.startswith("Expected `object`"):
        return ImageProblem("image-not-object", f"{label} is not a JSON object: {text}")
    if text.startswith("Object missing required field"):
        code = "column-missing" if label == "after image" else "key-column-missing"
        return ImageProblem(code, f"{label} lacks a column: {text}")
    if text.startswith("Object contains unknown field"):
        return ImageProblem("column-unknown", f"{label} has a column not in the table definition: {text}")
    path = _PATH.search(text)
    column = f"column {path.group(1)}: " if path else ""
    return ImageProblem("value-wrong-type", f"{label}: {column}{_PATH.sub('', text)}")


def _check_row(op: str, before: str | None, after: str | None, rules: _TableRules) -> None:
    wants_before, wants_after = _NEEDS[op]
    if (before is not None) != wants_before or (after is not None) != wants_after:
        raise ImageProblem("image-unexpected", f"op {op} needs {_NEED_TEXT[op]}")
    label = "after image"
    try:
        if after is not None:
            rules.after.decode(after)
        label = "before image"
        if before is not None:
            rules.before.decode(before)
    except msgspec.MsgspecError as e:
        raise _explain(e, label) from None


def _quick_pass(
    ops: Sequence[str], befores: Sequence[str | None], afters: Sequence[str | None], rules: _TableRules
) -> bool:
    """Whether every row surely passes :func:`_check_row` (False: it must check them one by one).

    The images are decoded with the text-encoded columns as any string, then
    each such column's values are matched at once by RE2 (pyarrow; a few
    values by ``re``), with the same expressions as the exact decoders
    (:func:`~applier.intermediate.schema.value_pattern`). A miss only sends
    the rows to the exact check, which decides and says what is wrong.
    """
    decoded: tuple[list[Any], list[Any]] = ([], [])
    try:
        for op, before, after in zip(ops, befores, afters, strict=True):
            wants_before, wants_after = _NEEDS[op]
            if (before is not None) != wants_before or (after is not None) != wants_after:
                return False
            if after is not None:
                decoded[0].append(rules.quick_after.decode(after))
            if before is not None:
                decoded[1].append(rules.quick_before.decode(before))
    except msgspec.MsgspecError:
        return False
    for field, pattern in rules.patterns:
        for images in decoded:
            values = [v for v in map(operator.attrgetter(field), images) if isinstance(v, str)]
            if not all_match(values, pattern):
                return False
    return True


# RE2 compiles its expression on each call (some 20 us for a date's): fewer values than this are matched by re.
_FEW = 400


def all_match(values: list[str], pattern: str) -> bool:
    """Whether every value matches ``pattern`` whole (unanchored, reading the same in ``re`` and RE2)."""
    if len(values) < _FEW:
        return all(map(_python_form(pattern), values))
    return not pc.match_substring_regex(pa.array(values, pa.string()), f"^{pattern}$").false_count


@functools.lru_cache(maxsize=256)
def _python_form(pattern: str) -> Callable[[str], Any]:
    return re.compile(f"^{pattern}\\Z").match


RowsChecker = Callable[[Sequence[str], Sequence[str | None], Sequence[str | None]], tuple[int, ImageProblem] | None]
"""Rows of one table in, the first wrong one (its index in the rows, and what is wrong) or None out."""


def rows_checker(table: TableDef) -> RowsChecker:
    """What is wrong with rows' images against ``table``, as :func:`check_images` judges: the first row wrong.

    For checks made away from the pair (Spark's executors check the rows they
    compile): the rules are built once per definition in each process, and
    the checker is kept by the caller (hashing a definition costs as much as
    its columns). Rows are checked in bulk first (:func:`_quick_pass`), one by
    one only when that finds something.
    """
    rules = _TableRules.of(table)

    def first_problem(
        ops: Sequence[str], befores: Sequence[str | None], afters: Sequence[str | None]
    ) -> tuple[int, ImageProblem] | None:
        if _quick_pass(ops, befores, afters, rules):
            return None
        for i, (op, before, after) in enumerate(zip(ops, befores, afters, strict=True)):
            try:
                _check_row(op, before, after, rules)
            except ImageProblem as e:
                return i, e
        return None

    return first_problem


def first_problem(
    keys: Sequence[Hashable], ops: Sequence[str], befores: Sequence[Any], afters: Sequence[Any],
    checker_of: Callable[[Any], RowsChecker | None],
) -> tuple[int, ImageProblem] | None:  # fmt: skip
    """The first row with a problem among rows of many tables (or pairs), each checked with its own rules.

    Rows are grouped by ``keys[i]`` (a table, or a pair and table) and each
    group checked in bulk by ``checker_of(key)`` (None: not checked); the
    first problem in row order wins, as a row-by-row check would find it.
    """
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    found: tuple[int, ImageProblem] | None = None
    for key, rows in groups.items():
        checker = checker_of(key)
        if checker is None:
            continue
        wrong = checker([ops[i] for i in rows], [befores[i] for i in rows], [afters[i] for i in rows])
        if wrong is not None and (found is None or rows[wrong[0]] < found[0]):
            found = rows[wrong[0]], wrong[1]
    return found


def check_images(data: pa.Table, tables: dict[str, TableDef]) -> None:
    """Check every row's images against its table's definition.

    Args:
        data: the ``.dat`` rows (columns lsn, xid, table, op, before, after),
            with ``op`` already checked and every table described.
        tables: the pair's table definitions.

    Raises:
        ImageProblem: naming the first wrong row (lsn, xid, table) and what is wrong.
    """
    names, ops, befores, afters = (data[c].to_pylist() for c in ("table", "op", "before", "after"))
    wrong = first_problem(names, ops, befores, afters, lambda name: rows_checker(tables[name]))
    if wrong is not None:
        i, e = wrong
        lsn, xid = data["lsn"][i].as_py(), data["xid"][i].as_py()
        raise ImageProblem(e.code, f"row lsn {lsn} (xid {xid}, table {names[i]}) {e.detail}")
