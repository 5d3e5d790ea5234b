"""The benchmark's Markdown report, rendered from its results (``report.json``).

:func:`render` joins one list of lines per section; a section whose steps did
not run is left out. Every figure the steps measured is shown, the issues'
goals are marked met or not met, and how each step measures is told once, in
``bench/README.md``. Derived figures come from :mod:`bench.figures`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from bench import figures as f
from bench.figures import MIB
from bench.pg_server import is_local

Add = Callable[[str], None]  # appends one line to the report
Rows = list[list[Any]]
KINDS = ("transactions", "tables", "compiled")


def met(ok: bool) -> str:
    """The verdict on one goal, in bold."""
    return "**met**" if ok else "**not met**"


def table(add: Add, head: Iterable[str], rows: Iterable[Iterable[Any]], right: int = 1, text: int = 99) -> None:
    """A Markdown table, columns from ``right`` on right-aligned but for those from ``text`` on, then a blank line."""
    head = list(head)
    add("| " + " | ".join(head) + " |")
    add("|" + "|".join("---:" if right <= i < text else "---" for i in range(len(head))) + "|")
    for row in rows:
        add("| " + " | ".join(str(c) for c in row) + " |")
    add("")


def para(add: Add, *parts: str) -> None:
    """One paragraph, then a blank line."""
    add("".join(parts))
    add("")


def mib(n: float) -> str:
    return f"{n / MIB:,.1f}"


def cycles(run: dict[str, Any]) -> str:
    return f"{run['cycles']} cycle{'s' if run['cycles'] != 1 else ''}"


def yes(ok: bool | None) -> str:
    return "not compared (different prefixes)" if ok is None else ("yes" if ok else "NO")


def ops(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {n:,}" for k, n in sorted(counts.items()))


def _title(r: dict[str, Any], add: Add) -> None:
    add("# Apply benchmarks")
    add("")
    para(
        add,
        f"Produced by `{r['command']}` on {r['date']}, in {r['total_s'] / 60:.1f} minutes, with the code at git ",
        f"{r['machine'].get('git', 'unknown')}; steps: {', '.join(r['steps'])}. How each step measures: ",
        "[bench/README.md](../bench/README.md). It is a benchmark, not a test: the numbers depend on the machine and ",
        "on what else runs on it.",
    )


def _machine(r: dict[str, Any], add: Add) -> None:
    m, v = r["machine"], r["machine"]["versions"]
    load = "; after: ".join(" / ".join(f"{x:.2f}" for x in r[k]) for k in ("load_before", "load_after"))
    add("## Machine")
    add("")
    add(f"- nproc {m['nproc']} (os.cpu_count {m['cpu_count']}), {m.get('cpu_model', '?')}")
    add(f"- memory {m.get('mem_total_gib', '?')} GiB, {m.get('mem_available_gib', '?')} GiB available at the start")
    add(f"- load average (1/5/15 min) before: {load}")
    add(f"- Linux {m['kernel']}, Python {m['python']}, " + ", ".join(f"{k} {x}" for k, x in v.items()))
    add(f"- every Spark application: `spark.master local[2]`, `spark.driver.memory {r['driver_memory']}`")
    if s := r.get("server"):
        where = "on this machine (it shares the cores)" if is_local(s["server"]) else "across the network"
        add(f"- PostgreSQL {s['version']} at `{s['server']}`, {where}; a new database per approach")
        add(
            f"- compiled runs: `apply.threads: {r['threads']}`; a prepared `SELECT 1` takes {s['round_trip_ms']:.3f} ms"
        )
        add("- every approach starts after a `CHECKPOINT`")
        add("- server settings: " + ", ".join(f"`{k}` {x}" for k, x in s["settings"].items()))
    add("")


def _workloads(r: dict[str, Any], add: Add) -> None:
    add("## Workloads")
    add("")
    rows, notes = [], []
    for key, w in r["workloads"].items():
        asked = ", ".join(f"{k}={v}" for k, v in w.get("arguments", {}).items() if v is not None)
        txns = f"{w['transactions']:,} ({w['committed']:,} / {w['rolled_back']:,} / {w['left_open']:,})"
        profile = f"{w['profile']} ({asked})" if asked else w["profile"]
        rows.append([key, profile, txns, f"**{w['changes']:,}** ({ops(w['rows_per_op'])})", w["tables"], w["pairs"]])
        rows[-1] += [mib(w["bytes"]), f"{w['seconds']:.0f}"]
        busiest = "the ten busiest: " if w["tables"] > 10 else ""
        notes.append(f"- {key}, changes per table ({busiest}{ops(w['rows_per_table'])})")
        if key in ("narrow", "wide") and w["changes"] < 1_000_000:
            notes.append(f"- note: the {key} workload has fewer than the 1M changes the issues ask for")
    head = ["workload", "profile (seed 1)", "transactions (committed / rolled back / open)", "changes", "tables"]
    table(add, [*head, "pairs", "MiB", "generated in s"], rows, right=4)
    para(add, "\n".join(notes))


def _goal_rows(r: dict[str, Any]) -> Rows:
    rows: Rows = []
    for key, label, limit, base, base_label, goal, ratio in (
        (
            *("narrow", "engine (Delta)", "limit", "pertxn", "per-transaction Delta commits"),
            *(f.GOAL_SPEEDUP, f.GOAL_LIMIT_RATIO),
        ),
        (
            *("pg-compiled", "compiled (PostgreSQL)", "pg-limit", "pg-rowbyrow", "log-order row-by-row"),
            *(f.GOAL_SPEEDUP, f.GOAL_PG_LIMIT_RATIO),
        ),
        ("pg-compiled", "compiled (PostgreSQL)", "", "pg-pertxn", "per-transaction", f.GOAL_PG_PER_TRANSACTION, 0),
    ):
        if key not in r:
            continue
        one, many = r[key]["one"], r[key]["cycles"]
        if limit in r:
            work, e2e = f.limit_s(r[limit])
            got = f"{one['wall_s']:.1f} / {e2e:.1f} = **{one['wall_s'] / e2e:.2f}x** (both with Spark start); inside "
            got += (
                f"cycles / limit work {one['cycle_seconds'] / work:.2f}x; {cycles(many)}: {many['wall_s'] / e2e:.2f}x"
            )
            rows.append([f"{label} within {ratio:.1f}x of the calibrated limit", got])
            rows[-1].append(met(one["wall_s"] / e2e <= ratio))
        if base in r:
            total, other = f.linear(r[base], f.committed(r)), f.steady(r[base], f.committed(r))
            got = f"{total:,.0f} / {one['wall_s']:.1f} = **{total / one['wall_s']:,.1f}x** ({cycles(many)}: "
            got += f"{total / many['wall_s']:,.1f}x"
            steady_ok = True
            if key.startswith("pg") and not f.whole(r[base], f.committed(r)):
                got += f"; with the second-half rate: {other / one['wall_s']:,.1f}x"
                steady_ok = other / one["wall_s"] >= goal
            linear_ok = total / one["wall_s"] >= goal
            verdict = "**met by the linear extrapolation only**" if linear_ok and not steady_ok else met(linear_ok)
            rows.append([f"{label} at least {goal:g}x faster than {base_label}", got + ")", verdict])
    if "duckdb" in r:
        from bench.duckdb_bench import goal_row

        rows.append(goal_row(r))
    from bench.scaleout import goal_rows as scaleout_goals

    rows += scaleout_goals(r)
    if "small" in r:
        walls = [t["cycle_walls_s"][0] for t in r["small"]["tails"]]
        got = f"first small cycle **{walls[0]:.2f} s** (then {', '.join(f'{w:.2f}' for w in walls[1:]) or 'none'})"
        rows.append([f"a small cycle after the first in at most {f.GOAL_SMALL_CYCLE_S:g} s", got])
        rows[-1].append(met(walls[0] <= f.GOAL_SMALL_CYCLE_S))
    return rows + _memory_goal_rows(r)


def _memory_goal_rows(r: dict[str, Any]) -> Rows:
    rows: Rows = []
    if "wide" in r:
        wide, one = r["wide"]["one"], r["narrow"]["one"]
        narrow, runs = f.fastest_narrow(r)
        per_change = wide["wall_s"] / wide["rows_read"] / (narrow["wall_s"] / narrow["rows_read"])
        got = f"{wide['wall_s']:.1f} / {narrow['wall_s']:.1f} = **{wide['wall_s'] / narrow['wall_s']:.2f}x** (per "
        rows.append([f"the wide workload within {f.GOAL_WIDE_RATIO:g}x of the narrow one's time", got])
        rows[-1][-1] += f"change {per_change:.2f}x" + (f"; the fastest of {runs} narrow runs)" if runs > 1 else ")")
        rows[-1].append(met(wide["wall_s"] <= f.GOAL_WIDE_RATIO * narrow["wall_s"]))
        for label, run in (("wide", wide), ("narrow", one)):
            over, how = f.overhead_mib(r, run)
            budget = run["queue"]["budget_bytes"] / MIB
            got = (
                f"**{run['driver_peak_rss_mib']:,.0f} MiB** against {budget:,.0f} + {over:,.0f} = {budget + over:,.0f}"
            )
            rows.append([f"{label}: driver peak within the queue budget + the overhead ({how})", got])
            rows[-1].append(met(run["driver_peak_rss_mib"] <= budget + over))
    if "many-open" in r:
        i, cycle, one_s = f.commit_cycle(r)
        got = f"cycle {i} ({cycle['committed']:,} committed) {cycle['s']:.1f} s / {one_s:.1f} s = "
        rows.append([f"the committing cycle within {f.GOAL_COMMIT_RATIO:g}x of the same pairs in one cycle", got])
        rows[-1][-1] += f"**{cycle['s'] / one_s:.2f}x**"
        rows[-1].append(met(cycle["s"] <= f.GOAL_COMMIT_RATIO * one_s))
    if "run-length" in r:
        w, n, total = f.windows(r), r["run-length"]["window"], r["run-length"]["run"]["cycles"]
        for key, what, goal in (
            ("s", "seconds per cycle", f.GOAL_FLAT_TIME),
            ("rss", "driver peak", f.GOAL_FLAT_MEMORY),
        ):
            first, last = w[key]
            label = f"no growth in {total:,} cycles: median {what} of the last {n} within {goal:g}x of the first {n}"
            rows.append([label, f"{first:.3g} then {last:.3g}: **{last / first:.2f}x**", met(last <= goal * first)])
    return rows


def _goals(r: dict[str, Any], add: Add) -> None:
    if not (rows := _goal_rows(r)):
        return
    add("## Goals of the issues")
    add("")
    table(add, ["goal", "measured", ""], rows, right=99)


def _side_by_side(r: dict[str, Any], add: Add) -> None:
    for key, title, label, limit, baselines in (
        ("narrow", "Delta", "engine", "limit", (("per-transaction commits", "pertxn"),)),
        ("pg-compiled", "PostgreSQL", "compiled", "pg-limit", (("per-transaction", "pg-pertxn"),
                                                               ("log-order row-by-row", "pg-rowbyrow"))),
    ):  # fmt: skip
        if key not in r:
            continue
        n, committed, rows = r["workloads"]["narrow"]["changes"], f.committed(r), []
        for run in (r[key]["one"], r[key]["cycles"]):
            what = f"{run['limit_mib']:g} MiB limit" if run.get("limit_mib") else "no size limit"
            covers = f"`applier run` end to end; {run['cycle_seconds']:.1f} s inside cycles"
            rows.append(
                [f"{label}, {cycles(run)} ({what})", f"{run['wall_s']:.1f}", f"{n / run['wall_s']:,.0f}", covers]
            )
        if lim := r.get(limit):
            work, e2e = f.limit_s(lim)
            writes = f"merge {lim['merge_s']:.1f}" if "merge_s" in lim else f"COPY {lim['copy_s']:.1f} + apply "
            writes += "" if "merge_s" in lim else f"{lim['apply_s']:.1f}"
            covers = (
                f"Spark start {lim['startup_since_spawn_s']:.1f} + read and parse every image {lim['parse_s']:.1f} "
            )
            rows.append(["calibrated limit", f"{e2e:.1f}", f"{n / e2e:,.0f}", f"{covers}+ {writes} (work {work:.1f})"])
        for name, part in ((name, r[k]) for name, k in baselines if k in r):
            total = f.linear(part, committed)
            if f.whole(part, committed):
                covers = f"all {committed:,} committed transactions, one source transaction at a time"
                rows.append([f"{name} (measured)", f"{total:,.0f}", f"{n / total:,.0f}", covers])
                continue
            covers = f"{part['seconds']:.1f} s for the first {part['transactions']:,} committed transactions x "
            covers += f"{committed:,} / {part['transactions']:,}"
            if key == "pg-compiled":
                covers += f" (second-half rate: {f.steady(part, committed):,.0f} s)"
            rows.append([f"{name} (extrapolated)", f"{total:,.0f}", f"{n / total:,.0f}", covers])
        add(f"## Side by side: {title}")
        add("")
        table(add, ["approach", "wall s", "changes / s", "what the time covers"], rows, text=3)


def _runs(r: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every ``applier run`` of the results, labelled."""
    runs = [
        (f"{label}, {cycles(x)}", x)
        for key, label in (("narrow", "narrow"), ("wide", "wide"))
        if key in r
        for x in (r[key]["one"], r[key].get("cycles"))
        if x
    ]
    if m := r.get("many-open"):
        runs += [(f"many-open split, {cycles(m['split'])}", m["split"]), (f"many-open, {cycles(m['one'])}", m["one"])]
    if "run-length" in r:
        runs.append((f"run-length, {cycles(r['run-length']['run'])}", r["run-length"]["run"]))
    if "pg-compiled" in r:
        runs += [(f"PostgreSQL, {cycles(x)}", x) for x in (r["pg-compiled"]["one"], r["pg-compiled"]["cycles"])]
    return runs


