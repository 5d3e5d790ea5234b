"""Helpers of the extractor's PostgreSQL tests: a configuration, the pairs' rows, row sets to compare."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
from psycopg import sql

from applier.config import Config, load_config
from applier.extract import setup_source
from applier.intermediate.pairs import list_pairs
from applier.intermediate.scan import scan_directory


def extract_config(tmp_path: Path, source: tuple[str, str, str], *settings: str) -> Config:
    url, slot, publication = source
    return load_config(
        None,
        [
            "configuration_name=ext",
            f"intermediate_dir={tmp_path / 'pairs'}",
            f"output_dir={tmp_path / 'out'}",
            f"target.path={tmp_path / 'target'}",
            f"source.url={url}",
            f"source.slot={slot}",
            f"source.publication={publication}",
            *settings,
        ],
    )


def prepare(config: Config, *statements: str) -> None:
    """Run ``statements`` on the source (tables before the publication), then --setup."""
    assert config.source.url
    with psycopg.connect(config.source.url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]
    setup_source(config)


def execute(config: Config, *statements: str) -> None:
    """Each statement in a transaction of its own, on the source."""
    assert config.source.url
    with psycopg.connect(config.source.url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def pair_rows(directory: Path) -> list[dict[str, Any]]:
    """Every row of every complete pair, in order, images parsed; the directory is checked against the spec first."""
    scan_directory(directory)
    rows: list[dict[str, Any]] = []
    for pair in list_pairs(directory).pairs:
        for row in pq.read_table(pair.dat_path).to_pylist():
            row["before"] = json.loads(row["before"]) if row["before"] else None
            row["after"] = json.loads(row["after"]) if row["after"] else None
            rows.append(row)
    return rows


def trn_events(directory: Path) -> list[dict[str, Any]]:
    events = []
    for pair in list_pairs(directory).pairs:
        lines = pair.trn_path.read_text().splitlines()
        events += [{**json.loads(line), "seq": pair.seq} for line in lines[1:]]
    return events


def norm(value: Any) -> Any:
    """One form for a value read from a source, a PostgreSQL target or a Delta table."""
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    return value


def _casts(conn: psycopg.Connection[Any], schema: str, table: str) -> sql.Composable:
    cols = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
        "ORDER BY ordinal_position",
        (schema, table),
    ).fetchall()
    parts = []
    for name, data_type in cols:
        ident = sql.Identifier(name)
        if data_type == "real":
            parts.append(sql.SQL("{}::float8").format(ident))
        elif data_type in ("uuid", "json", "jsonb"):
            parts.append(sql.SQL("{}::text").format(ident))
        else:
            parts.append(ident)
    return sql.SQL(", ").join(parts)


def pg_row_set(url: str, table: str, *, source_types: bool) -> Counter[tuple[Any, ...]]:
    """A table's rows as a multiset; a source's real, uuid and json columns as the spec carries them."""
    schema, name = table.split(".", 1)
    with psycopg.connect(url) as conn:
        columns = _casts(conn, schema, name) if source_types else sql.SQL("*")
        query = sql.SQL("SELECT {} FROM {}").format(columns, sql.Identifier(schema, name))
        return Counter(tuple(norm(v) for v in row) for row in conn.execute(query))


def delta_row_set(path: Path) -> Counter[tuple[Any, ...]]:
    from deltalake import DeltaTable

    data = DeltaTable(str(path)).to_pyarrow_table()
    return Counter(tuple(norm(v) for v in row.values()) for row in data.to_pylist())
