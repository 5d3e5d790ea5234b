"""Nothing an Applier run keeps grows with its length: ended xids, the ledger, the summary, the reports.

Structural checks on real files (no Spark, no timing): what a cycle costs to
record is the same at the thousandth cycle as at the first, and what a run
keeps in memory is bounded by a constant, not by its number of cycles.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest

from applier.engine.checkpoint import Checkpoint
from applier.engine.jsonlines import last_lines
from applier.engine.ledger import LedgerCycle, RunJournal, RunLedger, safe_file_name
from applier.engine.ledger_cycles import RECENT_CYCLES, CycleLog, CycleTally, Definitions
from applier.engine.report import CycleReport, last_report
from applier.engine.run import RunSummary
from applier.errors import IntermediateFileError
from applier.intermediate.pairs import list_pairs
from applier.intermediate.reader import read_pair
from applier.intermediate.schema import parse_table_def
from applier.intermediate.stream import ENDED_XIDS_KEPT, EndedXids, StreamValidator
from handmade import event, row, write_pair

T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
WIDE = {
    "columns": [{"name": "id", "type": "bigint", "nullable": False}]
    + [{"name": f"c{i}", "type": "string", "nullable": True} for i in range(30)],
    "primary_key": ["id"],
}

# The stream validator: a bounded window of ended xids.


def _small_transactions(directory: Path, pairs: int, per_pair: int) -> None:
    """Pairs 1..``pairs``, each with ``per_pair`` transactions that begin, insert a row and commit."""
    lsn = 0
    for seq in range(1, pairs + 1):
        rows, events = [], []
        for n in range(per_pair):
            xid = f"x{seq}-{n}"
            events.append(event("begin", xid, lsn + 1))
            rows.append(row(lsn + 2, xid, "I", after={"id": lsn, "owner": "o", "balance": "1.00"}))
            events.append(event("commit", xid, lsn + 3))
            lsn += 3
        write_pair(directory, seq, rows, events)


def _checked(tmp_path: Path, pairs: int, kept: int) -> StreamValidator:
    _small_transactions(tmp_path, pairs, per_pair=4)
    validator = StreamValidator(ended_xids_kept=kept)
    for ref in list_pairs(tmp_path).pairs:
        validator.check(read_pair(ref))
    return validator


def test_the_validator_remembers_a_bounded_window_of_ended_xids_however_many_pairs_pass(tmp_path: Path) -> None:
    validator = _checked(tmp_path, pairs=40, kept=10)
    assert len(validator.state.ended_xids) == 10, "160 transactions ended, 10 are remembered"
    assert "x40-3" in validator.state.ended_xids and "x1-0" not in validator.state.ended_xids


@pytest.mark.parametrize(
    ("defect", "rows", "events", "code"),
    [
        ("a second begin of a remembered xid", [], [event("begin", "x40-1", 1000)], "second-begin"),
        ("a second end of a remembered xid", [], [event("commit", "x40-1", 1000)], "second-end"),
        ("a row after a remembered end", [row(1000, "x40-1", "D", before={"id": 1})], [], "row-after-end"),
        ("a row of a forgotten xid", [row(1000, "x1-0", "D", before={"id": 1})], [], "row-without-begin"),
        ("an end of a forgotten xid", [], [event("rollback", "x1-0", 1000)], "end-without-begin"),
    ],
)
def test_an_offender_is_refused_inside_the_window_by_name_and_beyond_it_without_a_begin(
    tmp_path: Path, defect: str, rows: list[dict], events: list[dict], code: str
) -> None:
    validator = _checked(tmp_path, pairs=40, kept=10)
    write_pair(tmp_path, 41, rows, events)
    with pytest.raises(IntermediateFileError) as refused:
        validator.check(read_pair(list_pairs(tmp_path, 41).pairs[0]))
    assert refused.value.code == code, defect


def test_a_begin_of_a_long_forgotten_xid_is_a_new_transaction(tmp_path: Path) -> None:
    validator = _checked(tmp_path, pairs=40, kept=10)
    write_pair(tmp_path, 41, [], [event("begin", "x1-0", 1000)])
    validator.check(read_pair(list_pairs(tmp_path, 41).pairs[0]))
    assert validator.state.open_xids == {"x1-0": 41}


def test_ended_xids_keep_the_latest_up_to_the_default_window() -> None:
    ended = EndedXids()
    for start in range(0, ENDED_XIDS_KEPT + 50_000, 10_000):
        ended.add_all(f"t{n}" for n in range(start, start + 10_000))
    assert len(ended) == ENDED_XIDS_KEPT
    assert f"t{ENDED_XIDS_KEPT + 49_999}" in ended and "t49999" not in ended and "t50000" in ended


# The run ledger: one line appended per cycle, definitions once.


_WIDE_TABLES = Checkpoint(tables={f"s.t{i:03d}": parse_table_def(f"s.t{i:03d}", WIDE) for i in range(300)}).to_json()


def _wide_checkpoint(cycle_id: int) -> dict[str, Any]:
    """A checkpoint of 300 tables of 31 columns after ``cycle_id`` (as ``Checkpoint.to_json`` writes it)."""
    return {
        **_WIDE_TABLES,
        "cycle_id": cycle_id,
        "applied_seq": cycle_id,
        "applied_commit_lsn": 1000 + cycle_id,
        "restart_seq": cycle_id + 1,
        "last_lsn": 1000 + cycle_id,
        "row_counts": {"s.t000": 100 + cycle_id},
        "committed_at": (T0 + dt.timedelta(seconds=cycle_id)).isoformat(),
        "table_cycles": {"s.t000": cycle_id},
    }


def _cycle(cycle_id: int) -> LedgerCycle:
    after = _wide_checkpoint(cycle_id)
    return LedgerCycle(
        cycle_id, [cycle_id], _wide_checkpoint(cycle_id - 1), after, after["committed_at"], {"s.t000": {"I": 1}}
    )


def test_recording_a_cycle_appends_the_same_bytes_at_the_last_cycle_as_at_the_first(tmp_path: Path) -> None:
    ledger = RunLedger(tmp_path)
    record = ledger.begin("long", "apply", T0)
    header = ledger.path("long").read_bytes()
    journal = RunJournal(ledger, record)
    written = [journal.add(_cycle(cycle_id)) for cycle_id in range(101, 701)]  # ids of one width
    log = ledger.cycle_log("long")
    assert max(written[-100:]) <= max(written[:100]), "the 600th cycle costs what the 1st did"
    assert max(written) < 2048, "a line names the 300 tables' definitions by digest"
    assert ledger.path("long").read_bytes() == header, "the header is not rewritten per cycle"
    assert log.path.stat().st_size == sum(written), "nothing but the appended lines was written to the cycles file"
    stored = list((tmp_path / "ledger" / "definitions").iterdir())
    assert len(stored) == 1 and stored[0].stat().st_size > 30_000, "the definitions are stored once"
    assert len(log) == 600 and [c.cycle_id for c in log.last(2)] == [699, 700]
    assert log[0].before == _wide_checkpoint(100), "a cycle reads back whole"


def test_a_run_whose_crash_cut_an_append_short_drops_it_and_the_cycles_past_its_checkpoint(tmp_path: Path) -> None:
    ledger = RunLedger(tmp_path)
    journal = RunJournal(ledger, ledger.begin("k", "apply", T0))
    for cycle_id in range(1, 6):
        journal.add(_cycle(cycle_id))
    with open(journal.log.path, "ab") as fh:
        fh.write(b'{"cycle_id": 6, "seqs": [')  # the crash
    assert journal.log.torn() and [c.cycle_id for c in journal.log] == [1, 2, 3, 4, 5]
    journal.forget_after(3)
    assert not journal.log.torn() and [c.cycle_id for c in journal.log] == [1, 2, 3]
    inode = journal.log.path.stat().st_ino
    journal.forget_after(3)
    assert journal.log.path.stat().st_ino == inode, "nothing to drop: the file is not rewritten"


def test_a_record_of_the_one_file_layout_is_read_and_moves_to_the_append_only_layout(tmp_path: Path) -> None:
    scratch = Definitions(tmp_path / "scratch")
    old = [_cycle(1).to_line(scratch), _cycle(2).to_line(scratch)]
    definitions = {old[0]["before"]["tables"]: _WIDE_TABLES["tables"]}
    ledger = RunLedger(tmp_path)
    ledger.directory.mkdir()
    one_file = {
        "run_key": "k", "status": "failed", "mode": "apply", "started_at": T0.isoformat(), "finished_at": None,
        "attempts": 1, "error": "Crash: disk full", "pruned_pairs": [], "definitions": definitions, "cycles": old,
    }  # fmt: skip
    ledger.path("k").write_text(json.dumps(one_file))
    read = ledger.get("k")
    assert read is not None and [c.cycle_id for c in read.cycles] == [1, 2]
    assert read.cycles[1].after == _wide_checkpoint(2)
    record = ledger.begin("k", "apply", T0)
    assert isinstance(record.cycles, CycleLog) and "cycles" not in json.loads(ledger.path("k").read_text())
    RunJournal(ledger, record).add(_cycle(3))
    again = ledger.get("k")
    assert again is not None and [c.cycle_id for c in again.cycles] == [1, 2, 3] and again.attempts == 2


def test_retention_finds_a_record_by_its_cycles_file_when_its_header_is_older(tmp_path: Path) -> None:
    ledger = RunLedger(tmp_path)
    journal = RunJournal(ledger, ledger.begin("long", "apply", T0))
    journal.add(_cycle(1))
    hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    os.utime(ledger.path("long"), (hour_ago.timestamp(), hour_ago.timestamp()))
    recent = ledger.records(written_after=hour_ago + dt.timedelta(minutes=30))
    assert [r.run_key for r in recent] == ["long"], "a run longer than the retention window still protects its pairs"
    assert safe_file_name("long").endswith(".json") and not journal.log.path.name.endswith(".json")


# The summary and the cycle reports.


def test_a_run_summary_keeps_the_last_reports_and_counts_them_all() -> None:
    summary = RunSummary()
    for cycle_id in range(1, 1001):
        summary.add_report(CycleReport(cycle_id=cycle_id, seqs=[cycle_id], rows_read=3, committed=1, bytes=10))
    assert len(summary.reports) == RECENT_CYCLES == 100
    assert [r.cycle_id for r in summary.reports[:1] + summary.reports[-1:]] == [901, 1000]
    assert (summary.cycles_run, summary.rows_read, summary.committed, summary.bytes) == (1000, 3000, 1000, 10_000)


def test_a_cycle_tally_keeps_the_last_cycles_and_counts_every_table_outcome() -> None:
    cycles = [
        LedgerCycle(i, [i], {}, {}, T0.isoformat(), tables={"a": "applied", "b": "skipped"}) for i in range(1, 501)
    ]
    tally = CycleTally.of(cycles)
    assert len(tally.recent) == 100 and tally.recent[0].cycle_id == 401 and tally.count == 500
    assert tally.outcomes == {"applied": 500, "skipped": 500}
    summary = RunSummary()
    summary.add_cycles(tally)
    assert (len(summary.cycles), summary.cycles_recorded, summary.table_outcomes) == (
        100, 500, {"applied": 500, "skipped": 500},
    )  # fmt: skip


def test_the_last_report_is_read_from_the_end_and_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "cycles.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for cycle_id in range(1, 2001):
            fh.write(json.dumps({"cycle_id": cycle_id, "pad": "x" * (70_000 if cycle_id == 2000 else 10)}) + "\n")
        fh.write('{"cycle_id": 2001, "se')
    last = last_report(path)
    assert last is not None and last["cycle_id"] == 2000, "a line longer than a read block is read whole"
    assert [r["cycle_id"] for r in last_lines(path, 3)] == [1998, 1999, 2000]
    assert last_report(tmp_path / "none.jsonl") is None
