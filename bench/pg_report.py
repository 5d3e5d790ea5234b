"""The PostgreSQL benchmark's Markdown report: every approach side by side, the issue's goals met or not met.

``render`` takes the benchmark's result (also saved as ``report.json``); the
machine and workload sections are the Delta report's own
(:func:`bench.report.machine_section`, :func:`bench.report.workload_section`).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from bench.common import GOAL_LIMIT_RATIO, GOAL_PG_PER_TRANSACTION, GOAL_SPEEDUP
from bench.pg_network import measured_goals, measured_network_section, network_section
from bench.pg_server import is_local
from bench.report import Add, machine_section, memory_section, met, workload_section


class Figures(NamedTuple):
    """The figures derived from several measurements."""

    limit_work: float  # the limit's parse, COPY and apply seconds
    limit_e2e: float  # the same plus its Spark start from the process spawn
    per_total: float  # per-transaction seconds for every committed transaction (measured, or extrapolated linearly)
    row_total: float  # row-by-row seconds, the same
    per_steady: float  # per-transaction: its first half once, plus its second half's rate for the rest
    row_steady: float  # row-by-row, the same
    vs_row: float  # row-by-row / compiled (one cycle)
    vs_per: float  # per-transaction / compiled (one cycle)
    ratio_e2e: float  # compiled wall / limit with Spark start
    ratio_work: float  # compiled time inside cycles / limit work
    extrapolated: bool  # a baseline applied a prefix only


def whole(part: dict[str, Any], committed: int) -> bool:
    """Whether a baseline applied every committed transaction (nothing of it is extrapolated)."""
    return bool(part["transactions"] >= committed)


def any_prefix(r: dict[str, Any]) -> bool:
    """Whether either baseline applied a prefix only, so that its time is extrapolated."""
    committed = r["workload"]["committed"]
    return not (whole(r["pertxn"], committed) and whole(r["rowbyrow"], committed))


def linear(part: dict[str, Any], committed: int) -> float:
    """A prefix baseline's seconds extrapolated linearly to ``committed`` transactions."""
    return float(part["seconds"] * committed / part["transactions"])


def steady(part: dict[str, Any], committed: int) -> float:
    """The first half of the prefix (with the initial loads) once, then the second half's rate for the rest."""
    first, rest = part["half_transactions"], part["transactions"] - part["half_transactions"]
    if rest <= 0 or committed <= first:
        return linear(part, committed)
    return float(part["half_s"] + (part["seconds"] - part["half_s"]) / rest * (committed - first))


def figures(r: dict[str, Any]) -> Figures:
    """Compute the derived figures once for every section."""
    committed, one, lim = r["workload"]["committed"], r["compiled_one"], r["limit"]
    limit_work = lim["parse_s"] + lim["copy_s"] + lim["apply_s"]
    limit_e2e = lim["startup_since_spawn_s"] + limit_work
    per_total, row_total = linear(r["pertxn"], committed), linear(r["rowbyrow"], committed)
    return Figures(
        limit_work=limit_work,
        limit_e2e=limit_e2e,
        per_total=per_total,
        row_total=row_total,
        per_steady=steady(r["pertxn"], committed),
        row_steady=steady(r["rowbyrow"], committed),
        extrapolated=any_prefix(r),
        vs_row=row_total / one["wall_s"],
        vs_per=per_total / one["wall_s"],
        ratio_e2e=one["wall_s"] / limit_e2e,
        ratio_work=one["cycle_seconds"] / limit_work,
    )


def _title(r: dict[str, Any], fig: Figures, add: Add) -> None:
    add("# PostgreSQL apply benchmark")
    add("")
    add(
        f"Produced by `{r['command']}` on {r['date']}, in {r['total_s'] / 60:.1f} minutes, with the code at git "
        f"{r['machine'].get('git', 'unknown')}."
    )
    add("It is a benchmark, not a test: the numbers depend on the machine and on what else runs on it.")
    add("")


def _machine(r: dict[str, Any], fig: Figures, add: Add) -> None:
    s = r["server"]
    machine_section(r, add)
    add("## PostgreSQL server")
    add("")
    add(
        f"- PostgreSQL {s['version']} at `{s['server']}`{_where(s['server'])}, psycopg "
        f"{s['psycopg']}; every approach ran against a new database of its own on this server, after a `CHECKPOINT`"
    )
    add("- settings: " + ", ".join(f"`{k}` {v}" for k, v in s["settings"].items()))
    add(f"- compiled runs: `apply.threads: {r['threads']}` load connections")
    add("")


