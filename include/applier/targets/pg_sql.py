"""The SQL the PostgreSQL target runs, built from table definitions (pure; no connection).

Every identifier goes through :class:`psycopg.sql.Identifier` (quoted, with
embedded quotes doubled) and every value read from intermediate files travels
as COPY data or a bound parameter, never as SQL text.

Net changes reach a table through a *staging table*: an unlogged copy of the
table's columns plus ``__op`` (``U`` for a net insert or update with the final
row, ``D`` for a net delete with the key) for a keyed table, or ``__id`` (the
row value's number) and ``__n`` (the signed copy count) for a table without a
key. The statements below then apply a staging table set-wise.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from psycopg import sql

from applier.intermediate.schema import Column, TableDef, decimal_precision_scale

OP = "__op"
ROW_ID = "__id"
COUNT = "__n"
STAGING_SCHEMA = "applier_staging"
CHECKPOINT_TABLE = "applier_checkpoint"
CHECKPOINT_COLUMNS = ("configuration_name", "cycle_id", "applied_seq", "applied_commit_lsn", "restart_seq")
# PostgreSQL keeps the first 63 bytes of a longer identifier (NAMEDATALEN - 1),
# so two long names could land in one table or one column.
MAX_IDENTIFIER = 63

_SIMPLE_TYPES = {
    "boolean": "boolean",
    "int": "integer",
    "bigint": "bigint",
    "double": "double precision",
    "string": "text",
    "date": "date",
    "timestamp": "timestamptz",
    "binary": "bytea",
}


def pg_type(type_name: str) -> str:
    """The PostgreSQL type of a spec column type (``decimal(p,s)`` -> ``numeric(p,s)``).

    Raises:
        ValueError: the spec has no such type.
    """
    ps = decimal_precision_scale(type_name)
    if ps is not None:
        return f"numeric({ps[0]},{ps[1]})"
    try:
        return _SIMPLE_TYPES[type_name]
    except KeyError:
        raise ValueError(f"unknown column type {type_name!r}") from None


def target_table(table: TableDef, schema_map: Mapping[str, str]) -> sql.Identifier:
    """The target table of a source table: its schema mapped (or kept), its name kept."""
    return sql.Identifier(*target_name(table.name, schema_map))


def target_name(table: str, schema_map: Mapping[str, str]) -> tuple[str, str]:
    """``(schema, table)`` in the target of the source table ``schema.table``."""
    schema, name = table.split(".", 1)
    return schema_map.get(schema, schema), name


def table_misfit(table: TableDef, known: Collection[str], schema_map: Mapping[str, str]) -> str | None:
    """Why ``table`` cannot land in PostgreSQL as named beside the ``known`` source tables; None when it can.

    Its mapped schema, its name and its columns' names must fit in an
    identifier, untruncated; it may not land in the Applier's staging schema or
    be named like its checkpoint table (in any schema: that table is found on
    the search path); its columns may not be named like the staging tables'
    own; and no other source table may map to the same target table.
    """
    schema, name = target_name(table.name, schema_map)
    mapped = f"{schema}.{name}"
    if schema != table.schema_name:
        mapped += f" (target.schema_map maps {table.schema_name} to {schema})"
    remap = "map its schema elsewhere with target.schema_map"
    for kind, ident in (("schema", schema), ("table name", name), *(("column", c) for c in table.column_names)):
        size = len(ident.encode())
        if size > MAX_IDENTIFIER:
            return (
                f"its {kind} {ident[:40]}… has {size} bytes; PostgreSQL keeps the first {MAX_IDENTIFIER} "
                "of an identifier, so two names could land in one"
            )
    if schema == STAGING_SCHEMA:
        return f"it would land in {mapped}, in the Applier's staging schema {STAGING_SCHEMA}; {remap}"
    if name == CHECKPOINT_TABLE:
        return f"it would land in {mapped}, named like the Applier's checkpoint table {CHECKPOINT_TABLE}"
    reserved = sorted({OP, ROW_ID, COUNT} & set(table.column_names))
    if reserved:
        return (
            f"its column {reserved[0]} is named like a column the Applier adds to staging tables "
            f"({OP}, {ROW_ID}, {COUNT})"
        )
    for other in sorted(known):
        if target_name(other, schema_map) == (schema, name):
            return f"it would land in {mapped}, the target table of {other}; {remap}"
    return None


def _columns(names: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def _column_def(column: Column, *, nullable: bool) -> sql.Composed:
    not_null = sql.SQL("") if nullable else sql.SQL(" NOT NULL")
    return sql.SQL("{} {}{}").format(sql.Identifier(column.name), sql.SQL(pg_type(column.type)), not_null)


def create_schema(name: str) -> sql.Composed:
    return sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(name))


def create_table(ident: sql.Identifier, table: TableDef) -> sql.Composed:
    """``CREATE TABLE IF NOT EXISTS`` with the columns, their nullability and the primary key."""
    parts = [_column_def(c, nullable=c.nullable) for c in table.columns]
    if table.primary_key:
        parts.append(sql.SQL("PRIMARY KEY ({})").format(_columns(table.primary_key)))
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(ident, sql.SQL(", ").join(parts))


def add_column(ident: sql.Identifier, column: Column) -> sql.Composed:
    """Evolve a table by a nullable column; rows already there read it as null."""
    return sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {}").format(ident, _column_def(column, nullable=True))


def staging_columns(table: TableDef) -> tuple[str, ...]:
    """The staging table's columns, in COPY order."""
    return (*table.column_names, OP) if table.primary_key else (ROW_ID, *table.column_names, COUNT)


