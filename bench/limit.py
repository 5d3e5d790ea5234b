"""The calibrated limit of this machine (runs in a child process, ``--part limit``).

The least work any apply of this workload must do: read every ``.dat`` file and
parse every image with the engine's typed ``from_json``, then write the final
rows alone with one delta-rs merge per table into empty Delta tables.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.common import BenchError
from bench.workload import latest_table_defs


def _parse_per_table(rows: Any, defs: dict[str, Any]) -> tuple[dict[str, float], float]:
    """Per table, filter its rows and parse both images, forced by a ``noop`` write; seconds per table and in all."""
    from pyspark.sql import functions as F

    from applier.engine.images_spark import parse_image

    parse_per_table: dict[str, float] = {}
    parse_started = time.perf_counter()
    for name, table in defs.items():
        t = time.perf_counter()
        one = rows.filter(F.col("table") == name)
        parsed = one.select(
            parse_image(F.col("before"), table.columns).alias("b"),
            parse_image(F.col("after"), table.columns).alias("a"),
        )
        parsed.write.format("noop").mode("overwrite").save()
        parse_per_table[name] = time.perf_counter() - t
        print(f"parse {name}: {parse_per_table[name]:.2f} s", flush=True)
    return parse_per_table, time.perf_counter() - parse_started


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
    one_pass_s = time.perf_counter() - t
    print(f"parse in one pass: {one_pass_s:.2f} s", flush=True)
    return one_pass_s


def _merge_final_rows(name: str, table: Any, final: Any, root: Path) -> dict[str, Any]:
    """Merge the final rows of one table as upserts into a new empty Delta table; rows, seconds, inserted."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from applier.engine.changes import arrow_schema

    schema = arrow_schema(table)
    final = final.select(schema.names).cast(pa.schema([f.with_nullable(True) for f in schema]))
    path = str(root / name.replace(".", "/"))
    DeltaTable.create(path, schema, mode="error")
    cols = table.primary_key or table.column_names
    predicate = " AND ".join(f'(t."{c}" IS NOT DISTINCT FROM s."{c}")' for c in cols)
    t = time.perf_counter()
    metrics = (
        DeltaTable(path)
        .merge(final, predicate, source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    seconds = time.perf_counter() - t
    written = DeltaTable(path).to_pyarrow_dataset().count_rows()
    if written != final.num_rows:
        raise BenchError(f"limit merge of {name}: {written} rows written of {final.num_rows}")
    print(f"merge {name}: {final.num_rows} rows in {seconds:.2f} s", flush=True)
    return {"rows": final.num_rows, "seconds": seconds, "inserted": metrics.get("num_target_rows_inserted")}


def part_limit(params: dict[str, Any]) -> dict[str, Any]:
    """Read and parse every image in Spark; then one delta-rs merge per table of the final rows alone.

    Args:
        params: ``intermediate_dir``, ``settings`` (the engine's ``--set`` overrides), ``engine_target`` and
            ``engine_app_id`` (where the final rows are read from), ``out_dir`` and ``spawned_at``.

    Returns:
        Spark start-up, parse and merge seconds (in all and per table) and the rows and images handled.

    Raises:
        BenchError: a merge wrote a different number of rows than it was given.
    """
    from pyspark.sql import functions as F

    from applier.config import load_config
    from applier.engine.session import start_spark
    from applier.engine.sparkapply import DAT_DDL
    from applier.intermediate.pairs import list_pairs
    from applier.targets.delta import DeltaTarget

    intermediate = Path(params["intermediate_dir"])
    defs = latest_table_defs(intermediate)
    dats = [str(p.dat_path) for p in list_pairs(intermediate).pairs]
    config = load_config(None, params["settings"])
    started = time.perf_counter()
    spark = start_spark(config)
    ready = time.time()
    startup = time.perf_counter() - started
    rows = spark.read.schema(DAT_DDL).parquet(*dats)
    parse_per_table, parse_s = _parse_per_table(rows, defs)
    one_pass_s = _parse_one_pass(rows, defs)
    images = rows.select(
        F.sum(F.col("before").isNotNull().cast("long")).alias("b"),
        F.sum(F.col("after").isNotNull().cast("long")).alias("a"),
        F.count(F.lit(1)).alias("n"),
    ).first()
    spark.stop()

    source = DeltaTarget(Path(params["engine_target"]), params["engine_app_id"])
    merge_per_table: dict[str, dict[str, Any]] = {}
    for name, table in defs.items():
        final = source.read_arrow(name)
        if final is not None:
            merge_per_table[name] = _merge_final_rows(name, table, final, Path(params["out_dir"]))
    return {
        "spark_startup_s": startup,
        "startup_since_spawn_s": ready - params["spawned_at"],
        "parse_s": parse_s,
        "parse_per_table_s": parse_per_table,
        "parse_one_pass_s": one_pass_s,
        "images": (images["b"] + images["a"]) if images else 0,
        "dat_rows": images["n"] if images else 0,
        "merge_s": sum(m["seconds"] for m in merge_per_table.values()),
        "merge_per_table": merge_per_table,
        "final_rows": sum(m["rows"] for m in merge_per_table.values()),
    }
