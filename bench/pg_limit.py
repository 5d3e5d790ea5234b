"""The calibrated limit on PostgreSQL (runs in a child process, ``--part limit``).

The least work any apply of this workload to PostgreSQL must do: read every
``.dat`` file and parse every image in Spark (exactly the Delta calibration's
Spark half, ``bench.limit``), then, with Spark stopped, COPY the final rows
alone into staging tables and apply them set-wise into empty tables with the
target's own statements, in one transaction. The final rows are those the
compiled run left in its database, read before anything is timed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.common import BenchError
from bench.workload import latest_table_defs


def final_changes(source_url: str, defs: dict[str, Any]) -> dict[str, Any]:
    """Every table's rows in the database at ``source_url``, as net changes into an empty table.

    Keyed tables: every row an upsert. Tables without a key: every row one copy.
    """
    import pyarrow as pa

    from applier.engine.changes import COUNT_COLUMN, TableChanges, arrow_schema, typed
    from applier.targets.postgres import PostgresTarget

    source = PostgresTarget(source_url, "bench_source", spill_dir=Path("/nonexistent"))
    out = {}
    try:
        for name, table in defs.items():
            rows = source.read_arrow(name)
            if rows is None:
                continue
            rows = typed(rows, arrow_schema(table))
            key = list(table.primary_key)
            stats = {"I": rows.num_rows, "U": 0, "D": 0, "T": 0}
            if key:
                out[name] = TableChanges(table, False, rows, rows.slice(0, 0).select(key), None, stats)
            else:
                counted = rows.append_column(COUNT_COLUMN, pa.repeat(pa.scalar(1, pa.int64()), rows.num_rows))
                out[name] = TableChanges(table, False, rows.slice(0, 0), rows.slice(0, 0).select([]), counted, stats)
    finally:
        source.close()
    return out


def stage(conn: Any, changes: dict[str, Any], prefix: str = "limit", schema: str = "applier_staging") -> dict[str, Any]:
    """Create the tables and one staging table per table (untimed), then COPY each table's rows into its staging.

    Returns:
        Per table: its staging table, rows, CSV bytes and the seconds to encode and COPY them.
    """
    from psycopg import sql

    from applier.targets import pg_sql as q
    from applier.targets.pg_load import staging_rows
    from bench.pg_source import copy_data

    staged: dict[str, Any] = {}
    with conn.transaction():
        conn.execute(q.create_schema(schema))
        for n, (name, net) in enumerate(changes.items()):
            conn.execute(q.create_schema(net.table.schema_name))
            conn.execute(q.create_table(q.target_table(net.table, {}), net.table))
            ident = sql.Identifier(schema, f"{prefix}_{n}")
            conn.execute(q.create_staging(ident, net.table))
            staged[name] = {"stage": ident}
    for name, net in changes.items():
        started = time.perf_counter()
        rows = staging_rows(net)
        data = copy_data(rows)
        encoded = time.perf_counter()
        copy = q.copy_into(staged[name]["stage"], q.staging_columns(net.table))
        with conn.transaction(), conn.cursor().copy(copy) as c:
            c.write(data)
        staged[name].update(
            rows=rows.num_rows, bytes=len(data), encode_s=encoded - started, copy_s=time.perf_counter() - encoded
        )
    return staged


def apply_staged(conn: Any, changes: dict[str, Any], staged: dict[str, Any]) -> dict[str, Any]:
    """Apply every staging table set-wise into its (empty) table, in one transaction; seconds per table and commit."""
    from applier.targets import pg_sql as q

    seconds: dict[str, float] = {}
    with conn.transaction():
        for name, net in changes.items():
            started = time.perf_counter()
            ident, stage_ident = q.target_table(net.table, {}), staged[name]["stage"]
            if net.table.primary_key:
                conn.execute(q.merge_keyed(ident, stage_ident, net.table))
            else:
                conn.execute(q.insert_copies(ident, stage_ident, net.table))
            seconds[name] = time.perf_counter() - started
        committing = time.perf_counter()
    return {"per_table_s": seconds, "commit_s": time.perf_counter() - committing}


def _spark_parse(params: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The Spark half: start a session, read every ``.dat`` file and parse every image per table, stop."""
    from pyspark.sql import functions as F

    from applier.config import load_config
    from applier.engine.session import start_spark
    from applier.engine.sparkapply import DAT_DDL
    from applier.intermediate.pairs import list_pairs
    from bench.limit import _parse_per_table

    dats = [str(p.dat_path) for p in list_pairs(Path(params["intermediate_dir"])).pairs]
    started = time.perf_counter()
    spark = start_spark(load_config(None, params["settings"]))
    ready = time.time()
    startup = time.perf_counter() - started
    rows = spark.read.schema(DAT_DDL).parquet(*dats)
    parse_per_table, parse_s = _parse_per_table(rows, defs)
    images = rows.select(
        F.sum(F.col("before").isNotNull().cast("long")).alias("b"),
        F.sum(F.col("after").isNotNull().cast("long")).alias("a"),
        F.count(F.lit(1)).alias("n"),
    ).first()
    spark.stop()
    return {
        "spark_startup_s": startup,
        "startup_since_spawn_s": ready - params["spawned_at"],
        "parse_s": parse_s,
        "parse_per_table_s": parse_per_table,
        "images": (images["b"] + images["a"]) if images else 0,
        "dat_rows": images["n"] if images else 0,
    }


