"""`applier status --json`, `--prometheus` and the text, checked against the files of a real run.

A generated workload is applied for two cycles by the engine; every figure
status reports is then worked out here from the files themselves (the
``.trn`` events, the headers, ``checkpoint.json``, ``cycles.jsonl``), not
from the engine's code.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from applier.config import Config, load_config
from applier.engine.checkpoint import CheckpointStore, Intent
from applier.engine.runlock import RunLock
from applier.generate import generate_workload
from engine_support import run

pytestmark = pytest.mark.spark

APPLIER = [sys.executable, "-m", "applier.cli"]
NO_JAVA = {**os.environ, "JAVA_HOME": "/nonexistent/java-home"}  # a command that started Spark would fail


@dataclass
class Applied:
    config_file: Path
    config: Config
    intermediate: Path


def write_config(folder: Path) -> Path:
    path = folder / "applier.yaml"
    path.write_text(
        f"configuration_name: st\nintermediate_dir: {folder / 'in'}\noutput_dir: {folder / 'out'}\n"
        f"target: {{path: {folder / 'target'}}}\n"
        "apply: {process_intermediate_size_per_job: 0.1, buffer_size_for_split_records: 1024}\n"
    )
    return path


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Applied:
    """Two cycles of a workload with long transactions applied, more pairs waiting."""
    folder = tmp_path_factory.mktemp("status")
    generate_workload(folder / "in", seed=21, transactions=120, file_size_mb=0.03, profile="long-transactions")
    config_file = write_config(folder)
    config = load_config(config_file)
    run(config, spark, max_cycles=2)
    return Applied(config_file, config, folder / "in")


def copy_of(applied: Applied, to: Path) -> Applied:
    """The applied folder, work folder and target copied to ``to``, with a configuration of its own."""
    folder = applied.config_file.parent
    for name in ("in", "out", "target"):
        shutil.copytree(folder / name, to / name)
    config_file = write_config(to)
    return Applied(config_file, load_config(config_file), to / "in")


def status(applied: Applied, *options: str) -> str:
    done = subprocess.run(
        [*APPLIER, "status", "--config", str(applied.config_file), *options],
        capture_output=True,
        text=True,
        timeout=120,
        env=NO_JAVA,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def trn_lines(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """Each pair's ``.trn`` lines, header first, parsed as JSON."""
    return {
        int(p.name[:12]): [json.loads(line) for line in p.read_text().splitlines()]
        for p in sorted(folder.glob("*.trn"))
    }


def seconds_since(ts: str, now: dt.datetime) -> float:
    return (now - dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))).total_seconds()


