"""Checking row images against their table definitions (spec section 3).

Every ``before``/``after`` image is decoded with a strict msgspec decoder
built from its table's definition: a JSON object, every column present in an
``after`` image, the key columns present in a ``before`` image (every column
for a table without a primary key), no unknown columns, and every value of
its column's type. msgspec does this in C, some ten times faster than
checking parsed JSON in Python, which matters at millions of rows.

Given the images' Arrow columns too, :func:`check_rows` first asks the C pass
(:mod:`applier.intermediate.native`) which rows it vouches for: those are
not decoded at all, and the rest are checked here, which decides and words
any refusal.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.intermediate import native
from applier.intermediate.schema import Column, TableDef, value_pattern, value_type

_NEEDS = {"I": (False, True), "U": (True, True), "D": (True, False), "T": (False, False)}
_NEED_CODES = {op: 2 * before + after for op, (before, after) in _NEEDS.items()}
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
    # Absent is allowed; an explicit null still has to fit the column's nullability. The bulk decoders
    # read an absent value as None (a default is not checked), so their values are of the type or None.
    return (f"c{i}", kind, None) if quick else (f"c{i}", kind | msgspec.UnsetType, msgspec.UNSET)


def _decoder(table: TableDef, required: set[str], quick: bool = False) -> msgspec.json.Decoder[Any]:
    # Columns are named c0, c1... with a rename, so any column name works and
    # required fields come first, as Python's struct fields must. An image holds
    # scalars only, so it cannot be part of a cycle: untracked by the cyclic
    # collector (gc=False), it is made faster (a wide pair's decodes, 10%) and
    # does not make the collector run.
    order = sorted(range(len(table.columns)), key=lambda i: table.columns[i].name not in required)
    fields = [_field(i, table.columns[i], table.columns[i].name in required, quick) for i in order]
    rename = {f"c{i}": col.name for i, col in enumerate(table.columns)}
    struct = msgspec.defstruct("Image", fields, rename=rename, forbid_unknown_fields=True, gc=False)
    return msgspec.json.Decoder(struct)


class ImageRules:
    """How the images of one table definition are checked: in bulk first, then row by row when that finds something.

    The bulk decoders read the text-encoded columns (dates, timestamps,
    binaries, decimals) as any string, their patterns matched a column at a
    time (:func:`check_rows`), not by msgspec value by value with Python's
    ``re``; the exact decoders, built only when a row must be judged, say
    what is wrong with it.
    """

    def __init__(self, table: TableDef) -> None:
        every = set(table.column_names)
        self.table = table
        self._keys = set(table.primary_key) or every
        patterns = ((f"c{i}", value_pattern(c.type)) for i, c in enumerate(table.columns))
        self.patterns = tuple((field, pattern) for field, pattern in patterns if pattern is not None)

    @staticmethod
    @functools.lru_cache(maxsize=4096)
    def of(table: TableDef) -> ImageRules:
        """The rules of a definition, built once per process (building costs more than checking a small pair)."""
        return ImageRules(table)

    @functools.cached_property
    def quick_after(self) -> msgspec.json.Decoder[Any]:
        return _decoder(self.table, set(self.table.column_names), quick=True)

    @functools.cached_property
    def quick_before(self) -> msgspec.json.Decoder[Any]:
        return _decoder(self.table, self._keys, quick=True)

    @functools.cached_property
    def native(self) -> tuple[native.NativeRule, native.NativeRule]:
        """The C pass's rules of after and before images (:mod:`applier.intermediate.native`)."""
        return native.NativeRule(self.table, self.table.column_names), native.NativeRule(self.table, self._keys)

    @functools.cached_property
    def after(self) -> msgspec.json.Decoder[Any]:
        return _decoder(self.table, set(self.table.column_names))

    @functools.cached_property
    def before(self) -> msgspec.json.Decoder[Any]:
        return _decoder(self.table, self._keys)


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


def _check_row(op: str, before: str | None, after: str | None, rules: ImageRules) -> None:
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


# RE2 compiles its expression on each call (some 20 us for a date's): fewer values than this are matched by re.
_FEW = 400


def all_match(values: list[str | None], pattern: str) -> bool:
    """Whether every value but None matches ``pattern`` whole (unanchored, reading the same in ``re`` and RE2)."""
    if len(values) < _FEW:
        match = _python_form(pattern)
        return all(v is None or match(v) for v in values)
    return not pc.match_substring_regex(pa.array(values, pa.string()), f"^{pattern}$").false_count


@functools.lru_cache(maxsize=256)
def _python_form(pattern: str) -> Callable[[str], Any]:
    return re.compile(f"^{pattern}\\Z").match


@dataclass(frozen=True)
class Checked:
    """Rows checked in bulk (:func:`check_rows`).

    Attributes:
        problem: the first wrong row (its index) and what is wrong; None: every row passed.
        befores, afters: when every row passed in bulk, each row's images as the
            bulk decoders read them (a struct whose field ``c<i>`` is column ``i``
            of the rules' table, text-encoded values as their strings, an absent
            value None; None for no image, or a row not checked); None when the
            rows were judged one by one.
    """

    problem: tuple[int, ImageProblem] | None
    befores: list[Any] | None = None
    afters: list[Any] | None = None


