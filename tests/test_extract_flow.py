"""Flow control against the real server: the unapplied backlog holds applier extract back, status shows it.

The backlog is driven by the extractor's own pairs and by moving the
Applier's checkpoint (what an ``applier run`` does when it applies them). The
pairs here are about 4.6 KB each (``extract.max_pair_mb=0.01``, 80 rows of
64 hex characters), so a 0.01 MiB limit is crossed at the third pair.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import psycopg
import pytest

from applier.cli import main
from applier.config import Config
from applier.engine.checkpoint import Checkpoint, CheckpointStore
from applier.engine.status import unapplied_backlog
from applier.extract import extract
from applier.extract.source import slot_state
from applier.extract.status_file import read_status
from applier.intermediate.pairs import MIB, list_pairs
from extract_support import execute, extract_config, pair_rows, prepare

pytestmark = pytest.mark.postgres
Source = tuple[str, str, str]

LIMIT_BYTES, RESUME_BYTES = int(0.01 * MIB), int(0.005 * MIB)
FLOW = ("extract.max_pair_mb=0.01", "extract.max_backlog_mb=0.01", "extract.resume_backlog_mb=0.005")
UNITS = {"KiB": 1024, "MiB": MIB, "GiB": 1024 * MIB}
TABLE = "CREATE TABLE t (id int PRIMARY KEY, pad text)"
BIG = "INSERT INTO t SELECT g, repeat(md5(g::text), 2) FROM generate_series(1, 400) g"


def sizes(config: Config) -> list[int]:
    return [p.size for p in list_pairs(config.intermediate_dir).pairs]


def apply_through(config: Config, seq: int) -> None:
    """Move the Applier's checkpoint past pair ``seq``, as a run that applied it would."""
    CheckpointStore(config.work_dir).save(Checkpoint(cycle_id=seq, applied_seq=seq, restart_seq=seq + 1))


def leave_unapplied(config: Config, pairs: int) -> int:
    """Move the checkpoint so that only the last ``pairs`` pairs are unapplied; the backlog that leaves."""
    written = sizes(config)
    apply_through(config, len(written) - pairs)
    return sum(written[len(written) - pairs :])


def confirmed(config: Config) -> int:
    with psycopg.connect(config.source.url or "", autocommit=True) as conn:
        return slot_state(conn, config.source.slot or "").confirmed_flush


def test_a_bounded_batch_ends_early_above_the_limit_and_waits_for_the_low_water_mark(
    tmp_path: Path, logical_source: Source
) -> None:
    config = extract_config(tmp_path, logical_source, *FLOW)
    prepare(config, TABLE)
    execute(config, BIG)
    before = confirmed(config)

    first = extract(config)
    assert first.held_back
    assert 3 <= first.pairs <= 4, "the pair that crossed the limit, and at most one more of what was decoded"
    assert unapplied_backlog(config).bytes > LIMIT_BYTES
    assert confirmed(config) == before, "the transaction is not complete in the pairs: the slot stays before it"
    status = read_status(config.intermediate_dir)
    assert status is not None and status.held_back and status.held_since

    second = extract(config)
    assert (second.held_back, second.pairs) == (True, 0), "held back from the start: nothing peeked or written"

    band = leave_unapplied(config, 2)
    assert RESUME_BYTES < band <= LIMIT_BYTES, "below the limit but above the low-water mark"
    assert (extract(config).pairs, read_status(config.intermediate_dir).held_back) == (0, True)  # type: ignore[union-attr]

    runs = 0
    while True:  # an Applier that applies everything between batches
        apply_through(config, len(sizes(config)))
        runs += 1
        if not extract(config).held_back:
            break
        assert runs < 20
    assert runs > 1, "released, the batch crossed the limit again before the transaction's end"
    assert [r["after"]["id"] for r in pair_rows(config.intermediate_dir)] == list(range(1, 401))
    assert read_status(config.intermediate_dir).held_back is False  # type: ignore[union-attr]


def test_follow_pauses_above_the_limit_and_resumes_at_the_low_water_mark(
    tmp_path: Path, logical_source: Source, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="applier.extract.flow")
    config = extract_config(tmp_path, logical_source, *FLOW, "extract.max_pair_seconds=1")
    prepare(config, TABLE)
    execute(config, BIG)
    started = time.monotonic()
    phase = ["filling"]
    polls: dict[str, list[tuple[int, int, bool]]] = {"held": [], "band": []}
    logged: list[int] = []

    def held_messages() -> int:
        return sum(r.getMessage().startswith("applier extract: held back:") for r in caplog.records)

    def stop() -> bool:
        status = read_status(config.intermediate_dir)
        now = (len(sizes(config)), confirmed(config), bool(status and status.held_back))
        if phase[0] == "filling" and now[2]:
            execute(config, "INSERT INTO t VALUES (1001, 'committed while held back')")
            logged.append(held_messages())
            phase[0] = "held"
        elif phase[0] in polls:
            polls[phase[0]].append(now)
            if phase[0] == "held" and len(polls["held"]) == 3:
                leave_unapplied(config, 2)
                phase[0] = "band"
            elif phase[0] == "band" and len(polls["band"]) == 3:
                logged.append(held_messages())
                phase[0] = "applying"
        elif phase[0] == "applying":
            apply_through(config, now[0])  # an Applier keeping up
            if any(r["after"] and r["after"]["id"] == 1001 for r in pair_rows(config.intermediate_dir)):
                return True
        return time.monotonic() - started > 120

    extract(config, follow=True, should_stop=stop)
    assert phase == ["applying"]
    held_figures = polls["held"] + polls["band"]
    assert len(set(held_figures)) == 1, "held back: no pair written, the slot not moved, in six polls"
    assert held_figures[0][2] is True
    assert logged[0] == logged[1] == 1, "held back is logged once"
    assert any("applier extract: resumed" in r.getMessage() for r in caplog.records)
    ids = [r["after"]["id"] for r in pair_rows(config.intermediate_dir)]
    assert ids == [*range(1, 401), 1001]


