"""One bad row costs one transaction, even when the process is SIGKILLed while the retry looks for it.

The in-process "crashes" of tests/test_bad_rows.py stop the Applier between
two target commits. Here a real ``applier run`` is killed (its whole process
group, Spark's JVM included) at seeded random moments after the enhanced
retry began: inside a part's compile, a target commit, an intent write, the
keeping of a refused transaction. After each kill the run is started again;
a last run is let finish. Whatever was interrupted, the end state must be the
one an uninterrupted run reaches: the good transactions' rows once each, each
bad transaction once in the exceptions store, the checkpoint at the last pair
with the row count the target holds, no intent and no spill file left.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable

from applier.config import Config, load_config
from applier.engine.checkpoint import CheckpointStore
from applier.targets.delta import DeltaTarget
from test_bad_rows import ROWS_EACH, THRESHOLD, TRANSACTIONS, constrained_target, write_workload

pytestmark = [pytest.mark.spark, pytest.mark.slow]

RETRY_BEGAN = "splitting it to find the failing transaction"  # the engine's warning when a refused group is split
PASSED = "was refused and passed"  # its warning for each bad transaction the retry finds and lets by
BAD_CHECK = {260, 261, 420, 555, 700, 845, 990}  # all in pairs 2..4: Delta's constraint comes after pair 1
BAD_UNIQUE = {333, 888}  # PostgreSQL only: Delta has no unique index
KILLS, MAX_PASSED, MAX_DELAY_S, SEED = 3, 2, 0.5, 1313


def _start(command: list[str], stderr: Path) -> subprocess.Popen[bytes]:
    """``applier run`` in a session of its own, so that one killpg takes Spark's JVM with it."""
    with stderr.open("w") as err:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)


def _finish(command: list[str], stderr: Path) -> None:
    """Run ``command`` to its end; it must succeed."""
    proc = _start(command, stderr)
    assert proc.wait(timeout=600) == 0, stderr.read_text()[-3000:]


def _wait_for_retry(proc: subprocess.Popen[bytes], stderr: Path, timeout_s: float = 300) -> bool:
    """Whether the run logged that the retry began (False: it ended first)."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        if RETRY_BEGAN in stderr.read_text():
            return True
        time.sleep(0.1)
    return RETRY_BEGAN in stderr.read_text()


def _wait_for_passes(proc: subprocess.Popen[bytes], stderr: Path, passes: int, timeout_s: float = 300) -> None:
    """Until the run has let ``passes`` bad transactions by (or ended): a moment inside the retry on any machine."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline and stderr.read_text().count(PASSED) < passes:
        time.sleep(0.02)


def _kill_during_retries(command: list[str], config: Config, logs: Path) -> list[str]:
    """Start the run, wait for its retry, kill it at a seeded random moment of it; again, up to ``KILLS`` times.

    The moment is after a seeded number of the retry's bad transactions were
    found (0 to ``MAX_PASSED``), then a seeded delay (up to ``MAX_DELAY_S``):
    counted in the retry's own steps, so it falls inside the retry however
    fast the machine runs it.

    Returns the kills that landed inside the retry (the process alive and its
    cycle not yet checkpointed), each with the intent's ``through..part_end``
    at that moment, for failure messages. Stops early when a run finished
    before its kill.
    """
    rng = random.Random(SEED)
    store = CheckpointStore(config.work_dir)
    killed: list[str] = []
    for attempt in range(KILLS):
        stderr = logs / f"run{attempt}.stderr"
        proc = _start(command, stderr)
        try:
            passes, delay = rng.randint(0, MAX_PASSED), rng.uniform(0.0, MAX_DELAY_S)  # drawn whatever happens
            began = _wait_for_retry(proc, stderr)
            if began:
                _wait_for_passes(proc, stderr, passes)
                time.sleep(delay)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                intent = store.load_intent()
                if began and intent is not None:  # the cycle is not checkpointed: the kill landed inside its retry
                    killed.append(f"run {attempt}: at {intent.through}..{intent.part_end}")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait(timeout=60)
        assert code in (0, -signal.SIGKILL), stderr.read_text()[-3000:]
        if code == 0:
            break
    return killed