def _where(server: str) -> str:
    return ", on this machine (it shares the cores)" if is_local(server) else ", across the network"


def _workload(r: dict[str, Any], fig: Figures, add: Add) -> None:
    workload_section(r, add)


def _side_by_side(r: dict[str, Any], fig: Figures, add: Add) -> None:
    changes, one, many = r["workload"]["changes"], r["compiled_one"], r["compiled_cycles"]
    lim, per, row = r["limit"], r["pertxn"], r["rowbyrow"]
    committed = r["workload"]["committed"]
    add("## Side by side")
    add("")
    add("| approach | wall s | rows/s (changes / wall) | what the time covers |")
    add("|---|---:|---:|---|")
    for run, what in ((one, "no size limit"), (many, f"{many['limit_mib']:g} MiB limit")):
        add(
            f"| compiled, {run['cycles']} cycle{'s' if run['cycles'] != 1 else ''} ({what}) | {run['wall_s']:.1f} | "
            f"{changes / run['wall_s']:,.0f} | `applier run` process end to end; {run['cycle_seconds']:.1f} s inside "
            f"cycles |"
        )
    add(
        f"| calibrated limit | {fig.limit_e2e:.1f} | {changes / fig.limit_e2e:,.0f} | Spark start "
        f"{lim['startup_since_spawn_s']:.1f} + read and parse every image {lim['parse_s']:.1f} + COPY of the final "
        f"rows into staging {lim['copy_s']:.1f} + set-wise apply {lim['apply_s']:.1f} (work alone "
        f"{fig.limit_work:.1f} s) |"
    )
    for label, part, total, other in (
        ("per-transaction", per, fig.per_total, fig.per_steady),
        ("log-order row-by-row", row, fig.row_total, fig.row_steady),
    ):
        if whole(part, committed):
            covers = f"all {committed:,} committed transactions applied, one source transaction at a time"
            add(f"| {label} (measured) | {total:,.0f} | {changes / total:,.0f} | {covers} |")
            continue
        add(
            f"| {label} (extrapolated) | {total:,.0f} | {changes / total:,.0f} | {part['seconds']:.1f} s for the "
            f"first {part['transactions']:,} committed transactions x {committed:,} / {part['transactions']:,} "
            f"(second-half rate: {other:,.0f} s) |"
        )
    add("")


def _speedup_verdict(linear_x: float, steady_x: float, goal: float) -> str:
    """Met when both extrapolations meet the goal; says so when only the linear one does."""
    if linear_x >= goal and steady_x >= goal:
        return met(True)
    if linear_x >= goal:
        return "**met by the linear extrapolation only**"
    return met(False)


def _goals(r: dict[str, Any], fig: Figures, add: Add) -> None:
    one, many = r["compiled_one"], r["compiled_cycles"]
    add("## Goals of the issue")
    add("")
    add("| goal | measured | |")
    add("|---|---|---|")
    for label, goal, total, other, ratio in (
        ("log-order row-by-row", GOAL_SPEEDUP, fig.row_total, fig.row_steady, fig.vs_row),
        ("per-transaction", GOAL_PG_PER_TRANSACTION, fig.per_total, fig.per_steady, fig.vs_per),
    ):
        second_half = f"; with the second-half rate: {other / one['wall_s']:,.1f}x" if fig.extrapolated else ""
        add(
            f"| compiled at least {goal:g}x faster than {label} | {total:,.0f} / {one['wall_s']:.1f} = "
            f"**{ratio:,.1f}x** ({many['cycles']}-cycle run: {total / many['wall_s']:,.1f}x{second_half}) | "
            f"{_speedup_verdict(ratio, other / one['wall_s'], goal)} |"
        )
    add(
        f"| compiled within {GOAL_LIMIT_RATIO:g}x of the calibrated limit | compiled wall / limit (both with Spark "
        f"start) = {one['wall_s']:.1f} / {fig.limit_e2e:.1f} = **{fig.ratio_e2e:.2f}x**; time inside cycles / limit "
        f"work = {one['cycle_seconds']:.1f} / {fig.limit_work:.1f} = {fig.ratio_work:.2f}x; {many['cycles']}-cycle "
        f"run: {many['wall_s'] / fig.limit_e2e:.2f}x | {met(fig.ratio_e2e <= GOAL_LIMIT_RATIO)} |"
    )
    add("")
    if across := measured_goals(r, fig):
        add(across)
        add("")