def create_staging(ident: sql.Identifier, table: TableDef) -> sql.Composed:
    """An unlogged staging table for ``table``'s net changes (every column nullable)."""
    parts = [_column_def(c, nullable=True) for c in table.columns]
    if table.primary_key:
        parts.append(sql.SQL("{} char(1) NOT NULL").format(sql.Identifier(OP)))
    else:
        parts.insert(0, sql.SQL("{} bigint NOT NULL").format(sql.Identifier(ROW_ID)))
        parts.append(sql.SQL("{} bigint NOT NULL").format(sql.Identifier(COUNT)))
    return sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(ident, sql.SQL(", ").join(parts))


def drop_table(ident: sql.Identifier) -> sql.Composed:
    return sql.SQL("DROP TABLE IF EXISTS {}").format(ident)


def copy_into(ident: sql.Identifier, columns: Sequence[str]) -> sql.Composed:
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT binary)").format(ident, _columns(columns))


def truncate(ident: sql.Identifier) -> sql.Composed:
    return sql.SQL("TRUNCATE TABLE {}").format(ident)


def _equal(left: str, right: str, column: Column) -> sql.Composed:
    """``left.c = right.c``, null-safe for a nullable column."""
    op = sql.SQL("IS NOT DISTINCT FROM" if column.nullable else "=")
    return sql.SQL("{} {} {}").format(sql.Identifier(left, column.name), op, sql.Identifier(right, column.name))


def delete_keyed(ident: sql.Identifier, stage: sql.Identifier, table: TableDef) -> sql.Composed:
    """Delete the rows whose keys are staged as ``D``; its row count: the keys found."""
    match = sql.SQL(" AND ").join(_equal("t", "s", table.column(k)) for k in table.primary_key)
    return sql.SQL("DELETE FROM {} AS t USING {} AS s WHERE s.{} = 'D' AND {}").format(
        ident, stage, sql.Identifier(OP), match
    )


def upsert_keyed(ident: sql.Identifier, stage: sql.Identifier, table: TableDef) -> sql.Composed:
    """Insert the rows staged as ``I`` or ``U``, or update the row holding the key (``INSERT … ON CONFLICT``)."""
    others = [n for n in table.column_names if n not in table.primary_key]
    sets = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in others)
    action = sql.SQL("DO UPDATE SET {}").format(sets) if others else sql.SQL("DO NOTHING").format()
    return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} WHERE {} <> 'D' ON CONFLICT ({}) {}").format(
        ident,
        _columns(table.column_names),
        _columns(table.column_names),
        stage,
        sql.Identifier(OP),
        _columns(table.primary_key),
        action,
    )


def update_keyed(ident: sql.Identifier, stage: sql.Identifier, table: TableDef, op: str) -> sql.Composed:
    """Update the rows whose keys are staged with ``op`` to their staged final rows; its row count: the keys found.

    A table of key columns only sets its key to itself, so that the count still
    says which keys were found.
    """
    match = sql.SQL(" AND ").join(_equal("t", "s", table.column(k)) for k in table.primary_key)
    others = [n for n in table.column_names if n not in table.primary_key] or list(table.primary_key)
    sets = sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.Identifier(n), sql.Identifier("s", n)) for n in others)
    return sql.SQL("UPDATE {} AS t SET {} FROM {} AS s WHERE s.{} = {} AND {}").format(
        ident, sets, stage, sql.Identifier(OP), sql.Literal(op), match
    )