def copy_and_apply(source_url: str, url: str, defs: dict[str, Any]) -> dict[str, Any]:
    """The PostgreSQL half of the limit: the final rows of ``source_url`` COPYed into staging and applied at ``url``.

    Returns:
        Seconds reading the final rows (untimed work), COPYing them (encoding included) and applying them
        (commit included), the commit alone, per table the rows, bytes and seconds, and the rows in all.

    Raises:
        BenchError: a table ends with a different number of rows than it was given.
    """
    import psycopg

    read_started = time.perf_counter()
    changes = final_changes(source_url, defs)
    read_final_s = time.perf_counter() - read_started
    with psycopg.connect(url, autocommit=True, application_name="cdc-bench limit") as conn:
        staged = stage(conn, changes)
        applied = apply_staged(conn, changes, staged)
        for name, net in changes.items():
            count = conn.execute(count_rows(net.table)).fetchone()
            if count is None or count[0] != staged[name]["rows"]:
                raise BenchError(f"limit apply of {name}: {count} rows in the table, {staged[name]['rows']} staged")
    return {
        "read_final_s": read_final_s,
        "copy_s": sum(s["encode_s"] + s["copy_s"] for s in staged.values()),
        "apply_s": sum(applied["per_table_s"].values()) + applied["commit_s"],
        "commit_s": applied["commit_s"],
        "per_table": {
            name: {**{k: v for k, v in s.items() if k != "stage"}, "apply_s": applied["per_table_s"][name]}
            for name, s in staged.items()
        },
        "final_rows": sum(s["rows"] for s in staged.values()),
    }


def part_limit(params: dict[str, Any]) -> dict[str, Any]:
    """Read and parse every image in Spark; then COPY the final rows into staging and apply them set-wise.

    Args:
        params: ``intermediate_dir``, ``settings`` (``--set`` overrides for the Spark session), ``source_url``
            (the database holding the final rows), ``url`` (an empty database) and ``spawned_at``.

    Returns:
        Spark start-up and parse seconds, and what :func:`copy_and_apply` returns.
    """
    defs = latest_table_defs(Path(params["intermediate_dir"]))
    result = _spark_parse(params, defs)
    result.update(copy_and_apply(params["source_url"], params["url"], defs))
    print(f"limit: copy {result['copy_s']:.2f} s, apply {result['apply_s']:.2f} s", flush=True)
    return result


def count_rows(table: Any) -> Any:
    """``SELECT count(*)`` of a table (its name quoted)."""
    from psycopg import sql

    from applier.targets import pg_sql as q

    return sql.SQL("SELECT count(*) FROM {}").format(q.target_table(table, {}))
