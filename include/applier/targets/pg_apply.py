"""Applying changes inside the PostgreSQL target's transaction: set-wise from staging, or in log order.

Both run on the connection of the cycle's (or part's) one transaction, after
the table was created or evolved, and answer the collisions they met per kind
(:mod:`~applier.targets.collisions`); the caller decides whether those refuse
the transaction.

**Set-wise** (a compiled group): a keyed staging table is applied by
statements whose row counts show what the table held: delete the ``D`` keys,
update the ``U`` rows, update the ``I`` rows whose key is held (usually
none), insert the other ``I`` rows (``P`` rows,
of changes that do not tell inserts from updates, are updated or inserted
uncounted). A ``U`` that
found no row and an ``I`` whose key was held are collisions; they are applied
as an upsert would (the missing updates inserted, the held inserts updated),
by a fourth statement that runs only when there are some. A keyless staging
table deletes copies of row values, then inserts copies.

**Log order** (a noncompilable transaction, and the enhanced retry's single
transactions): every change of one transaction is a statement of its own, in
source order. Statements carry bound parameters (values parsed from the
images by the compile's own rules), prepared once per form by psycopg.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from applier.engine.identity import rules_of
from applier.errors import TargetError
from applier.intermediate.schema import TableDef
from applier.targets import pg_sql as q
from applier.targets.pg_drift import COLUMNS_QUERY, FoundColumn, drift

Found = dict[str, int]
"""Collisions met, per kind (``insert``, ``update``, ``delete``)."""


def prepare_table(conn: psycopg.Connection[Any], table: TableDef, schema_map: Mapping[str, str]) -> sql.Identifier:
    """Create the table, or add the definition's new columns to it, inside the transaction; its target name.

    Raises:
        TargetError: the table drifted so that applying to it could lose data (:mod:`~applier.targets.pg_drift`).
    """
    ident = q.target_table(table, schema_map)
    conn.execute(q.create_schema(schema_map.get(table.schema_name, table.schema_name)))
    conn.execute(q.create_table(ident, table))
    found = _found_columns(conn, table, schema_map)
    present = {c.name for c in found}
    added = [column for column in table.columns if column.name not in present]
    for column in added:
        conn.execute(q.add_column(ident, column))
    if added:
        found = _found_columns(conn, table, schema_map)
    problem = drift(table, found)
    if problem:
        raise drift_error(table, problem, schema_map)
    if table.primary_key and not _has_key_index(conn, ident, table):
        keys = ", ".join(table.primary_key)
        raise drift_error(table, f"no primary key or unique index on ({keys}), which applying by key needs", schema_map)
    return ident


def _has_key_index(conn: psycopg.Connection[Any], ident: sql.Identifier, table: TableDef) -> bool:
    row = conn.execute(q.has_key_index(), [ident.as_string(conn), sorted(table.primary_key)]).fetchone()
    return bool(row and row[0])


def drift_error(table: TableDef, problem: str, schema_map: Mapping[str, str]) -> TargetError:
    """The error that refuses a drifted table (class ``schema``)."""
    schema, name = q.target_name(table.name, schema_map)
    return TargetError(
        f"table {table.name}: the target table {schema}.{name} was changed so that applying to it could "
        f"lose data ({problem}); change it back, or drop it to have it created again",
        error_class="schema",
    )


def _found_columns(conn: psycopg.Connection[Any], table: TableDef, schema_map: Mapping[str, str]) -> list[FoundColumn]:
    return [FoundColumn(*row) for row in conn.execute(COLUMNS_QUERY, q.target_name(table.name, schema_map))]


def apply_keyed(conn: psycopg.Connection[Any], ident: sql.Identifier, stage: sql.Identifier, table: TableDef) -> Found:
    """Apply a keyed staging table set-wise (see the module docstring)."""
    ops = dict(conn.execute(q.staged_ops(stage)).fetchall())
    found: Found = {}
    if ops.get("D"):
        found["delete"] = ops["D"] - conn.execute(q.delete_keyed(ident, stage, table)).rowcount
    if ops.get("U"):
        found["update"] = ops["U"] - conn.execute(q.update_keyed(ident, stage, table, "U")).rowcount
        if found["update"]:
            conn.execute(q.insert_missing(ident, stage, table, "U"))
    if ops.get("I"):  # the held keys first (usually none): then a plain INSERT, as fast as a MERGE's
        found["insert"] = conn.execute(q.update_keyed(ident, stage, table, "I")).rowcount
        conn.execute((q.insert_missing if found["insert"] else q.insert_staged)(ident, stage, table, "I"))
    if ops.get("P"):  # upserts of changes that do not tell inserts from updates: nothing to count
        conn.execute(q.update_keyed(ident, stage, table, "P"))
        conn.execute(q.insert_missing(ident, stage, table, "P"))
    return found


def apply_counted(
    conn: psycopg.Connection[Any], ident: sql.Identifier, stage: sql.Identifier, table: TableDef
) -> Found:
    """Apply a keyless staging table: delete copies (those not there are collisions), then insert copies."""
    wanted = conn.execute(
        sql.SQL("SELECT coalesce(sum(-{0}), 0) FROM {1} WHERE {0} < 0").format(sql.Identifier(q.COUNT), stage)
    ).fetchone()
    deleted = conn.execute(q.delete_copies(ident, stage, table)).rowcount
    conn.execute(q.insert_copies(ident, stage, table))
    return {"delete": int(wanted[0]) - deleted} if wanted else {}


class LogOrder:
    """One transaction's changes applied statement by statement, in source order.

    Args:
        conn: the connection, inside the transaction.
        idents: each table's target table.
        tables: each table's definition (the cycle's latest; a column missing from an image is null).
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        idents: Mapping[str, sql.Identifier],
        tables: Mapping[str, TableDef],
        errors: Callable[[str, str], AbstractContextManager[None]],
    ) -> None:
        self._conn, self._idents, self._tables, self._errors = conn, idents, tables, errors
        self.found: dict[str, Found] = {}
        self.statements: dict[str, dict[str, int]] = {}
        self._rendered: dict[tuple[str, str], bytes] = {}

    def _sql(self, name: str, form: str) -> bytes:
        """Statement ``form`` for table ``name``, built and rendered once (it runs once a change)."""
        found = self._rendered.get((name, form))
        if found is None:
            table, ident = self._tables[name], self._idents[name]
            found = self._rendered[(name, form)] = _FORMS[form](ident, table).as_bytes(self._conn)
        return found

    def apply(self, rows: pa.Table) -> None:
        """Apply ``rows`` (``lsn, table, op, before, after``) in ``lsn`` order.

        A run of successive changes of one kind to one table (inserts, updates
        or deletes; not a keyless update, which is two statements) goes to the
        server as one batch of the same statement (``executemany``, pipelined)
        inside a savepoint. When its row count shows a collision, or a change
        is refused, the savepoint is rolled back and the run applied change
        by change, which handles the collision in order or names the refused
        change. Either way every statement runs in source order.
        """
        ordered = rows.sort_by("lsn")
        changes = list(
            zip(*(ordered.column(c).to_pylist() for c in ("lsn", "table", "op", "before", "after")), strict=True)
        )
        start = 0
        while start < len(changes):
            end = start + 1
            kind = self._batchable(changes[start])
            while kind is not None and end < len(changes) and self._batchable(changes[end]) == kind:
                end += 1
            run = changes[start:end]
            if len(run) == 1 or not self._batch(run):
                for lsn, name, op, before, after in run:
                    try:
                        self._change(name, op, before, after)
                    except psycopg.Error:  # named by its lsn and key, worked out only now
                        with self._errors(f"{_OPS[op]} at lsn {lsn}{_key(self._tables[name], before, after)}", name):
                            raise
            start = end

    def _batchable(self, change: tuple[Any, ...]) -> tuple[str, str] | None:
        """``(table, op)`` of a change that may share a batch with its neighbours of the same kind; None if not."""
        _, name, op, _, _ = change
        if op == "T" or (op == "U" and not self._tables[name].primary_key):
            return None
        return name, op

    def _batch(self, run: list[tuple[Any, ...]]) -> bool:
        """Apply a run of one kind at once; False (and nothing applied) when it must go change by change."""
        _, name, op, _, _ = run[0]
        table = self._tables[name]
        images = [before if op == "D" else after for _, _, _, before, after in run]
        values = _rows(table, images)
        keyed = bool(table.primary_key)
        if op == "I":
            form, params = "insert_free" if keyed else "insert", [[r[c] for c in table.column_names] for r in values]
        elif op == "U":
            old = _rows(table, [before for _, _, _, before, _ in run])
            form = "update"
            params = [
                [*(r[c] for c in table.column_names), *(o[k] for k in table.primary_key)]
                for r, o in zip(values, old, strict=True)
            ]
        elif keyed:
            form, params = "delete", [[r[k] for k in table.primary_key] for r in values]
        else:
            form, params = "delete_copy", [[r[c] for c in table.column_names] for r in values]
        statement = self._sql(name, form)
        try:
            with self._conn.transaction():  # a savepoint
                cursor = self._conn.cursor()
                cursor.executemany(statement, params)
                if cursor.rowcount != len(params):
                    raise _Collided
        except (_Collided, psycopg.Error):
            return False
        counts = self.statements.setdefault(name, {})
        counts[op] = counts.get(op, 0) + len(run)
        return True

    def _change(self, name: str, op: str, before: str | None, after: str | None) -> None:
        table, ident = self._tables[name], self._idents[name]
        counts = self.statements.setdefault(name, {})
        counts[op] = counts.get(op, 0) + 1
        if op == "T":
            self._conn.execute(q.truncate(ident))
            return
        if op in ("U", "D"):
            new = _values(table, after) if op == "U" else None
            if self._remove(name, table, _values(table, before), new):
                self._count(name, "update" if op == "U" else "delete")
        if (op == "I" or (op == "U" and not table.primary_key)) and self._insert(name, table, _values(table, after)):
            self._count(name, "insert")

    def _remove(self, name: str, table: TableDef, old: dict[str, Any], new: dict[str, Any] | None) -> bool:
        """Delete the row ``old`` names, or (keyed, ``new`` given) update it to ``new``; True when there was none.

        A keyed update that finds no row inserts ``new`` instead.
        """
        if not table.primary_key:
            values = [old[c] for c in table.column_names]
            return self._conn.execute(self._sql(name, "delete_copy"), values).rowcount == 0
        key = [old[k] for k in table.primary_key]
        if new is None:
            return self._conn.execute(self._sql(name, "delete"), key).rowcount == 0
        values = [new[c] for c in table.column_names]
        if self._conn.execute(self._sql(name, "update"), [*values, *key]).rowcount:
            return False
        self._conn.execute(self._sql(name, "insert"), values)
        return True

    def _insert(self, name: str, table: TableDef, new: dict[str, Any]) -> bool:
        """Insert ``new``; keyed, when its key holds a row, update that row instead: True then (a collision)."""
        values = [new[c] for c in table.column_names]
        if not table.primary_key:
            self._conn.execute(self._sql(name, "insert"), values)
            return False
        if self._conn.execute(self._sql(name, "insert_free"), values).rowcount:
            return False
        self._conn.execute(self._sql(name, "update"), [*values, *(new[k] for k in table.primary_key)])
        return True

    def _count(self, name: str, kind: str) -> None:
        mine = self.found.setdefault(name, {})
        mine[kind] = mine.get(kind, 0) + 1


