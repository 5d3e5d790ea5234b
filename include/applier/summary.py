"""A short summary of where a configuration stands, read from its files: ``make demo`` ends with it.

    python -m applier.summary --config FILE [--set KEY=VALUE]...

It reads, without Spark or Airflow, the checkpoint (cycles, rows per table),
``cycles.jsonl`` (transactions), the run ledger (the last run) and the newest
validation results, and prints where the tables and the Data Docs are.
:func:`read_summary` does the reading, :func:`summary_lines` the wording.
:func:`main` also draws the queue-memory chart of the recent cycles
(``<work_dir>/queue-memory.png``, as ``applier advise`` does) and names it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from applier.config import Config, load_config
from applier.engine.checkpoint import CheckpointStore
from applier.engine.ledger import RunLedger
from applier.engine.report import collision_counts, set_aside_counts
from applier.errors import ApplierError
from applier.targets.collisions import describe
from applier.targets.dialects import dialect

RESULTS_FILE = "validation.json"  # as applier.validate writes it, read here without importing GX


@dataclass
class Summary:
    """What a configuration's files say.

    Attributes:
        configuration_name: the configuration.
        cycles: cycles committed so far.
        applied_seq: the last pair applied.
        committed: transactions committed, over every cycle report.
        rolled_back: transactions rolled back, over every cycle report.
        rows: rows each target table holds, by the engine's count.
        target: where the target tables are.
        last_run: the last ledger record's key, mode, status and cycle count, if any.
        validation: the newest validation's JSON, if any.
        chart: the queue-memory chart and what it draws, when one was drawn.
        set_aside: transactions error actions let by, per action, over every cycle report.
        collisions: changes the target did not hold as the log said, per table and kind, over every cycle report.
    """

    configuration_name: str
    cycles: int
    applied_seq: int
    committed: int
    rolled_back: int
    rows: dict[str, int] = field(default_factory=dict)
    target: str = ""
    last_run: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    chart: str | None = None
    set_aside: dict[str, int] = field(default_factory=dict)
    collisions: dict[str, dict[str, int]] = field(default_factory=dict)


def collisions_line(counts: dict[str, dict[str, int]]) -> str:
    """One line on collisions (see README, *Collisions*), for people."""
    if not counts:
        return "collisions: none"
    each = "; ".join(f"{table}: {describe(kinds)}" for table, kinds in counts.items())
    return f"collisions: {sum(sum(k.values()) for k in counts.values())}, applied as upserts ({each})"


def set_aside_line(counts: dict[str, int]) -> str:
    """One line on transactions set aside, for people."""
    if not counts:
        return "transactions set aside by error actions: none"
    each = ", ".join(f"{n} {action}" for action, n in counts.items())
    return f"transactions set aside by error actions: {sum(counts.values())} ({each}); see applier exceptions list"


def _reports(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    complete = text[: text.rfind("\n") + 1]  # a last line without its newline is still being written
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def _newest_validation(folder: Path) -> dict[str, Any] | None:
    results = sorted(folder.glob(f"*/{RESULTS_FILE}"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    if not results:
        return None
    document: dict[str, Any] = json.loads(results[-1].read_text(encoding="utf-8"))
    return {**document, "json_path": str(results[-1])}


def read_summary(config: Config) -> Summary:
    """Read the summary of ``config`` from its work folder."""
    checkpoint = CheckpointStore(config.work_dir).load()
    reports = _reports(config.work_dir / "cycles.jsonl")
    records = RunLedger(config.work_dir).records()
    last = records[-1] if records else None
    return Summary(
        configuration_name=config.configuration_name,
        cycles=checkpoint.cycle_id,
        applied_seq=checkpoint.applied_seq,
        committed=sum(r.get("committed", 0) for r in reports),
        set_aside=set_aside_counts(reports),
        collisions=collision_counts(reports),
        rolled_back=sum(r.get("rolled_back", 0) for r in reports),
        rows=dict(sorted(checkpoint.row_counts.items())),
        target=dialect(config.target.type).where(config.target),
        last_run=None
        if last is None
        else {"run_key": last.run_key, "mode": last.mode, "status": last.status, "cycles": len(last.cycles)},
        validation=_newest_validation(config.work_dir / "validation"),
    )


def summary_lines(s: Summary) -> list[str]:
    """The summary for people, a line each."""
    lines = [
        f"configuration {s.configuration_name}: {s.cycles} cycles, applied through pair {s.applied_seq}",
        f"transactions: {s.committed} committed, {s.rolled_back} rolled back",
        set_aside_line(s.set_aside),
        collisions_line(s.collisions),
    ]
    if s.last_run is not None:
        r = s.last_run
        lines.append(f"last run {r['run_key']}: {r['mode']}, {r['status']}, {r['cycles']} cycles")
    lines.append(f"rows per table ({sum(s.rows.values())} in all):")
    lines += [f"  {table}: {rows}" for table, rows in s.rows.items()]
    if s.validation is None:
        lines.append("validation: none yet")
    else:
        v = s.validation
        outcome = "passed" if v.get("success") else "FAILED"
        lines.append(f"validation {v.get('results_name')}: {outcome} ({len(v.get('tables', {}))} tables)")
        lines += [f"  {failure}" for failure in v.get("failures", [])]
        lines.append(f"  results: {v['json_path']}")
        lines.append(f"  Data Docs: {v.get('data_docs_path')}")
    lines.append(f"target: {s.target}")
    if s.chart is not None:
        lines.append(f"queue memory chart: {s.chart}")
    return lines


def draw_chart(config: Config) -> str | None:
    """Draw the queue-memory chart of ``config``'s recent cycles; where it is and what it draws, or None."""
    from applier.advise.chart import write_queue_chart  # deferred: matplotlib only when drawing

    chart = write_queue_chart(config)
    if chart is None:
        return None
    return f"{chart.path} ({chart.cycles} recent cycles, {chart.reported} with queue figures)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m applier.summary", description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        summary = read_summary(config)
        summary = replace(summary, chart=draw_chart(config))
    except ApplierError as e:
        print(f"applier: error: {e}", file=sys.stderr)
        return e.exit_code
    print("\n".join(summary_lines(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