def _applier_runs(r: dict[str, Any], add: Add) -> None:
    if not (runs := _runs(r)):
        return
    add("## Every `applier run`: time, memory and the queue (from `cycles.jsonl`)")
    add("")
    rows = []
    for label, x in runs:
        driver = f"{x['driver_start_rss_mib']:,.0f} / {x['driver_peak_rss_mib']:,.0f}"
        rows.append([label, f"{x['wall_s']:.1f}", f"{x['cycle_seconds']:.1f}", f"{x['rows_per_s']:,.0f}"])
        rows[-1] += [f"{x['peak_tree_mib']:,.0f}", driver]
    head = ["run", "wall s", "inside cycles s", "changes read / s", "process tree peak MiB", "driver start / peak MiB"]
    table(add, head, rows)
    para(
        add,
        "Queue memory in MiB (`queue` of each cycle's line): the budget, the peak held in a cycle, the most held at a ",
        "cycle's end and the bytes spooled to spill files, by kind (transactions / tables / compiled).",
    )
    rows = []
    for label, x in runs:
        q = x["queue"]
        held, spooled = (
            " / ".join(mib(q[k].get(kind, 0)) for kind in KINDS) for k in ("memory_bytes", "spooled_bytes")
        )
        rows.append([label, mib(q["budget_bytes"]), mib(q["peak_bytes"]), held, spooled, x["spilled"]])
    table(add, ["run", "budget", "peak", "held at a cycle's end", "spooled", "spill files created"], rows)
    shown = [(label, x) for label, x in runs if not label.startswith("run-length")]
    para(add, "Seconds per phase, summed over the cycles:")
    rows = [
        [k, *(f"{x['phases'].get(k, 0.0):.1f}" for _, x in shown)]
        for k in dict.fromkeys(k for _, x in shown for k in x["phases"])
    ]
    rows.append(
        ["outside cycles (start-up, rebuild, shutdown)", *(f"{x['wall_s'] - x['cycle_seconds']:.1f}" for _, x in shown)]
    )
    table(add, ["phase", *(label for label, _ in shown)], rows)
    for label, x in shown:
        if 1 < x["cycles"] <= 12:
            para(
                add, f"Cycles of {label} (MiB / s): ", ", ".join(f"{c['mib']:g} / {c['s']:.1f}" for c in x["per_cycle"])
            )


