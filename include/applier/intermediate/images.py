"""Checking row images against their table definitions (spec section 3).

Every ``before``/``after`` image is parsed and checked: a JSON object, the
images each operation requires and no others, every column of an ``after``
image present, the key columns of a ``before`` image present (every column
for a table without a primary key), no unknown columns, and every value of
its column's type.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from applier.intermediate.schema import TableDef, value_checker


class ImageProblem(ValueError):
    """A row image breaks the spec; the reader adds the file and raises the project error."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(detail)


@dataclass(frozen=True)
class _TableRules:
    columns: frozenset[str]
    before_required: frozenset[str]
    not_null: frozenset[str]
    checkers: dict[str, Callable[[Any], bool]]
    types: dict[str, str]

    @staticmethod
    def of(table: TableDef) -> _TableRules:
        names = frozenset(table.column_names)
        return _TableRules(
            columns=names,
            before_required=frozenset(table.primary_key) if table.primary_key else names,
            not_null=frozenset(c.name for c in table.columns if not c.nullable),
            checkers={c.name: value_checker(c.type) for c in table.columns},
            types={c.name: c.type for c in table.columns},
        )


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        image = json.loads(text)
    except ValueError as e:
        raise ImageProblem("image-not-object", f"{where} is not JSON: {e}") from e
    if not isinstance(image, dict):
        raise ImageProblem("image-not-object", f"{where} is a JSON {type(image).__name__}, not an object")
    return image


def _check_values(image: dict[str, Any], rules: _TableRules, where: str) -> None:
    unknown = image.keys() - rules.columns
    if unknown:
        raise ImageProblem("column-unknown", f"{where} has columns {sorted(unknown)} not in the table definition")
    for name, value in image.items():
        if value is None:
            if name in rules.not_null:
                raise ImageProblem("value-wrong-type", f"{where}: column {name} is not nullable but holds null")
        elif not rules.checkers[name](value):
            raise ImageProblem(
                "value-wrong-type", f"{where}: column {name} value {value!r} is not a {rules.types[name]}"
            )


def _check_row(op: str, before: str | None, after: str | None, rules: _TableRules, where: str) -> None:
    wants_before, wants_after = op in ("U", "D"), op in ("I", "U")
    if (before is not None) != wants_before or (after is not None) != wants_after:
        need = {"I": "only an after image", "U": "both images", "D": "only a before image", "T": "no image"}[op]
        raise ImageProblem("image-unexpected", f"{where}: op {op} needs {need}")
    if after is not None:
        image = _parse(after, f"{where} after image")
        _check_values(image, rules, f"{where} after image")
        missing = rules.columns - image.keys()
        if missing:
            raise ImageProblem("column-missing", f"{where} after image lacks columns {sorted(missing)}")
    if before is not None:
        image = _parse(before, f"{where} before image")
        _check_values(image, rules, f"{where} before image")
        missing = rules.before_required - image.keys()
        if missing:
            raise ImageProblem("key-column-missing", f"{where} before image lacks key columns {sorted(missing)}")


def check_images(data: pa.Table, tables: dict[str, TableDef]) -> None:
    """Check every row's images against its table's definition.

    Args:
        data: the ``.dat`` rows (columns lsn, xid, table, op, before, after),
            with ``op`` already checked and every table described.
        tables: the pair's table definitions.

    Raises:
        ImageProblem: naming the row (lsn, xid, table) and what is wrong.
    """
    rules = {name: _TableRules.of(table) for name, table in tables.items()}
    columns = [data[name].to_pylist() for name in ("lsn", "xid", "table", "op", "before", "after")]
    for lsn, xid, table, op, before, after in zip(*columns, strict=True):
        try:
            _check_row(op, before, after, rules[table], "")
        except ImageProblem as e:
            raise ImageProblem(e.code, f"row lsn {lsn} (xid {xid}, table {table}){e.detail}") from None