def insert_missing(ident: sql.Identifier, stage: sql.Identifier, table: TableDef, op: str) -> sql.Composed:
    """Insert the rows staged with ``op`` whose key holds no row; its row count: the rows inserted.

    ``ON CONFLICT (key) DO NOTHING`` finds a held key through the key's
    unique index, row by row. An anti-join (``NOT EXISTS``) would be planned
    against the table's statistics: a table just emptied (analyzed at 0
    rows) gets a nested loop over a sequential scan of the table it is
    filling, quadratic in the rows (38 s against MERGE's 0.27 s for 100,000
    rows; the benchmark's retired ``pg-forms`` step). A unique index on another column still
    refuses a duplicate value. The target inserts net inserts with
    :func:`insert_staged` once an ``UPDATE`` found none of their keys held,
    as fast as ``MERGE``: ``ON CONFLICT``'s speculative inserts cost about
    1.5 s more a million rows (docs/benchmarks.md). This form serves when
    some keys were held.
    """
    return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} WHERE {} = {} ON CONFLICT ({}) DO NOTHING").format(
        ident,
        _columns(table.column_names),
        _columns(table.column_names),
        stage,
        sql.Identifier(OP),
        sql.Literal(op),
        _columns(table.primary_key),
    )


def insert_staged(ident: sql.Identifier, stage: sql.Identifier, table: TableDef, op: str) -> sql.Composed:
    """Insert every row staged with ``op`` (their keys are known to be free: a plain ``INSERT … SELECT``)."""
    return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} WHERE {} = {}").format(
        ident, _columns(table.column_names), _columns(table.column_names), stage, sql.Identifier(OP), sql.Literal(op)
    )


def has_key_index() -> str:
    """Whether a table (parameter: its quoted name) has a unique index on exactly the key (parameter: sorted names)."""
    return (
        "SELECT EXISTS (SELECT FROM pg_index i WHERE i.indrelid = %s::regclass AND i.indisunique "
        "AND i.indpred IS NULL AND i.indexprs IS NULL AND (SELECT array_agg(a.attname::text ORDER BY a.attname::text) "
        "FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)) = %s::text[])"
    )


def staged_ops(stage: sql.Identifier) -> sql.Composed:
    """How many staged rows of each ``__op`` (keyed) a staging table holds."""
    return sql.SQL("SELECT {0}, count(*) FROM {1} GROUP BY {0}").format(sql.Identifier(OP), stage)


def merge_keyed(ident: sql.Identifier, stage: sql.Identifier, table: TableDef) -> sql.Composed:
    """One ``MERGE`` applying a keyed staging table: delete ``D`` keys, update or insert ``I`` and ``U`` rows.

    On PostgreSQL 15 it beat a ``DELETE … USING`` followed by ``INSERT … ON
    CONFLICT`` (:func:`delete_keyed`, :func:`upsert_keyed`) on the same staged
    rows (the benchmark's retired ``pg-forms`` step), but it cannot tell what it found: the target
    applies :func:`delete_keyed`, :func:`update_keyed` and
    :func:`insert_missing` instead, whose row counts show the collisions.
    Staged keys are unique (net changes), so no target row matches twice.
    """
    match = sql.SQL(" AND ").join(_equal("t", "s", table.column(k)) for k in table.primary_key)
    others = [n for n in table.column_names if n not in table.primary_key]
    sets = sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.Identifier(n), sql.Identifier("s", n)) for n in others)
    update = sql.SQL("UPDATE SET {}").format(sets) if others else sql.SQL("DO NOTHING").format()
    return sql.SQL(
        "MERGE INTO {target} AS t USING {stage} AS s ON {match} "
        "WHEN MATCHED AND s.{op} = 'D' THEN DELETE "
        "WHEN MATCHED THEN {update} "
        "WHEN NOT MATCHED AND s.{op} <> 'D' THEN INSERT ({columns}) VALUES ({values})"
    ).format(
        target=ident,
        stage=stage,
        match=match,
        op=sql.Identifier(OP),
        update=update,
        columns=_columns(table.column_names),
        values=sql.SQL(", ").join(sql.Identifier("s", n) for n in table.column_names),
    )


def delete_copies(ident: sql.Identifier, stage: sql.Identifier, table: TableDef) -> sql.Composed:
    """Delete exactly ``-__n`` matching rows for each row value staged with a negative count.

    Rows of a table without a key have no identity: any ``-__n`` of the equal
    rows go (numbered per staged value by ``ctid``), never more.
    """
    match = sql.SQL(" AND ").join(_equal("t", "s", c) for c in table.columns)
    return sql.SQL(
        "DELETE FROM {target} AS t USING ("
        "SELECT m.ctid AS row_ctid FROM ("
        "SELECT t.ctid, s.{n} AS n, row_number() OVER (PARTITION BY s.{id} ORDER BY t.ctid) AS copy "
        "FROM {target} AS t JOIN {stage} AS s ON {match} WHERE s.{n} < 0"
        ") AS m WHERE m.copy <= -m.n"
        ") AS d WHERE t.ctid = d.row_ctid"
    ).format(target=ident, stage=stage, match=match, n=sql.Identifier(COUNT), id=sql.Identifier(ROW_ID))