def test_status_json_tells_what_the_run_files_hold(applied: Applied) -> None:
    before = dt.datetime.now(dt.UTC)
    doc = json.loads(status(applied, "--json"))
    after = dt.datetime.now(dt.UTC)
    checkpoint = json.loads((applied.config.work_dir / "checkpoint.json").read_text())
    trns = trn_lines(applied.intermediate)
    applied_seq = checkpoint["applied_seq"]
    events = [(seq, e) for seq, lines in sorted(trns.items()) for e in lines[1:]]

    assert doc["configuration"] == "st"
    assert {k: checkpoint[k] for k in doc["checkpoint"]} == doc["checkpoint"]
    waiting = [seq for seq in trns if seq > applied_seq]
    assert doc["backlog"]["pairs"] == len(waiting)
    name = "{:012d}".format
    sizes = sum((applied.intermediate / f"{name(s)}.{ext}").stat().st_size for s in waiting for ext in ("dat", "trn"))
    assert doc["backlog"]["bytes"] == sizes
    assert doc["backlog"]["refused_pairs"] == [] and doc["backlog"]["gap"] is None and doc["blocked_by"] is None

    applied_commit = next(
        e for _, e in events if e["record"] == "commit" and e["lsn"] == checkpoint["applied_commit_lsn"]
    )
    oldest_seq, oldest = next((seq, e) for seq, e in events if e["record"] == "commit" and seq > applied_seq)
    lag = doc["lag"]
    assert lag["last_applied_commit_ts"] == applied_commit["ts"]
    assert (lag["oldest_unapplied_seq"], lag["oldest_unapplied_commit_ts"]) == (oldest_seq, oldest["ts"])
    assert (
        seconds_since(applied_commit["ts"], before) - 1 <= lag["seconds"] <= seconds_since(applied_commit["ts"], after)
    )
    assert lag["oldest_unapplied_seconds"] <= lag["seconds"]

    ended = {e["xid"] for seq, e in events if seq <= applied_seq and e["record"] in ("commit", "rollback")}
    still_open = {e["xid"] for seq, e in events if seq <= applied_seq and e["record"] == "begin"} - ended
    assert {t["xid"] for t in doc["open_transactions"]} == still_open and still_open
    assert any(t["spilled"] for t in doc["open_transactions"]), "a long transaction over the 1 KB buffer"

    reports = [json.loads(line) for line in (applied.config.work_dir / "cycles.jsonl").read_text().splitlines()]
    assert doc["totals"] == {"cycles": 2, "changes": sum(trns[s][0]["dat_rows"] for s in trns if s <= applied_seq)}
    last = doc["last_cycle"]
    assert (last["cycle_id"], last["seqs"], last["rows_read"]) == (2, reports[-1]["seqs"], reports[-1]["rows_read"])
    assert list(last["seconds"])[:2] == ["read", "buffer"]
    assert last["total_seconds"] == pytest.approx(sum(reports[-1]["seconds"].values()), abs=0.002)
    assert last["changes_per_second"] == pytest.approx(last["rows_read"] / last["total_seconds"], rel=0.01)
    assert (last["started_at"], last["ended_at"]) == (reports[-1]["started_at"], reports[-1]["ended_at"])
    assert last["started_at"] < last["ended_at"] and last["ended_at"].endswith("+00:00")
    assert doc["queue"]["budget_bytes"] == applied.config.queue_memory_bytes
    assert doc["run_in_progress"] is None and doc["cycle_under_way"] is None and doc["last_error"] is None
    assert doc["subscriptions"] == [] and doc["source"] is None