def _forms(r: dict[str, Any], fig: Figures, add: Add) -> None:
    f = r["forms"]
    add("## MERGE or INSERT … ON CONFLICT")
    add("")
    forms = list(next(iter(f["scenarios"].values())))
    add("| scenario | rows staged | " + " | ".join(f"{form}: median s (trials)" for form in forms) + " | faster |")
    add("|---|---:|" + "---:|" * len(forms) + "---|")
    for scenario, by_form in f["scenarios"].items():
        cells = [f"{v['median_s']:.2f} ({', '.join(f'{t:.2f}' for t in v['trials_s'])})" for v in by_form.values()]
        medians = [v["median_s"] for v in by_form.values()]
        margin = max(medians) / min(medians) if min(medians) > 0 else 0.0
        add(
            f"| {scenario} | {sum(f['rows'][scenario].values()):,} | "
            + " | ".join(cells)
            + f" | {f['faster'][scenario]} ({margin:.2f}x) |"
        )
    add("")
    winners = set(f["faster"].values())
    verdict = (
        f"**{winners.pop()}** is faster in every scenario"
        if len(winners) == 1
        else "neither form is faster in every scenario (see the table)"
    )
    add(
        f"{verdict}. Both forms left the same rows in every trial: {'yes' if f['agree'] else 'NO'}. The target "
        "(`applier.targets.pg_sql`) applies keyed tables with `merge_keyed` (one MERGE), chosen on this comparison."
    )
    add("")


def _compiled(r: dict[str, Any], fig: Figures, add: Add) -> None:
    one, many = r["compiled_one"], r["compiled_cycles"]
    add("## Compiled runs: seconds per phase (sums over the cycles, from `cycles.jsonl`)")
    add("")
    add(f"| phase | {one['cycles']} cycle | {many['cycles']} cycles |")
    add("|---|---:|---:|")
    for k in dict.fromkeys([*one["phases"], *many["phases"]]):
        add(f"| {k} | {one['phases'].get(k, 0.0):.1f} | {many['phases'].get(k, 0.0):.1f} |")
    add(f"| all phases | {one['cycle_seconds']:.1f} | {many['cycle_seconds']:.1f} |")
    add(
        f"| outside cycles (start-up, rebuild, shutdown) | {one['wall_s'] - one['cycle_seconds']:.1f} | "
        f"{many['wall_s'] - many['cycle_seconds']:.1f} |"
    )
    add("")
    add(
        f"Cycles of the {many['cycles']}-cycle run (MiB / s): "
        + ", ".join(f"{mb:g} / {s:.1f}" for mb, s in zip(many["per_cycle_mib"], many["per_cycle_seconds"], strict=True))
    )
    add("")
    for run in (one, many):
        batches = [b for cycle in run["load_batches"] for b in cycle]
        shown = "; ".join(
            f"cycle {i}: " + (" | ".join(", ".join(b) for b in cycle) or "none")
            for i, cycle in enumerate(run["load_batches"], 1)
        )
        add(
            f"Load batches of the {run['cycles']}-cycle run ({len(batches)} batches, at most "
            f"{max((len(b) for b in batches), default=0)} tables each): {shown or 'none in the cycle reports'}; "
            f"{run['spilled']} table spill files."
        )
        add("")
    net = one["net_rows"]
    add(
        "Net rows written by the one-cycle run: "
        + ", ".join(f"{k} {n:,}" for k, n in sorted(net.items()))
        + f"; {one['committed']:,} transactions committed, {one['rolled_back']:,} rolled back."
    )
    agree = r["compiled_agree"]
    add(f"Both compiled runs leave the same rows (count and digest) in every table: {'yes' if agree else 'NO'}.")
    add("")
    if not agree:
        add("```")
        add(json.dumps(r["target_rows"], indent=1))
        add("```")
        add("")