def insert_copies(ident: sql.Identifier, stage: sql.Identifier, table: TableDef) -> sql.Composed:
    """Insert ``__n`` copies of each row value staged with a positive count."""
    columns = sql.SQL(", ").join(sql.Identifier("s", n) for n in table.column_names)
    return sql.SQL(
        "INSERT INTO {} ({}) SELECT {} FROM {} AS s CROSS JOIN LATERAL generate_series(1, s.{}) WHERE s.{} > 0"
    ).format(ident, _columns(table.column_names), columns, stage, sql.Identifier(COUNT), sql.Identifier(COUNT))


def create_checkpoint_table() -> sql.Composed:
    """The checkpoint table: one row per configuration, written in each cycle's transaction."""
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} ("
        "configuration_name text PRIMARY KEY, cycle_id bigint NOT NULL, applied_seq bigint NOT NULL, "
        "applied_commit_lsn bigint NOT NULL, restart_seq bigint NOT NULL, committed_at timestamptz NOT NULL, "
        "state jsonb)"
    ).format(sql.Identifier(CHECKPOINT_TABLE))


ALL_COLUMNS_QUERY = (
    "SELECT table_schema, table_name, column_name, data_type, character_maximum_length, numeric_precision, "
    "numeric_scale, is_nullable = 'YES', column_default IS NOT NULL "
    "FROM information_schema.columns WHERE table_schema = ANY(%s) ORDER BY table_schema, table_name, ordinal_position"
)
"""Every column of the tables in the given schemas (``pg_drift.FoundColumn`` after schema and table)."""


def add_state_column() -> sql.Composed:
    """The checkpoint's copy (``state``), added to a checkpoint table made before it existed."""
    return sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS state jsonb").format(sql.Identifier(CHECKPOINT_TABLE))


def save_state() -> sql.Composed:
    """Keep a copy of the Applier's checkpoint in its row (parameters: configuration, state JSON).

    A configuration without a row yet gets one at cycle 0: its tables hold no cycle.
    """
    return sql.SQL(
        "INSERT INTO {} (configuration_name, cycle_id, applied_seq, applied_commit_lsn, restart_seq, committed_at, "
        "state) VALUES (%s, 0, 0, 0, 0, now(), %s) "
        "ON CONFLICT (configuration_name) DO UPDATE SET state = EXCLUDED.state"
    ).format(sql.Identifier(CHECKPOINT_TABLE))


def saved_state() -> sql.Composed:
    return sql.SQL("SELECT state FROM {} WHERE configuration_name = %s").format(sql.Identifier(CHECKPOINT_TABLE))


def upsert_checkpoint() -> sql.Composed:
    """Record a cycle; parameters in :data:`CHECKPOINT_COLUMNS` order."""
    return sql.SQL(
        "INSERT INTO {} ({}, committed_at) VALUES (%s, %s, %s, %s, %s, now()) "
        "ON CONFLICT (configuration_name) DO UPDATE SET cycle_id = EXCLUDED.cycle_id, "
        "applied_seq = EXCLUDED.applied_seq, applied_commit_lsn = EXCLUDED.applied_commit_lsn, "
        "restart_seq = EXCLUDED.restart_seq, committed_at = EXCLUDED.committed_at, part_through = 0"
    ).format(sql.Identifier(CHECKPOINT_TABLE), _columns(CHECKPOINT_COLUMNS))


def add_part_column() -> sql.Composed:
    """``part_through``: how many transactions of the cycle after ``cycle_id`` are in (a cycle applied in parts)."""
    return sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS part_through bigint NOT NULL DEFAULT 0").format(
        sql.Identifier(CHECKPOINT_TABLE)
    )


def record_part() -> sql.Composed:
    """Record a part of the cycle after the row's (parameters: configuration, that cycle minus 1, part's end).

    The position columns stay as the last whole cycle left them; a configuration
    without a row gets one at cycle 0.
    """
    return sql.SQL(
        "INSERT INTO {} (configuration_name, cycle_id, applied_seq, applied_commit_lsn, restart_seq, committed_at, "
        "part_through) VALUES (%s, %s, 0, 0, 0, now(), %s) "
        "ON CONFLICT (configuration_name) DO UPDATE SET part_through = EXCLUDED.part_through, committed_at = now()"
    ).format(sql.Identifier(CHECKPOINT_TABLE))


def committed_position() -> sql.Composed:
    """The row's whole cycle and the part of the next one it holds."""
    return sql.SQL("SELECT cycle_id, part_through FROM {} WHERE configuration_name = %s").format(
        sql.Identifier(CHECKPOINT_TABLE)
    )
