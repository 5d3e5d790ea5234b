"""The lag check of the library: the oldest unapplied commit's age against ``alert.max_lag_seconds``, in one line.

Pairs are written by hand with known source times, so every figure below is
worked out from those times, not from the code that measures them.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from applier.config import Config, load_config
from applier.lag_alert import check_lag
from handmade import row, write_pair

NOW = dt.datetime(2026, 11, 26, 12, 0, 0, tzinfo=dt.UTC)


def commit(xid: str, lsn: int, ts: str) -> list[dict]:
    return [
        {"record": "begin", "xid": xid, "lsn": lsn - 2, "ts": ts},
        {"record": "commit", "xid": xid, "lsn": lsn, "ts": ts},
    ]


def insert(xid: str, lsn: int, key: int) -> dict:
    return row(lsn, xid, "I", after={"id": key, "owner": "ann", "balance": "1.00"})


def config(tmp_path: Path, *settings: str) -> Config:
    (tmp_path / "in").mkdir(exist_ok=True)
    path = tmp_path / "applier.yaml"
    path.write_text("configuration_name: lagged\nintermediate_dir: in\noutput_dir: out\ntarget: {path: t}\n")
    return load_config(path, settings)


def test_the_oldest_unapplied_commit_over_the_threshold_is_one_alert_line(tmp_path: Path) -> None:
    cfg = config(tmp_path, "alert.max_lag_seconds=600")
    # Pair 1 holds only the start of a transaction: the oldest unapplied commit is pair 2's.
    write_pair(cfg.intermediate_dir, 1, [insert("t1", 11, 1)], [{"record": "begin", "xid": "t1", "lsn": 10, "ts": "x"}])
    write_pair(cfg.intermediate_dir, 2, [insert("t2", 21, 2)], commit("t2", 22, "2026-11-26T10:59:30.000000Z"))
    write_pair(cfg.intermediate_dir, 3, [insert("t3", 31, 3)], commit("t3", 32, "2026-11-26T11:59:00.000000Z"))

    check = check_lag(cfg, now=NOW)

    assert check.lag_seconds == 3630.0  # 12:00:00 - 10:59:30
    assert (check.oldest_unapplied_seq, check.oldest_unapplied_commit_ts) == (2, "2026-11-26T10:59:30.000000Z")
    assert (check.backlog_pairs, check.last_applied_commit_ts, check.blocked_by) == (3, None, None)
    assert check.over is True
    assert check.line() == (
        "lag alert: configuration lagged: oldest unapplied commit (pair 2, source time 2026-11-26T10:59:30.000000Z) "
        "is 3630 s (1h 0m) old, over alert.max_lag_seconds 600 s; 3 pairs waiting"
    )
    payload = check.payload()
    assert (payload["text"], payload["alert"], payload["over"]) == (check.line(), "replication_lag", True)
    assert (payload["configuration"], payload["lag_seconds"], payload["max_lag_seconds"]) == ("lagged", 3630.0, 600.0)
    assert payload["checked_at"] == NOW.isoformat()


def test_a_lag_within_the_threshold_or_without_one_is_no_alert(tmp_path: Path) -> None:
    write_pair(tmp_path / "in", 1, [insert("t1", 11, 1)], commit("t1", 12, "2026-11-26T11:59:58.500000Z"))

    within = check_lag(config(tmp_path, "alert.max_lag_seconds=2"), now=NOW)
    assert (within.lag_seconds, within.over) == (1.5, False)
    assert within.line() == (
        "configuration lagged: oldest unapplied commit (pair 1, source time 2026-11-26T11:59:58.500000Z) "
        "is 1.5 s (1.50 s) old, within alert.max_lag_seconds 2 s; 1 pairs waiting"
    )
    unset = check_lag(config(tmp_path), now=NOW + dt.timedelta(days=30))
    assert (unset.lag_seconds, unset.max_lag_seconds, unset.over) == (30 * 86400 + 1.5, None, False)
    assert unset.line().endswith("old, alert.max_lag_seconds not set (no alert); 1 pairs waiting")


def test_nothing_unapplied_is_no_lag_however_old_the_source_times(tmp_path: Path) -> None:
    cfg = config(tmp_path, "alert.max_lag_seconds=1")
    check = check_lag(cfg, now=NOW)
    assert (check.lag_seconds, check.oldest_unapplied_seq, check.backlog_pairs, check.over) == (0.0, None, 0, False)
    assert check.line() == (
        "configuration lagged: lag 0 s, no unapplied commit (0 pairs waiting); within alert.max_lag_seconds 1 s"
    )


def test_the_alert_names_the_refused_pair_that_blocks(tmp_path: Path) -> None:
    cfg = config(tmp_path, "alert.max_lag_seconds=60")
    write_pair(cfg.intermediate_dir, 1, [insert("t1", 11, 1)], commit("t1", 12, "2026-11-25T12:00:00.000000Z"))
    (cfg.intermediate_dir / "000000000001.dat").write_bytes(b"cut")  # the header says otherwise

    check = check_lag(cfg, now=NOW)

    assert check.over and check.lag_seconds == 86400.0
    assert check.blocked_by is not None and check.blocked_by["seq"] == 1
    detail = check.blocked_by["detail"]
    assert check.line().endswith(
        f"is 86400 s (1d 0h) old, over alert.max_lag_seconds 60 s; 1 pairs waiting; blocked by pair 1: {detail}"
    )
    assert "\n" not in check.line()