def _memory(r: dict[str, Any], fig: Figures, add: Add) -> None:
    runs = [r["compiled_one"], r["compiled_cycles"]]
    memory_section(
        add,
        [(f"compiled, {run['cycles']} cycle{'s' if run['cycles'] != 1 else ''}", run) for run in runs],
        [
            (label, r[key])
            for label, key in (
                ("calibrated limit", "limit"),
                ("MERGE or ON CONFLICT", "forms"),
                ("per-transaction", "pertxn"),
                ("log-order row-by-row", "rowbyrow"),
            )
        ],
        "The tree holds the Python driver, its JVM and the PySpark workers; the PostgreSQL server's processes are "
        "not in it (they serve other users of the server too).",
    )


def _how(r: dict[str, Any], fig: Figures, add: Add) -> None:
    one, many, lim, f = r["compiled_one"], r["compiled_cycles"], r["limit"], r["forms"]
    add("## How each number was measured")
    add("")
    add(
        f"**Compiled.** `python -m applier.cli run --config <file>` as a subprocess with `target.type: postgres`, "
        f"`target.url` a new database, `apply.threads: {r['threads']}`: a fresh Spark application each time. Wall "
        f"time is from the spawn to the exit; it includes Spark's start. The second run has "
        f"`apply.process_intermediate_size_per_job: {many['limit_mib']:g}`, chosen from the pair sizes to give about "
        f"six cycles ({many['cycles']} here). Rows/s is the changes of the workload ({one['rows_read']:,} read) over "
        "the wall time."
    )
    add("")
    add(
        f"**Calibrated limit.** A fresh Spark application with the same settings reads every `.dat` file "
        f"({lim['dat_rows']:,} rows, {lim['images']:,} images) and, per table, parses both images with the engine's "
        f"typed `from_json`, forced by a `noop` write (as `bench.limit` does for Delta): "
        + ", ".join(f"{k} {s:.1f} s" for k, s in lim["parse_per_table_s"].items())
        + f". Then, with Spark stopped, the final rows the one-cycle compiled run left ({lim['final_rows']:,}, read "
        f"before timing, {lim['read_final_s']:.1f} s) are encoded as the target encodes them "
        "(`pg_load.staging_rows`, `csv_bytes`) and COPYed into one unlogged staging table per table on one "
        "connection, then applied set-wise into empty tables in one transaction (`pg_sql.merge_keyed`, as the target; "
        "`insert_copies` for the table without a key): "
        + ", ".join(
            f"{k} {v['rows']:,} rows COPY {v['encode_s'] + v['copy_s']:.2f} s apply {v['apply_s']:.2f} s"
            for k, v in lim["per_table"].items()
        )
        + f"; commit {lim['commit_s']:.2f} s."
    )
    add("")
    add(
        f"**MERGE or INSERT … ON CONFLICT.** The final rows of every keyed table (from the compiled run) are COPYed "
        f"into staging tables once. Scenario *insert*: the tables are empty and every staged row is an upsert. "
        f"Scenario *update + delete*: the tables hold every row and every tenth staged row is a delete, the others "
        f"update their row to the same values. Each trial empties the tables (`TRUNCATE`; refilled for the second "
        f"scenario), runs `VACUUM (ANALYZE)` and `CHECKPOINT`, then times one transaction applying every table with "
        f"one form: `delete_keyed` + `upsert_keyed`, or one `MERGE … WHEN MATCHED AND __op = 'D' "
        f"THEN DELETE WHEN MATCHED THEN UPDATE WHEN NOT MATCHED THEN INSERT` (`merge_keyed`, the target's). "
        f"{f['repeats']} trials per form and "
        "scenario, the forms alternating which goes first."
    )
    add("")
    _how_baselines(r, fig, add)


