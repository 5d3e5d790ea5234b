"""The calibrated limit of this machine (parts ``limit`` and ``pg-limit``): the least work any apply must do.

Both read every ``.dat`` file and parse every image with the engine's typed
``from_json`` in a fresh Spark application (per table, forced by a ``noop``
write), its JVM compiling with both compilers, as suits work done in the JVM.
Then, with Spark stopped, the final rows alone are written into empty tables:
on **Delta** one delta-rs ``merge`` per table of the rows the one-cycle engine
run left; on **PostgreSQL** a COPY of the rows the one-cycle compiled run left
into staging tables (encoded as the target encodes them) and their set-wise
apply with the target's own statements, in one transaction. The final rows are
read before anything is timed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.measure import BenchError
from bench.workload import latest_table_defs


def _parse_per_table(rows: Any, defs: dict[str, Any]) -> tuple[dict[str, float], float]:
    """Per table, filter its rows and parse both images, forced by a ``noop`` write; seconds per table and in all."""
    from pyspark.sql import functions as F

    from applier.engine.images_spark import parse_image

    per_table: dict[str, float] = {}
    started = time.perf_counter()
    for name, table in defs.items():
        t = time.perf_counter()
        parsed = rows.filter(F.col("table") == name).select(
            parse_image(F.col("before"), table.columns).alias("b"),
            parse_image(F.col("after"), table.columns).alias("a"),
        )
        parsed.write.format("noop").mode("overwrite").save()
        per_table[name] = time.perf_counter() - t
        print(f"parse {name}: {per_table[name]:.2f} s", flush=True)
    return per_table, time.perf_counter() - started


def _parse_one_pass(rows: Any, defs: dict[str, Any]) -> float:
    """The same work in one pass (each image parsed by its table's schema), for comparison; its seconds."""
    from pyspark.sql import functions as F

    from applier.engine.images_spark import parse_image

    t = time.perf_counter()
    one_pass = [
        F.when(F.col("table") == name, parse_image(F.col(side), table.columns)).alias(f"{side}{i}")
        for i, (name, table) in enumerate(defs.items())
        for side in ("before", "after")
    ]
    rows.select(*one_pass).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t


def spark_parse(params: dict[str, Any], defs: dict[str, Any], one_pass: bool) -> dict[str, Any]:
    """The Spark half: start a session, read every ``.dat`` file, parse every image per table (and in one pass)."""
    from pyspark.sql import functions as F

    from applier.config import load_config
    from applier.engine.jvm_archive import archive_options
    from applier.engine.session import JVM_OPTIONS, start_spark
    from applier.engine.sources import DAT_DDL
    from applier.intermediate.pairs import list_pairs

    dats = [str(p.dat_path) for p in list_pairs(Path(params["intermediate_dir"])).pairs]
    started = time.perf_counter()
    # Both of the JVM's compilers: the limit's work is all in the JVM (the engine's driver compiles with C1 only).
    jvm = f"spark.conf.spark.driver.extraJavaOptions={JVM_OPTIONS} {archive_options()}".strip()
    spark = start_spark(load_config(None, [*params["settings"], jvm])).session  # the limit's work is SQL: its start
    ready = time.time()
    startup = time.perf_counter() - started
    rows = spark.read.schema(DAT_DDL).parquet(*dats)
    parse_per_table, parse_s = _parse_per_table(rows, defs)
    one_pass_s = _parse_one_pass(rows, defs) if one_pass else None
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
        "parse_one_pass_s": one_pass_s,
        "images": (images["b"] + images["a"]) if images else 0,
        "dat_rows": images["n"] if images else 0,
    }


# ---------------------------------------------------------------------------
# Delta