def test_sigkill_during_the_retry_then_restart_reaches_the_uninterrupted_state(
    tmp_path: Path, target_settings: list[str]
) -> None:
    """Issue 13: SIGKILL at random moments during a retry, then the same final state, on both targets."""
    postgres = bool(target_settings)
    pairs, logs = tmp_path / "pairs", tmp_path / "logs"
    logs.mkdir()
    config_file = tmp_path / "applier.yaml"
    config_file.write_text(
        f"configuration_name: kill\nintermediate_dir: {pairs}\noutput_dir: {tmp_path / 'out'}\n"
        f"target: {{path: {tmp_path / 'target'}}}\nspark: {{master: 'local[1]'}}\n"
        f"apply: {{compile_retry_threshold: {THRESHOLD}, transient_retries: 0}}\n"
        "errors: {actions: {check: log, unique: log}}\n"
    )
    settings = [arg for setting in target_settings for arg in ("--set", setting)]
    command = [sys.executable, "-m", "applier.cli", "run", "--config", str(config_file), *settings]
    config = load_config(config_file, target_settings)
    bad_unique = BAD_UNIQUE if postgres else set()
    if postgres:
        assert config.target.url is not None
        constrained_target(config.target.url)
        write_workload(pairs, BAD_CHECK, bad_unique)
    else:  # a first cycle creates the table; the constraint the source lacks comes after it
        write_workload(pairs, BAD_CHECK, bad_unique, seqs=range(1, 2))
        _finish(command, logs / "create.stderr")
        DeltaTable(str(tmp_path / "target" / "shop" / "items")).alter.add_constraint({"qty_not_negative": "qty >= 0"})
        write_workload(pairs, BAD_CHECK, bad_unique, seqs=range(2, 5))

    killed = _kill_during_retries(command, config, logs)
    assert killed, "no kill landed while the retry was under way: the test proved nothing"
    _finish(command, logs / "final.stderr")

    bad = BAD_CHECK | bad_unique
    good = [t * ROWS_EACH + k for t in range(TRANSACTIONS) if t not in bad for k in range(ROWS_EACH)]
    store = CheckpointStore(config.work_dir)
    checkpoint = store.load()
    assert (checkpoint.applied_seq, checkpoint.cycle_id) == (4, 1 if postgres else 2), killed
    assert store.load_intent() is None
    assert checkpoint.row_counts == {"shop.items": len(good)}, killed  # what validation reconciles with
    assert not list(config.spill_dir.glob("*.spill")), "no spill file is left behind"
    if postgres:
        assert config.target.url is not None
        with psycopg.connect(config.target.url) as conn:
            rows = sorted(r[0] for r in conn.execute("SELECT id FROM shop.items"))
            kept = conn.execute(
                "SELECT e.xid, count(c.*) FROM applier_exceptions e "
                "JOIN applier_exception_changes c ON c.exception_id = e.id GROUP BY e.id, e.xid ORDER BY e.xid"
            ).fetchall()
            position = conn.execute("SELECT cycle_id, part_through FROM applier_checkpoint").fetchall()
        assert position == [(1, 0)]
    else:
        table = DeltaTable(str(tmp_path / "target" / "shop" / "items"))
        rows = sorted(table.to_pyarrow_table(columns=["id"])["id"].to_pylist())
        exceptions = DeltaTarget(config.target.path, config.configuration_name).exceptions()
        kept = sorted((e["xid"], e["changes"]) for e in exceptions)
    assert rows == good, killed  # every good transaction's rows, each exactly once
    assert kept == sorted((f"x{t}", ROWS_EACH) for t in bad), killed  # each bad one kept once, with every change