def _how_baselines(r: dict[str, Any], fig: Figures, add: Add) -> None:
    per, row, committed = r["pertxn"], r["rowbyrow"], r["workload"]["committed"]
    add(
        f"**Per-transaction.** {_which(per, committed)} committed transactions in commit order "
        f"({per['rows']:,} changes, read with pyarrow before timing, {per['load_s']:.1f} s) are applied one by one: "
        f"per source transaction, each touched table's net change (compiled in Python, as the engine compiles a "
        f"cycle) is COPYed into a temporary staging table (created once, emptied by a `DELETE` in the same "
        f"transaction, vacuumed every 1,000 transactions) and applied with the target's statements (`merge_keyed`; "
        f"`delete_copies`, `insert_copies`; `TRUNCATE`), prepared, skipping statements with nothing "
        f"to do, in one database transaction per source transaction: "
        f"{per['commits']:,} commits, {per['copies']:,} COPYs and {per['statements']:,} statements in "
        f"{per['seconds']:.1f} s ({per['seconds'] / per['commits'] * 1000:.1f} ms per transaction; "
        f"{per['prepare_s']:.1f} s compiling and encoding, {per['database_s']:.1f} s in the database)."
    )
    add("")
    add(
        f"**Log-order row-by-row.** {_which(row, committed)} committed transactions ({row['rows']:,} "
        f"changes), each change as one prepared, parameterised statement in log order (INSERT; UPDATE of every "
        f"column where the old key; DELETE where the key; TRUNCATE; without a key, a delete removes one row holding "
        f"the old values, by `ctid`), one commit per source transaction; every update and delete touched exactly one "
        f"row: {row['statements']:,} statements and {row['commits']:,} commits in {row['seconds']:.1f} s "
        f"({row['seconds'] / max(row['statements'], 1) * 1000:.2f} ms per statement; {row['prepare_s']:.1f} s typing "
        f"the parameters, {row['database_s']:.1f} s in the database)."
    )
    add("")
    _baselines_basis(r, fig, add)


def _which(part: dict[str, Any], committed: int) -> str:
    """The transactions a baseline applied, to start a sentence."""
    return f"All {committed:,}" if whole(part, committed) else f"The first {part['transactions']:,}"


def _baselines_basis(r: dict[str, Any], fig: Figures, add: Add) -> None:
    """Whether the baselines were measured whole or extrapolated, and whether they leave the compiled run's rows."""
    per, row, committed = r["pertxn"], r["rowbyrow"], r["workload"]["committed"]
    agree = r["baselines_agree"]
    shown = "not compared (different prefixes)" if agree is None else ("yes" if agree else "NO")
    matches = r.get("baselines_match_compiled", {})
    versus = "; ".join(
        f"{label} and the one-cycle compiled apply leave the same rows: {'yes' if matches[key] else 'NO'}"
        for key, label in (("pertxn", "per-transaction"), ("rowbyrow", "row-by-row"))
        if key in matches
    )
    if not fig.extrapolated:
        add(
            f"Both baselines applied all {committed:,} committed transactions of the workload, so nothing is "
            f"extrapolated. Both baselines leave the same rows (count and digest) in every table: {shown}; {versus}."
        )
        add("")
        return
    halves = "; ".join(
        f"{label}: first {p['half_transactions']:,} transactions ({p['half_rows']:,} changes) {p['half_s']:.1f} s, "
        f"next {p['transactions'] - p['half_transactions']:,} ({p['rows'] - p['half_rows']:,} changes) "
        f"{p['seconds'] - p['half_s']:.1f} s"
        for label, p in (("per-transaction", per), ("row-by-row", row))
    )
    add(
        f"A baseline that applied a prefix is extrapolated linearly to all {committed:,} committed transactions "
        f"(prefix seconds x committed / prefix transactions). The prefix starts with the workload's initial loads "
        f"(transactions of 1,000 inserts) while the tables are still small, so a second estimate counts the "
        f"prefix's first half once and extrapolates its second half's rate to the other transactions ({halves}); "
        f"a goal is marked met when both estimates meet it. Both baselines leave the same rows (count and digest) "
        f"in every table: {shown}{'; ' + versus if versus else ''}."
    )
    add("")


_SECTIONS = (_title, _machine, _workload, _side_by_side, _goals, network_section, measured_network_section)
_SECTIONS += (_forms, _compiled, _memory, _how)


def render(r: dict[str, Any]) -> str:
    """The Markdown report.

    Args:
        r: the benchmark's result, as ``bench.pg_bench.run_benchmark`` returns it.

    Returns:
        The report's text, ending in a newline.
    """
    fig = figures(r)
    lines: list[str] = []
    for section in _SECTIONS:
        section(r, fig, lines.append)
    return "\n".join(lines) + "\n"