def _config_file(tmp_path: Path, source: Source, *extra: str) -> Path:
    url, slot, publication = source
    path = tmp_path / "applier.yaml"
    path.write_text(
        "configuration_name: ext\nintermediate_dir: pairs\noutput_dir: out\ntarget:\n  path: target\n"
        f"source:\n  url: '{url}'\n  slot: {slot}\n  publication: {publication}\n"
        "extract:\n  max_pair_mb: 0.01\n" + "".join(f"  {line}\n" for line in extra)
    )
    return path


def test_status_shows_retained_wal_lag_and_held_back_and_warns(
    tmp_path: Path, logical_source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = _config_file(tmp_path, logical_source, "warn_retained_wal_mb: 0.001")
    slot = logical_source[1]
    config = extract_config(tmp_path, logical_source)
    prepare(config, TABLE)
    execute(config, "INSERT INTO t VALUES (0, 'first')")
    assert main(["extract", "--config", str(config_file)]) == 0
    execute(config, BIG)  # about 0.06 MiB of WAL not extracted yet
    capsys.readouterr()

    assert main(["status", "--config", str(config_file)]) == 0
    lines = capsys.readouterr().out.splitlines()
    source_line = next(line for line in lines if line.startswith("source: "))
    # Other databases' WAL counts too (the server is shared): KiB here, more when other tests write meanwhile.
    retained = re.fullmatch(rf"source: slot {slot} retains ([0-9.]+) (\w+) of WAL \(wal_status \w+\)", source_line)
    assert retained and float(retained.group(1)) * UNITS[retained.group(2)] >= 50 * 1024, source_line
    lag = next(line for line in lines if line.startswith("extraction lag: "))
    seconds = re.match(r"extraction lag: [0-9.]+ \w+ of WAL, ([0-9]+) s \(every commit before [0-9T:-]+Z is in", lag)
    assert seconds and int(seconds.group(1)) < 60, lag
    assert "; newest extracted commit " in lag
    assert next(line for line in lines if line.startswith("extractor: ")).startswith("extractor: not held back;")
    assert f"warning: slot {slot} retains " in lines[-1]
    assert "above extract.warn_retained_wal_mb (1.0 KiB)" in lines[-1]

    low_limit = ("--set", "extract.max_backlog_mb=0.01")
    assert main(["extract", "--config", str(config_file), *low_limit]) == 0
    summary = capsys.readouterr().out.rstrip()
    assert summary.endswith("held back by the unapplied backlog (extract.max_backlog_mb): ended early")
    assert main(["status", "--config", str(config_file), *low_limit]) == 0
    extractor = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("extractor: "))
    held = r"extractor: HELD BACK since [0-9T:-]+Z \([0-9]+s ago\); backlog [0-9.]+ KiB \(extract.max_backlog_mb: "
    assert re.match(held + r"10.2 KiB; resumes at or below 5.1 KiB\); as of [0-9]+s ago", extractor), extractor


def test_status_with_the_source_unreachable_says_so_in_one_line_and_shows_the_rest(
    tmp_path: Path, logical_source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = _config_file(tmp_path, logical_source)
    (tmp_path / "pairs").mkdir()
    assert main(["status", "--config", str(config_file), "--set", "source.url=host=127.0.0.1 port=1 user=x"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("configuration ext: cycle 0")
    assert [line for line in out if line.startswith("source: ")] == [
        next(line for line in out if line.startswith("source: unreachable: the source cannot be reached: "))
    ]
    assert "extraction lag: WAL unknown, unknown (nothing extracted yet)" in out
    assert out[-1] == "extractor: no status yet (applier extract has not run on this intermediate folder)"


def test_the_extractor_warns_once_of_retained_wal_above_the_threshold(
    tmp_path: Path, logical_source: Source, caplog: pytest.LogCaptureFixture
) -> None:
    config = extract_config(tmp_path, logical_source, "extract.warn_retained_wal_mb=0.001")
    prepare(config, TABLE)
    execute(config, BIG)
    caplog.set_level(logging.WARNING, logger="applier.extract.flow")
    extract(config)
    warnings = [r.getMessage() for r in caplog.records if "extract.warn_retained_wal_mb" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"applier extract: slot {logical_source[1]} retains ")
    execute(config, "INSERT INTO t VALUES (0, 'more WAL')")
    caplog.clear()
    extract(extract_config(tmp_path, logical_source, "extract.warn_retained_wal_mb=0"))  # 0: never
    assert not [r for r in caplog.records if "warn_retained_wal_mb" in r.getMessage()]