_OPS = {"I": "insert", "U": "update", "D": "delete", "T": "truncate"}


def _key(table: TableDef, before: str | None, after: str | None = None) -> str:
    """`` at key id=7`` for a keyed table's change (its old key for an update); empty otherwise."""
    image = before or after
    if not table.primary_key or image is None:
        return ""
    try:
        values = _values(table, image)
    except Exception:  # an image the statement will refuse with its own error
        return ""
    return " at key " + ", ".join(f"{k}={values[k]}" for k in table.primary_key)


class _Collided(Exception):
    """A batch's row count fell short: some change collided, and the batch goes change by change."""


def _rows(table: TableDef, images: list[str | None]) -> list[dict[str, Any]]:
    """Images' values, typed by the compile's rules (as the set-wise path would store them), parsed together."""
    present = [image for image in images if image is not None]
    if len(present) < len(images):
        raise ValueError(f"table {table.name}: a change lacks the image its operation needs")
    columns = [array.to_pylist() for array in rules_of(table).parse(present)]
    return [dict(zip(table.column_names, row, strict=True)) for row in zip(*columns, strict=True)]


def _values(table: TableDef, image: str | None) -> dict[str, Any]:
    """One image's values (:func:`_rows`)."""
    return _rows(table, [image])[0]


def _match(table: TableDef, names: tuple[str, ...]) -> sql.Composed:
    """``c1 = %s AND c2 IS NOT DISTINCT FROM %s ...`` (null-safe for nullable columns)."""
    return sql.SQL(" AND ").join(
        sql.SQL("{} {} %s").format(
            sql.Identifier(n), sql.SQL("IS NOT DISTINCT FROM" if table.column(n).nullable else "=")
        )
        for n in names
    )