def test_status_prometheus_output_parses_and_agrees_with_the_json(applied: Applied) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    doc = json.loads(status(applied, "--json"))
    families = {f.name: f for f in text_string_to_metric_families(status(applied, "--prometheus"))}

    def value(name: str, **labels: str) -> float:
        samples = [s for f in families.values() for s in f.samples if s.name == name]
        (sample,) = [s for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
        assert sample.labels["configuration"] == "st"
        return float(sample.value)

    assert families["applier_cycles"].type == "counter" and value("applier_cycles_total") == 2
    assert value("applier_changes_total") == doc["totals"]["changes"]
    assert value("applier_backlog_pairs") == doc["backlog"]["pairs"]
    assert value("applier_backlog_bytes") == doc["backlog"]["bytes"]
    assert value("applier_open_transactions") == len(doc["open_transactions"])
    assert value("applier_lag_seconds") >= doc["lag"]["seconds"]
    assert value("applier_last_cycle_changes_per_second") == doc["last_cycle"]["changes_per_second"]
    assert value("applier_last_cycle_phase_seconds", phase="read") == doc["last_cycle"]["seconds"]["read"]
    assert value("applier_queue_memory_bytes", kind="transactions") == doc["queue"]["memory_bytes"]["transactions"]
    assert value("applier_queue_spooled_bytes", kind="transactions") == doc["queue"]["spooled_bytes"]["transactions"]
    assert value("applier_run_in_progress") == 0 and value("applier_blocked") == 0
    assert "applier_exceptions_set_aside" in families and "applier_subscriptions" in families


def test_status_prints_phase_timings_as_text(applied: Applied) -> None:
    out = status(applied)
    (line,) = [line for line in out.splitlines() if line.startswith("last cycle: 2 pairs ")]
    assert " changes in " in line and "changes/s); read " in line and ", checkpoint " in line
    ended = json.loads(status(applied, "--json"))["last_cycle"]["ended_at"]
    assert line.endswith(f"; ended {ended[:10]} {ended[11:19]} UTC")
    assert "{" not in out and "lag: " in out and "run in progress: none" in out


def test_status_shows_the_run_holding_the_lock_and_its_cycle_under_way(applied: Applied, tmp_path: Path) -> None:
    copy = copy_of(applied, tmp_path)
    store = CheckpointStore(copy.config.work_dir)
    applied_seq = store.load().applied_seq
    store.save_intent(Intent(3, [applied_seq + 1, applied_seq + 2], through=4, part_end=6))
    with RunLock(copy.config.work_dir, "st", run_key="scheduled__1"):
        doc = json.loads(status(copy, "--json"))
        text = status(copy)
    assert doc["run_in_progress"]["pid"] == os.getpid() and doc["run_in_progress"]["run_key"] == "scheduled__1"
    assert doc["cycle_under_way"] == {
        "cycle_id": 3,
        "seqs": [applied_seq + 1, applied_seq + 2],
        "through": 4,
        "part_end": 6,
    }
    assert f"pid {os.getpid()}" in text and f"cycle 3 under way: pairs {applied_seq + 1}..{applied_seq + 2}" in text
    assert json.loads(status(copy, "--json"))["run_in_progress"] is None, "released"


def test_status_names_the_last_error_and_the_pair_that_blocks(applied: Applied, tmp_path: Path) -> None:
    copy = copy_of(applied, tmp_path)
    applied_seq = CheckpointStore(copy.config.work_dir).load().applied_seq
    dat = copy.intermediate / f"{applied_seq + 1:012d}.dat"
    data = bytearray(dat.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: only a full read of the pair finds it
    dat.write_bytes(bytes(data))
    # The executor reading the pair finds its checksum wrong; the run re-reads with the driver checking.
    done = subprocess.run(
        [*APPLIER, "run", "--config", str(copy.config_file)], capture_output=True, text=True, timeout=300
    )
    # The run's operator log (the rebuild of open transactions, the late refusal) comes first, then the one error line.
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert f"pair {applied_seq + 1} refused by Spark's image check" in done.stderr
    assert [line for line in done.stderr.splitlines() if "applier: error:" in line] == [done.stderr.splitlines()[-1]]
    assert done.stderr.splitlines()[-1].endswith("[sha-mismatch]")
    doc = json.loads(status(copy, "--json"))
    assert doc["backlog"]["refused_pairs"] == [], "its header and size are right"
    assert doc["last_run"]["outcome"] == "failed"
    error = doc["last_error"]
    assert error["exit_code"] == 3 and error["pair"] == {
        "seq": applied_seq + 1,
        "file": str(dat),
        "code": "sha-mismatch",
    }
    assert doc["blocked_by"]["kind"] == "pair" and doc["blocked_by"]["seq"] == applied_seq + 1
    text = status(copy)
    assert f"BLOCKED by pair {applied_seq + 1}: " in text and "last error (" in text and "exit code 3" in text


def test_a_run_caught_up_starts_no_jvm(applied: Applied, tmp_path: Path, spark: Any) -> None:
    copy = copy_of(applied, tmp_path)
    run(copy.config, spark)
    done = subprocess.run(
        [*APPLIER, "run", "--config", str(copy.config_file)], capture_output=True, text=True, env=NO_JAVA, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nothing to do: applied through pair ")
    doc = json.loads(status(copy, "--json"))
    assert doc["backlog"]["pairs"] == 0 and doc["lag"]["oldest_unapplied_commit_ts"] is None
    assert doc["last_run"]["outcome"] == "finished" and doc["last_run"]["cycles"] == 0