def _merge_final_rows(name: str, table: Any, final: Any, root: Path) -> dict[str, Any]:
    """Merge the final rows of one table as upserts into a new empty Delta table; rows, seconds, inserted."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from applier.engine.changes import arrow_schema

    schema = arrow_schema(table)
    final = final.select(schema.names).cast(pa.schema([f.with_nullable(True) for f in schema]))
    path = str(root / name.replace(".", "/"))
    DeltaTable.create(path, schema, mode="error")
    predicate = " AND ".join(f'(t."{c}" IS NOT DISTINCT FROM s."{c}")' for c in table.primary_key or table.column_names)
    t = time.perf_counter()
    merge = DeltaTable(path).merge(final, predicate, source_alias="s", target_alias="t")
    metrics = merge.when_matched_update_all().when_not_matched_insert_all().execute()
    seconds = time.perf_counter() - t
    if (written := DeltaTable(path).to_pyarrow_dataset().count_rows()) != final.num_rows:
        raise BenchError(f"limit merge of {name}: {written} rows written of {final.num_rows}")
    print(f"merge {name}: {final.num_rows} rows in {seconds:.2f} s", flush=True)
    return {"rows": final.num_rows, "seconds": seconds, "inserted": metrics.get("num_target_rows_inserted")}


def part_limit(params: dict[str, Any]) -> dict[str, Any]:
    """The Delta limit: Spark parses every image; then one delta-rs merge per table of the final rows alone.

    Args:
        params: ``intermediate_dir``, ``settings`` (``--set`` overrides for the Spark session), ``engine_target``
            and ``engine_app_id`` (where the final rows are read from), ``out_dir`` and ``spawned_at``.
    """
    from applier.targets.delta import DeltaTarget

    defs = latest_table_defs(Path(params["intermediate_dir"]))
    result = spark_parse(params, defs, one_pass=True)
    source = DeltaTarget(Path(params["engine_target"]), params["engine_app_id"])
    merges: dict[str, dict[str, Any]] = {}
    for name, table in defs.items():
        if (final := source.read_arrow(name)) is not None:
            merges[name] = _merge_final_rows(name, table, final, Path(params["out_dir"]))
    merge_s = sum(m["seconds"] for m in merges.values())
    return {
        **result,
        "merge_s": merge_s,
        "merge_per_table": merges,
        "final_rows": sum(m["rows"] for m in merges.values()),
    }


# ---------------------------------------------------------------------------
# PostgreSQL


def final_changes(source_url: str, defs: dict[str, Any]) -> dict[str, Any]:
    """Every table's rows in the database at ``source_url``, as net changes into an empty table.

    Keyed tables: every row an upsert. Tables without a key: every row one copy.
    """
    import pyarrow as pa

    from applier.engine.changes import COUNT_COLUMN, TableChanges, arrow_schema, typed
    from applier.targets.postgres import PostgresTarget

    source = PostgresTarget(source_url, "bench_source")
    out = {}
    try:
        for name, table in defs.items():
            if (rows := source.read_arrow(name)) is None:
                continue
            rows, key = typed(rows, arrow_schema(table)), list(table.primary_key)
            stats = {"I": rows.num_rows, "U": 0, "D": 0, "T": 0}
            none = rows.slice(0, 0)
            if key:
                new = pa.repeat(pa.scalar(True), rows.num_rows)  # every key new: net inserts
                out[name] = TableChanges(table, False, rows, none.select(key), None, stats, new)
            else:
                counted = rows.append_column(COUNT_COLUMN, pa.repeat(pa.scalar(1, pa.int64()), rows.num_rows))
                out[name] = TableChanges(table, False, none, none.select([]), counted, stats)
    finally:
        source.close()
    return out


def stage(conn: Any, changes: dict[str, Any], prefix: str = "limit", schema: str = "applier_staging") -> dict[str, Any]:
    """Create the tables and one staging table per table (untimed), then COPY each table's rows into its staging.

    Returns:
        Per table: its staging table, rows, COPY bytes (binary) and the seconds to encode and COPY them.
    """
    from psycopg import sql

    from applier.targets import pg_sql as q
    from applier.targets.pg_load import staging_rows
    from bench.source import copy_data

    staged: dict[str, Any] = {}
    with conn.transaction():
        conn.execute(q.create_schema(schema))
        for n, (name, net) in enumerate(changes.items()):
            conn.execute(q.create_schema(net.table.schema_name))
            conn.execute(q.create_table(q.target_table(net.table, {}), net.table))
            staged[name] = {"stage": sql.Identifier(schema, f"{prefix}_{n}")}
            conn.execute(q.create_staging(staged[name]["stage"], net.table))
    for name, net in changes.items():
        started = time.perf_counter()
        rows = staging_rows(net)
        data = copy_data(rows)
        encoded = time.perf_counter()
        with (
            conn.transaction(),
            conn.cursor().copy(q.copy_into(staged[name]["stage"], q.staging_columns(net.table))) as c,
        ):
            c.write(data)
        staged[name].update(
            rows=rows.num_rows, bytes=len(data), encode_s=encoded - started, copy_s=time.perf_counter() - encoded
        )
    return staged


def count_rows(table: Any) -> Any:
    """``SELECT count(*)`` of a table (its name quoted)."""
    from psycopg import sql

    from applier.targets import pg_sql as q

    return sql.SQL("SELECT count(*) FROM {}").format(q.target_table(table, {}))


def copy_and_apply(source_url: str, url: str, defs: dict[str, Any]) -> dict[str, Any]:
    """The PostgreSQL half of the limit: the final rows of ``source_url`` COPYed into staging and applied at ``url``.

    Returns:
        Seconds reading the final rows (untimed work), COPYing them (encoding included) and applying them
        (commit included), the commit alone, per table the rows, bytes and seconds, and the rows in all.

    Raises:
        BenchError: a table ends with a different number of rows than it was given.
    """
    import psycopg

    from applier.targets import pg_apply
    from applier.targets import pg_sql as q

    read_started = time.perf_counter()
    changes = final_changes(source_url, defs)
    read_final_s = time.perf_counter() - read_started
    with psycopg.connect(url, autocommit=True, application_name="cdc-bench limit") as conn:
        staged = stage(conn, changes)
        with conn.transaction():
            for name, net in changes.items():
                started = time.perf_counter()
                ident, stage_ident = q.target_table(net.table, {}), staged[name]["stage"]
                if net.table.primary_key:  # the target's set-wise statements
                    pg_apply.apply_keyed(conn, ident, stage_ident, net.table)
                else:
                    conn.execute(q.insert_copies(ident, stage_ident, net.table))
                staged[name]["apply_s"] = time.perf_counter() - started
            committing = time.perf_counter()
        commit_s = time.perf_counter() - committing
        for name, net in changes.items():
            count = conn.execute(count_rows(net.table)).fetchone()
            if count is None or count[0] != staged[name]["rows"]:
                raise BenchError(f"limit apply of {name}: {count} rows in the table, {staged[name]['rows']} staged")
    return {
        "read_final_s": read_final_s,
        "copy_s": sum(s["encode_s"] + s["copy_s"] for s in staged.values()),
        "apply_s": sum(s["apply_s"] for s in staged.values()) + commit_s,
        "commit_s": commit_s,
        "per_table": {name: {k: v for k, v in s.items() if k != "stage"} for name, s in staged.items()},
        "final_rows": sum(s["rows"] for s in staged.values()),
    }


def part_pg_limit(params: dict[str, Any]) -> dict[str, Any]:
    """The PostgreSQL limit: Spark parses every image; then the final rows COPYed into staging and applied set-wise.

    Args:
        params: ``intermediate_dir``, ``settings`` (``--set`` overrides for the Spark session), ``source_url``
            (the database holding the final rows), ``url`` (an empty database) and ``spawned_at``.
    """
    defs = latest_table_defs(Path(params["intermediate_dir"]))
    result = spark_parse(params, defs, one_pass=False)
    result.update(copy_and_apply(params["source_url"], params["url"], defs))
    print(f"limit: copy {result['copy_s']:.2f} s, apply {result['apply_s']:.2f} s", flush=True)
    return result