def _update_by_key(ident: sql.Identifier, table: TableDef) -> sql.Composed:
    """Set every column (parameters: all columns, then the old key)."""
    sets = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in table.column_names)
    return sql.SQL("UPDATE {} SET {} WHERE {}").format(ident, sets, _match(table, table.primary_key))


def _delete_by_key(ident: sql.Identifier, table: TableDef) -> sql.Composed:
    return sql.SQL("DELETE FROM {} WHERE {}").format(ident, _match(table, table.primary_key))


def _delete_one_copy(ident: sql.Identifier, table: TableDef) -> sql.Composed:
    """Delete one row equal to the value (parameters: all columns): rows without a key have no identity."""
    return sql.SQL("DELETE FROM {0} WHERE ctid = (SELECT ctid FROM {0} WHERE {1} LIMIT 1)").format(
        ident, _match(table, table.column_names)
    )


def _insert(ident: sql.Identifier, table: TableDef, *, keyed: bool) -> sql.Composed:
    """Insert a row (parameters: all columns; keyed, only when the key is free)."""
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in table.column_names)
    values = sql.SQL(", ").join(sql.Placeholder() * len(table.column_names))
    if not keyed:
        return sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(ident, columns, values)
    key = sql.SQL(", ").join(sql.Identifier(c) for c in table.primary_key)
    return sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO NOTHING").format(ident, columns, values, key)


_FORMS: dict[str, Callable[[sql.Identifier, TableDef], sql.Composed]] = {
    "insert": lambda ident, table: _insert(ident, table, keyed=False),
    "insert_free": lambda ident, table: _insert(ident, table, keyed=True),
    "update": _update_by_key,
    "delete": _delete_by_key,
    "delete_copy": _delete_one_copy,
}
"""The log-order statements, by form (see :meth:`LogOrder._sql`)."""
