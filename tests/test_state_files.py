"""Damaged state files stop a run at once with one line naming the file and what to do (exit 7), never a traceback.

The checkpoint, the intent and the run ledger are the Applier's own files; a
run reads them before Spark starts, so a damaged one changes nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from applier.engine.checkpoint import Checkpoint, CheckpointStore, Intent
from applier.engine.ledger import RunLedger
from applier.errors import StateFileError
from handmade import good_first_pair

APPLIER = [sys.executable, "-m", "applier.cli"]

GARBAGE = {
    "not JSON": '{"cycle_id": 3, "applied_seq"',
    "binary": "\x00\x01PAR1\xff",
    "a list": "[1, 2, 3]",
    "an unknown field": json.dumps({"cycle_id": 3, "lag": 1}),
    "a cycle of text": json.dumps({"cycle_id": "three"}),
    "a negative pair": json.dumps({"applied_seq": -1}),
    "a broken table": json.dumps({"tables": {"bank.accounts": {"columns": "id"}}}),
}


def _config(tmp_path: Path) -> Path:
    good_first_pair(tmp_path / "in")
    path = tmp_path / "c.yaml"
    path.write_text(
        f"configuration_name: c\nintermediate_dir: {tmp_path / 'in'}\noutput_dir: {tmp_path / 'out'}\n"
        f"target: {{path: {tmp_path / 'target'}}}\n"
    )
    (tmp_path / "out" / "c").mkdir(parents=True)
    return path


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APPLIER, *map(str, args)], capture_output=True, text=True, timeout=300)


def _assert_one_line_exit_7(done: subprocess.CompletedProcess[str], damaged: Path, remedy: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 7, done.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert lines[0].startswith(f"applier: error: {damaged} is damaged (") and remedy in lines[0], lines[0]


@pytest.mark.parametrize("garbage", sorted(GARBAGE))
def test_a_damaged_checkpoint_is_named_with_what_to_do(tmp_path: Path, garbage: str) -> None:
    store = CheckpointStore(tmp_path)
    store.checkpoint_path.write_text(GARBAGE[garbage], encoding="utf-8", errors="surrogateescape")
    with pytest.raises(StateFileError) as damaged:
        store.load()
    e = damaged.value
    assert e.exit_code == 7 and e.path == store.checkpoint_path
    assert str(e).startswith(f"{store.checkpoint_path} is damaged (") and "restore it from a backup" in str(e)
    assert "\n" not in str(e)


def test_a_good_checkpoint_and_intent_still_load(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    saved = store.save(Checkpoint(cycle_id=2, applied_seq=5, applied_commit_lsn=None, restart_seq=4))
    assert store.load() == saved
    store.save_intent(Intent(3, [6, 7]))
    assert store.load_intent() == Intent(3, [6, 7])
    in_parts = Intent(3, [6, 7], through=40, part_end=41, changed={"shop.items": (False, 400)}, passing=True)
    store.save_intent(in_parts)
    assert store.load_intent() == in_parts  # a retry's progress, with the rows its parts applied


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"cycle_id": 2}',
        '{"cycle_id": 0, "seqs": [1]}',
        '{"cycle_id": 2, "seqs": [3, 5]}',
        '{"cycle_id": 2, "seqs": []}',
        '{"cycle_id": 2, "seqs": ["3"]}',
        '{"cycle_id": 2, "seqs": [3], "changed": {"shop.items": [0, 5]}}',
        '{"cycle_id": 2, "seqs": [3], "through": 4, "passing": true}',
    ],
)
def test_a_damaged_intent_is_named_with_what_to_do(tmp_path: Path, text: str) -> None:
    store = CheckpointStore(tmp_path)
    store.intent_path.write_text(text)
    with pytest.raises(StateFileError) as damaged:
        store.load_intent()
    assert damaged.value.path == store.intent_path and "delete it only if no target table holds" in str(damaged.value)


def test_the_run_stops_before_spark_on_each_damaged_state_file(tmp_path: Path) -> None:
    config = _config(tmp_path)
    work = tmp_path / "out" / "c"
    checkpoint, intent = work / "checkpoint.json", work / "intent.json"

    checkpoint.write_text("{ not json")
    _assert_one_line_exit_7(_run("run", "--config", config), checkpoint, "restore it from a backup")
    _assert_one_line_exit_7(_run("status", "--config", config), checkpoint, "restore it from a backup")
    checkpoint.unlink()

    intent.write_text('{"cycle_id": "x"}')
    _assert_one_line_exit_7(_run("run", "--config", config), intent, "plans that cycle anew")
    intent.unlink()

    ledger = RunLedger(work)
    record = ledger.begin("manual__1", "apply", dt.datetime(2026, 11, 25, tzinfo=dt.UTC))
    ledger.end(record, dt.datetime(2026, 11, 25, 0, 1, tzinfo=dt.UTC), RuntimeError("stopped"))
    cycles = ledger.cycle_log("manual__1").path
    cycles.parent.mkdir(parents=True, exist_ok=True)
    cycles.write_text('{"cycle_id": 1, "pairs": \n')
    _assert_one_line_exit_7(_run("run", "--config", config, "--run-key", "manual__1"), cycles, "move it")
    ledger.path("manual__1").write_text("garbage")
    _assert_one_line_exit_7(
        _run("run", "--config", config, "--run-key", "manual__1"), ledger.path("manual__1"), "move it aside"
    )
    # Nothing was applied, and no Spark work folder or spill file was made.
    assert not (tmp_path / "target").exists() and not (work / "tmp").exists()
    assert not checkpoint.exists()