def check_rows(
    keys: Sequence[Hashable], ops: Sequence[str], befores: Sequence[str | None], afters: Sequence[str | None],
    rules_of: Callable[[Any], ImageRules | None], arrays: tuple[pa.Array, pa.Array] | None = None,
) -> Checked:  # fmt: skip
    """Check rows of many tables (or pairs) at once, each against its own rules.

    With ``arrays`` (the before and after columns in Arrow, the same rows as
    ``befores`` and ``afters``) and the C pass built, the rows it vouches for
    (:func:`vouched`) are not decoded: only the first one it doubts and those
    after it are checked as below, and the result holds no decoded images.

    ``rules_of(keys[i])`` gives row ``i``'s rules (None: not checked). Every
    image is decoded by its table's bulk decoder, then the values of each form
    (a date, a ``decimal(10,2)``...) are matched at once over all the rows,
    whatever their table: a few calls per batch, not one per table and column.
    Anything amiss sends the rows to the exact check, one by one, which finds
    the first wrong row in row order and says what is wrong, as
    :func:`check_images` words it.
    """
    if arrays is not None and native.LIBRARY is not None:
        start = vouched(keys, ops, rules_of, arrays)
        if start == len(ops):
            return Checked(None)
        rest = check_rows(keys[start:], ops[start:], befores[start:], afters[start:], rules_of)
        return Checked(None if rest.problem is None else (start + rest.problem[0], rest.problem[1]))
    count = len(ops)
    decoded: tuple[list[Any], list[Any]] = ([None] * count, [None] * count)
    rules_by_key: dict[Hashable, ImageRules | None] = {}

    def rules_for(key: Hashable) -> ImageRules | None:
        if key not in rules_by_key:
            rules_by_key[key] = rules_of(key)
        return rules_by_key[key]

    images: dict[ImageRules, list[Any]] = {}  # every image decoded, by its rules
    judged = False
    try:
        for i, (key, op, before, after) in enumerate(zip(keys, ops, befores, afters, strict=True)):
            rules = rules_for(key)
            if rules is None:
                continue
            wants_before, wants_after = _NEEDS[op]
            if (before is not None) != wants_before or (after is not None) != wants_after:
                judged = True
                break
            mine = images.get(rules)
            if mine is None:
                mine = images[rules] = []
            if after is not None:
                decoded[1][i] = image = rules.quick_after.decode(after)
                mine.append(image)
            if before is not None:
                decoded[0][i] = image = rules.quick_before.decode(before)
                mine.append(image)
    except msgspec.MsgspecError:
        judged = True
    if not judged:
        values: dict[str, list[Any]] = {}
        for rules, decoded_images in images.items():
            for field, pattern in rules.patterns:
                values.setdefault(pattern, []).extend(map(operator.attrgetter(field), decoded_images))
        judged = not all(all_match(found, pattern) for pattern, found in values.items())
    if not judged:
        return Checked(None, *decoded)
    for i, (key, op, before, after) in enumerate(zip(keys, ops, befores, afters, strict=True)):
        rules = rules_for(key)
        if rules is None:
            continue
        try:
            _check_row(op, before, after, rules)
        except ImageProblem as e:
            return Checked((i, e))
    return Checked(None)


def vouched(
    keys: Sequence[Hashable], ops: Sequence[str], rules_of: Callable[[Any], ImageRules | None],
    arrays: tuple[pa.Array, pa.Array],
) -> int:  # fmt: skip
    """How many rows, from the first, surely pass their checks: the images each op needs, and the C pass's word.

    A row not checked (``rules_of`` None) passes. The count ends at the first
    row with the wrong images for its op, or whose before or after image the C
    pass does not vouch for (:func:`applier.intermediate.native.first_doubt`).
    """
    count = len(ops)
    rules: list[native.NativeRule] = []
    at: dict[Hashable, int] = {}
    for key in dict.fromkeys(keys):  # each key once, in a C loop
        table_rules = rules_of(key)
        at[key] = -1 if table_rules is None else len(rules)
        if table_rules is not None:
            rules.extend(table_rules.native)
    after_rule = np.fromiter(map(at.__getitem__, keys), np.int32, count)
    checked = after_rule >= 0
    needs = np.fromiter(map(_NEED_CODES.__getitem__, ops), np.int8, count)
    has = arrays[0].is_valid().to_numpy(zero_copy_only=False) * 2 + arrays[1].is_valid().to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(checked & (has != needs))
    if len(wrong):
        count = int(wrong[0])
    before_rule = np.where(checked, after_rule + 1, -1).astype(np.int32)
    if not rules:
        return count
    count = native.first_doubt(arrays[1].slice(0, count), after_rule[:count], rules)
    return native.first_doubt(arrays[0].slice(0, count), before_rule[:count], rules)


def check_images(data: pa.Table, tables: dict[str, TableDef]) -> None:
    """Check every row's images against its table's definition.

    Args:
        data: the ``.dat`` rows (columns lsn, xid, table, op, before, after),
            with ``op`` already checked and every table described.
        tables: the pair's table definitions.

    Raises:
        ImageProblem: naming the first wrong row (lsn, xid, table) and what is wrong.
    """
    names, ops = data["table"].to_pylist(), data["op"].to_pylist()
    arrays = (data["before"].combine_chunks(), data["after"].combine_chunks())

    def rules_of(name: str) -> ImageRules:
        return ImageRules.of(tables[name])

    start = vouched(names, ops, rules_of, arrays) if native.LIBRARY is not None else 0
    if start == len(ops):
        return
    befores, afters = (array.slice(start).to_pylist() for array in arrays)
    wrong = check_rows(names[start:], ops[start:], befores, afters, rules_of).problem
    if wrong is not None:
        i, e = wrong[0] + start, wrong[1]
        lsn, xid = data["lsn"][i].as_py(), data["xid"][i].as_py()
        raise ImageProblem(e.code, f"row lsn {lsn} (xid {xid}, table {names[i]}) {e.detail}")