def _parts(r: dict[str, Any], add: Add) -> None:
    labels = {
        "limit": "calibrated limit (Delta)",
        "pertxn": "per-transaction Delta commits",
        "small": "small cycles",
        "pg-limit": "calibrated limit (PostgreSQL)",
        "pg-pertxn": "per-transaction (PostgreSQL)",
        "pg-rowbyrow": "log-order row-by-row",
    }
    if rows := [[label, f"{r[k]['process_peak_tree_mib']:,.0f}"] for k, label in labels.items() if k in r]:
        add("## Peak memory of the other steps")
        add("")
        table(
            add, ["process", "process tree peak MiB (summed VmRSS of the process and its children, every 0.2 s)"], rows
        )


def render(r: dict[str, Any]) -> str:
    """The Markdown report of the results ``r`` (as :meth:`bench.steps.Bench.run` returns them), ending in a newline."""
    from bench.duckdb_bench import section as duckdb_section
    from bench.report_details import SECTIONS  # their sections use this module's helpers
    from bench.scaleout import section as scaleout_section

    lines: list[str] = []
    for section in (_title, _machine, _workloads, _goals, _side_by_side, duckdb_section, scaleout_section,
                    _applier_runs, _parts, *SECTIONS):  # fmt: skip
        section(r, lines.append)
    return "\n".join(lines) + "\n"
