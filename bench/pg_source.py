"""The source side of the ``source`` steps: pgbench on a scratch database, its slots, and the extractor's configuration.

Each step works in a database of its own (:class:`bench.pg_server.Databases`),
whose replication slots are dropped with it. Slot and publication names carry
the benchmark's process id: slots are shared by the whole server.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench.measure import MIB, BenchError, applier_settings, progress, tail

# pgbench's TPC-B-like transaction changes 4 rows: 3 updates and an insert into pgbench_history.
TPCB_CHANGES = 4


def _params(url: str) -> dict[str, Any]:
    import psycopg

    return psycopg.conninfo.conninfo_to_dict(url)


def client_args(url: str) -> list[str]:
    """``-h -p -U`` of a PostgreSQL client program (pgbench, pg_recvlogical) for the server of ``url``."""
    p = _params(url)
    return ["-h", str(p.get("host", "127.0.0.1")), "-p", str(p.get("port", 5432)), "-U", str(p.get("user", "postgres"))]


def client_env(url: str, **settings: str) -> dict[str, str]:
    """The environment of a client program: the password, if any, and server settings through ``PGOPTIONS``."""
    env = dict(os.environ)
    if password := _params(url).get("password"):
        env["PGPASSWORD"] = str(password)
    if settings:
        env["PGOPTIONS"] = " ".join(f"-c {k}={v}" for k, v in settings.items())
    return env


def dbname(url: str) -> str:
    return str(_params(url)["dbname"])


def pgbench_command(url: str, *args: str) -> list[str]:
    """A pgbench command line against the database of ``url``."""
    return ["pgbench", *client_args(url), *args, dbname(url)]


def pgbench_init(url: str, scale: int, log_path: Path) -> None:
    """``pgbench -i -s scale``: the four TPC-B-like tables, loaded and vacuumed.

    Raises:
        BenchError: pgbench failed.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        cmd = pgbench_command(url, "-i", "-q", "-s", str(scale))
        code = subprocess.run(cmd, env=client_env(url), stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise BenchError(f"pgbench -i exited {code}; log {log_path}:\n{tail(log_path)}")


def pgbench_run(
    url: str, args: list[str], folder: Path, name: str, percentiles: bool = True, **settings: str
) -> dict[str, Any]:
    """A pgbench run, its summary (tps, average latency) and latency percentiles from its per-transaction log.

    ``settings`` are server settings of its sessions; without ``percentiles`` it keeps no per-transaction log.

    Raises:
        BenchError: pgbench failed, or a transaction failed.
    """
    folder.mkdir(parents=True, exist_ok=True)
    log_path, prefix = folder / f"{name}.log", folder / f"{name}-txn"
    cmd = pgbench_command(url, *args, *(["-l", f"--log-prefix={prefix}"] if percentiles else []))
    progress(f"pgbench {name}: {' '.join(cmd[7:])}")
    with open(log_path, "w", encoding="utf-8") as log:
        env = client_env(url, **settings)
        code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise BenchError(f"pgbench {name} exited {code}; log {log_path}:\n{tail(log_path)}")
    result = parse_pgbench(log_path.read_text(encoding="utf-8"))
    if percentiles:
        logs = folder.glob(f"{prefix.name}*")
        result.update(latency_percentiles(sorted(int(line.split()[2]) for f in logs for line in f.open() if line)))
    progress(f"pgbench {name}: {result['tps']:,.0f} tps, average latency {result['latency_ms']:.2f} ms")
    return result


PGBENCH_SUMMARY = {
    "tps": r"^tps = ([\d.]+) \(without initial connection time\)",
    "latency_ms": r"^latency average = ([\d.]+) ms",
    "transactions": r"^number of transactions actually processed: (\d+)",
}


def parse_pgbench(text: str) -> dict[str, Any]:
    """tps, average latency and transactions from pgbench's summary.

    Raises:
        BenchError: the summary lacks them, or reports failed transactions.
    """
    found = {key: re.search(pattern, text, re.MULTILINE) for key, pattern in PGBENCH_SUMMARY.items()}
    values = {key: m.group(1) for key, m in found.items() if m}
    if len(values) < len(PGBENCH_SUMMARY):
        raise BenchError(f"pgbench's summary lacks tps, latency or transactions:\n{text[-2000:]}")
    if (failed := re.search(r"^number of failed transactions: (\d+)", text, re.MULTILINE)) and int(failed.group(1)):
        raise BenchError(f"pgbench: {failed.group(1)} transactions failed")
    return {"tps": float(values["tps"]), "latency_ms": float(values["latency_ms"]),
            "transactions": int(values["transactions"])}  # fmt: skip


def latency_percentiles(micros: list[int]) -> dict[str, float]:
    """p50, p95, p99 and max, in ms, of per-transaction latencies in µs (sorted)."""
    if not micros:
        return {}
    q = statistics.quantiles(micros, n=100, method="inclusive") if len(micros) > 1 else [micros[0]] * 99
    return {"p50_ms": q[49] / 1000, "p95_ms": q[94] / 1000, "p99_ms": q[98] / 1000, "max_ms": micros[-1] / 1000}


def scalar(url: str, query: str, *params: Any) -> Any:
    """The first column of the first row of ``query`` on ``url`` (autocommit)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def wal_end(url: str, timeout_s: float = 60.0) -> int:
    """The server's WAL end once flushed: what was committed asynchronously is written before decoding reads it."""
    import time

    end = int(scalar(url, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"))  # written or not
    deadline = time.monotonic() + timeout_s
    while int(scalar(url, "SELECT pg_current_wal_flush_lsn() - '0/0'::pg_lsn")) < end:
        if time.monotonic() > deadline:
            raise BenchError(f"the server has not flushed its WAL up to {end} in {timeout_s:g} s")
        time.sleep(0.05)
    return end


def create_slot(url: str, slot: str, plugin: str = "pgoutput") -> int:
    """A logical slot on the database of ``url``; its confirmed position."""
    scalar(url, "SELECT pg_create_logical_replication_slot(%s, %s)", slot, plugin)
    query = "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
    return int(scalar(url, query, slot))


def extractor_settings(
    workdir: Path, name: str, url: str, names: str, driver_memory: str, target: dict[str, Any], *more: str
) -> list[str]:
    """An Applier configuration reading the source ``url`` through slot and publication ``names``.

    Its pairs go to ``<workdir>/<name>/pairs``; ``target`` as in :func:`bench.measure.applier_settings`.
    """
    pairs = workdir / name / "pairs"
    settings = applier_settings(workdir, name, pairs, 0.0, driver_memory, target)
    return [*settings, f"source.url={url}", f"source.slot={names}", f"source.publication={names}", *more]


def folder_mib(folder: Path) -> float:
    """The size of the files in ``folder`` (not its dot files), in MiB."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")) / MIB
