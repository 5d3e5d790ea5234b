"""The ``latency`` and ``materialize`` steps: a real source through extraction and apply.

``latency`` runs a light pgbench load whose every transaction also inserts a
marker row stamped with ``clock_timestamp()``, and on a schedule runs one
bounded ``applier extract`` then one ``applier run``; after each tick it reads
which markers the target shows. ``materialize`` subscribes a table of
``--materialize-rows`` rows in each mode, on a database of its own, while
replication runs (and, unless ``--materialize-writer-tps 0``, while pgbench
updates that table), then applies the pairs to each target.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.measure import Background, BenchError, applier_settings, progress, run_applier, run_measured, tail
from bench.pg_source import client_env, folder_mib, pgbench_command, pgbench_init, scalar
from bench.source_bench import extract_summary, setup_extractor

if TYPE_CHECKING:
    from bench.steps import Bench

MARKER_TABLE = "bench_marker"
MARKER_SCRIPT = """\\set aid random(1, 100000 * :scale)
\\set bid random(1, 1 * :scale)
\\set tid random(1, 10 * :scale)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
INSERT INTO bench_marker (at_us) VALUES ((extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
END;
"""
ITEMS = "public.bench_items"
WRITER_SCRIPT = """\\set id random(1, {rows})
UPDATE bench_items SET qty = qty + 1, at = now() WHERE id = :id;
"""


def execute(url: str, *statements: str) -> None:
    """Each statement in a transaction of its own."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _extract(config: Path, log_path: Path, label: str) -> dict[str, Any]:
    """One bounded ``applier extract`` in a fresh process: wall, tree peak and what it wrote."""
    cmd = [sys.executable, "-m", "applier.cli", "extract", "--config", str(config)]
    code, wall, peak = run_measured(cmd, log_path, label)
    if code != 0:
        raise BenchError(f"{label} exited {code}; log {log_path}:\n{tail(log_path)}")
    return {"wall_s": wall, "peak_tree_mib": peak, **extract_summary(log_path.read_text(encoding="utf-8"))}


def _target(b: Bench, kind: str, name: str) -> dict[str, Any]:
    """The target keys of a run: a Delta folder, or a new database with ``--threads`` apply threads."""
    if kind == "delta":
        return {"path": b.workdir / name / "target"}
    return {"type": "postgres", "url": b.dbs.create(name.replace("-", "_")), "apply.threads": b.args.threads}


def _table_path(target: dict[str, Any], table: str) -> str:
    return str(Path(target["path"]) / table.replace(".", "/"))


# ---------------------------------------------------------------------------
# latency


def _markers(target: dict[str, Any]) -> dict[int, int]:
    """The marker rows the target shows: id to commit time (µs since the epoch)."""
    if "url" in target:
        import psycopg

        with psycopg.connect(target["url"]) as conn:
            if conn.execute("SELECT to_regclass('public.bench_marker')").fetchone() == (None,):
                return {}
            return dict(conn.execute("SELECT id, at_us FROM public.bench_marker").fetchall())
    from deltalake import DeltaTable

    path = _table_path(target, f"public.{MARKER_TABLE}")
    if not DeltaTable.is_deltatable(path):
        return {}
    data = DeltaTable(path).to_pyarrow_table(columns=["id", "at_us"]).to_pydict()
    return dict(zip(data["id"], data["at_us"], strict=True))


def step_latency(b: Bench) -> None:
    """Commit to target visibility at a schedule: every ``--latency-schedule-s``, one extract, then one run."""
    a, name = b.args, "latency"
    folder, schedule = b.workdir / name, a.latency_schedule_s
    url = b.dbs.create(name)
    pgbench_init(url, 1, folder / "init.log")
    execute(url, f"CREATE TABLE {MARKER_TABLE} (id bigserial PRIMARY KEY, at_us bigint NOT NULL)")
    target = _target(b, a.latency_target, "latency_target")
    config, _, settings = setup_extractor(b, name, url, target)
    script = folder / "marker.sql"
    script.write_text(MARKER_SCRIPT, encoding="utf-8")
    load_cmd = pgbench_command(url, "-n", "-f", str(script), "-s", "1", "-c", "1", "-R", str(a.latency_rate))
    load_cmd[-1:-1] = ["-T", str(math.ceil(a.latency_ticks * schedule))]
    ticks: list[dict[str, Any]] = []
    latencies: list[float] = []
    seen: set[int] = set()
    with Background(load_cmd, folder / "load.log", "pgbench (markers)", client_env(url)) as load:
        t0 = time.time()
        for k in range(1, a.latency_ticks + 1):
            time.sleep(max(0.0, t0 + k * schedule - time.time()))
            # The load ends with the last tick: every marker must arrive.
            if k == a.latency_ticks and (stopped := load.stop(None, timeout_s=60))["code"] != 0:
                raise BenchError(f"the marker load exited {stopped['code']}:\n{tail(folder / 'load.log')}")
            tick, tick_latencies = _tick(b, k, (config, settings, target), seen)
            ticks.append({**tick, "at_s": tick["at_s"] - t0})
            latencies += tick_latencies
    committed = int(scalar(url, f"SELECT count(*) FROM {MARKER_TABLE}"))
    b.r["latency"] = {"schedule_s": schedule, "ticks": ticks, "rate": a.latency_rate, "target": a.latency_target,
                      "markers": committed, "visible": len(seen), **_percentiles(sorted(latencies)),
                      "mean_s": statistics.fmean(latencies) if latencies else 0.0}  # fmt: skip
    for db in (url, target.get("url")):
        if db:
            b.dbs.drop(db)


def _tick(
    b: Bench, k: int, setup: tuple[Path, list[str], dict[str, Any]], seen: set[int]
) -> tuple[dict[str, Any], list[float]]:
    """One tick of the schedule: a bounded extract, then a run; the markers it made visible and their latencies.

    ``seen`` holds the markers visible before; the tick adds its own.
    """
    config, settings, target = setup
    name, started = "latency", time.time()
    extract = _extract(config, b.workdir / name / f"extract-{k}.log", f"latency tick {k}: applier extract")
    run = run_applier(b.workdir, name, settings)
    ended = time.time()
    # The cycle's line is appended once its commit is done: when the rows became visible.
    cycles_file = b.workdir / name / "output" / name / "cycles.jsonl"
    visible_at = cycles_file.stat().st_mtime if cycles_file.exists() else ended
    visible_at = visible_at if started <= visible_at <= ended else ended
    new = {i: at for i, at in _markers(target).items() if i not in seen}
    seen |= set(new)
    latencies = sorted(visible_at - at / 1e6 for at in new.values())
    tick = {"tick": k, "at_s": started, "extract_s": extract["wall_s"], "extract_peak_mib": extract["peak_tree_mib"],
            "apply_s": run["wall_s"], "apply_peak_mib": run["peak_tree_mib"], "visible_s": visible_at - started,
            "rows": len(new), **_percentiles(latencies)}  # fmt: skip
    shown = ", ".join(f"{key[:-2]} {v:.1f} s" for key, v in _percentiles(latencies).items())
    progress(f"latency tick {k}: {len(new)} markers became visible ({shown or 'none'})")
    return tick, latencies


def _percentiles(values: list[float]) -> dict[str, float]:
    """p50, p95 and max of sorted seconds; none for no values."""
    if not values:
        return {}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"p50_s": q[49], "p95_s": q[94], "max_s": values[-1]}


# ---------------------------------------------------------------------------
# materialize


def step_materialize(b: Bench) -> None:
    """A ``--materialize-rows`` table subscribed in each mode while replication runs, then applied to each target."""
    a = b.args
    runs = {mode: _materialize(b, mode) for mode in ("atomic", "incremental", "nonatomic")}
    b.r["materialize"] = {"rows": a.materialize_rows, "chunk_rows": a.materialize_chunk_rows,
                          "writer_tps": a.materialize_writer_tps, "targets": list(a.materialize_targets),
                          "runs": runs}  # fmt: skip


def _source_database(b: Bench, mode: str) -> str:
    """A new database holding ``bench_seed`` (replicated) and ``bench_items`` of ``--materialize-rows`` rows."""
    url = b.dbs.create(f"mat_{mode}")
    execute(
        url,
        "CREATE TABLE bench_seed (id int PRIMARY KEY, v int NOT NULL)",
        "INSERT INTO bench_seed VALUES (1, 0)",
        "CREATE TABLE bench_items (id bigint PRIMARY KEY, grp int NOT NULL, qty int NOT NULL, amount numeric(12,2), "
        "note text, at timestamptz NOT NULL)",
        "INSERT INTO bench_items SELECT g, g % 100, 0, g / 100.0, md5(g::text), now() "
        f"FROM generate_series(1, {b.args.materialize_rows}) AS g",
        "VACUUM ANALYZE bench_items",
    )
    return url


def _materialize(b: Bench, mode: str) -> dict[str, Any]:
    """One mode: replication of ``bench_seed`` running, ``bench_items`` subscribed (timed), then each apply (timed)."""
    from applier.config import load_config
    from applier.extract import extract
    from applier.extract.subscriptions import Registry

    a, name = b.args, f"materialize_{mode}"
    folder = b.workdir / name
    url = _source_database(b, mode)
    config, _, _ = setup_extractor(b, name, url, None, "source.include=public.bench_seed")
    execute(url, "UPDATE bench_seed SET v = v + 1")
    extract(load_config(config))  # replication is running: the slot has moved, a pair is written
    b.dbs.checkpoint()
    cmd = [sys.executable, "-m", "applier.cli", "subscribe", "--config", str(config), "--table", ITEMS, "--mode", mode]
    cmd += [] if mode == "atomic" else ["--chunk-rows", str(a.materialize_chunk_rows)]
    before_mib = folder_mib(folder / "pairs")
    with _writer(b, url, folder) as writer:
        code, wall, peak = run_measured(cmd, folder / "subscribe.log", f"applier subscribe ({mode})")
        if writer:
            writer.stop()
    if code != 0:
        raise BenchError(f"applier subscribe ({mode}) exited {code}; log:\n{tail(folder / 'subscribe.log')}")
    sub = Registry(folder / "pairs").load()[ITEMS]
    copy = {"wall_s": wall, "peak_tree_mib": peak, "copied_rows": sub.copied_rows, "state": sub.state,
            "written_mib": folder_mib(folder / "pairs") - before_mib,
            **extract_summary((folder / "subscribe.log").read_text(encoding="utf-8"))}  # fmt: skip
    catch_up = _extract(config, folder / "catch-up.log", f"applier extract ({mode}, after the copy)")
    source = _fingerprint(url, None)
    applies = {}
    for kind in a.materialize_targets:
        run_name = f"{name}_{kind}"
        target = _target(b, kind, run_name)
        settings = applier_settings(b.workdir, run_name, folder / "pairs", 0.0, a.driver_memory, target)
        applies[kind] = run_applier(b.workdir, run_name, settings)
        applies[kind]["rows"] = _fingerprint(target.get("url"), target)
        applies[kind]["agrees"] = applies[kind]["rows"] == source
        applies[kind]["state"] = _state(b.workdir / run_name / "config.yaml", folder / "pairs")
        if target.get("url"):
            b.dbs.drop(target["url"])
    b.dbs.drop(url)
    return {"copy": copy, "catch_up": catch_up, "source": source, "applies": applies}


class _NoWriter:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _writer(b: Bench, url: str, folder: Path) -> Background | _NoWriter:
    """pgbench updating random ``bench_items`` rows at ``--materialize-writer-tps`` during the copy (0: none)."""
    if not b.args.materialize_writer_tps:
        return _NoWriter()
    script = folder / "writer.sql"
    script.write_text(WRITER_SCRIPT.format(rows=b.args.materialize_rows), encoding="utf-8")
    rate = str(b.args.materialize_writer_tps)
    cmd = pgbench_command(url, "-n", "-f", str(script), "-c", "1", "-R", rate, "-T", "86400")
    return Background(cmd, folder / "writer.log", "pgbench (writer on bench_items)", client_env(url))


def _fingerprint(url: str | None, target: dict[str, Any] | None) -> list[int]:
    """``bench_items``' row count and sum of ``qty`` (each writer update adds 1) in the source or a target."""
    if url:
        import psycopg

        with psycopg.connect(url) as conn:
            row = conn.execute(f"SELECT count(*), coalesce(sum(qty), 0) FROM {ITEMS}").fetchone()
        return [int(v) for v in row] if row else [0, 0]
    assert target is not None
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    data = DeltaTable(_table_path(target, ITEMS)).to_pyarrow_table(columns=["qty"])
    return [data.num_rows, int(pc.sum(data["qty"]).as_py() or 0)]


def _state(config: Path, pairs: Path) -> str:
    """The subscription's state as the Applier's checkpoint shows it after the apply."""
    from applier.config import load_config
    from applier.engine.checkpoint import CheckpointStore
    from applier.extract.subscriptions import Registry, applier_state

    applied = CheckpointStore(load_config(config).work_dir).load().applied_commit_lsn or 0
    return applier_state(Registry(pairs).load()[ITEMS], applied)
