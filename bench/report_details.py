"""The per-step details of the benchmark's report: the figures behind its summary tables.

Sections of :func:`bench.report.render`, after the summary: the wide, many-open
and run-length steps, and the details of the engine runs, limits and baselines.
"""

from __future__ import annotations

import json
from typing import Any

from bench import figures as f
from bench.figures import MIB
from bench.report import Add, cycles, ops, para, table, yes


def _limits(r: dict[str, Any], add: Add) -> None:
    for key, title in (("limit", "Delta"), ("pg-limit", "PostgreSQL")):
        if not (lim := r.get(key)):
            continue
        text = f"**Calibrated limit ({title}).** {lim['dat_rows']:,} rows, {lim['images']:,} images"
        if lim.get("parse_one_pass_s") is not None:
            text += f"; the same parse in one pass, second with the JVM warm: {lim['parse_one_pass_s']:.1f} s"
        if key == "pg-limit":
            text += (
                f"; the final rows read before timing in {lim['read_final_s']:.1f} s; commit {lim['commit_s']:.2f} s"
            )
        para(add, text, ".")
        written = lim.get("merge_per_table") or lim["per_table"]
        rows = []
        for name, s in lim["parse_per_table_s"].items():
            w = written.get(name, {"rows": 0, "seconds": 0.0, "encode_s": 0.0, "copy_s": 0.0, "apply_s": 0.0})
            out = (
                [f"{w['seconds']:.2f}"]
                if key == "limit"
                else [f"{w['encode_s'] + w['copy_s']:.2f}", f"{w['apply_s']:.2f}"]
            )
            rows.append([name, f"{s:.1f}", f"{w['rows']:,}", *out])
        out_head = ["merge s"] if key == "limit" else ["COPY s (with encoding)", "apply s"]
        table(add, ["table", "parse s", "final rows", *out_head], rows)


def _baselines(r: dict[str, Any], add: Add) -> None:
    rows = []
    for key, label in (
        ("pertxn", "per-transaction Delta commits"),
        ("pg-pertxn", "per-transaction (PostgreSQL)"),
        ("pg-rowbyrow", "log-order row-by-row (PostgreSQL)"),
    ):
        if p := r.get(key):
            unit = p["statements"] if key == "pg-rowbyrow" else p["commits"]
            rows.append([label, f"{p['transactions']:,}", f"{p['rows']:,}", f"{p['load_s']:.1f}", f"{p['commits']:,}"])
            rows[-1] += [f"{p[k]:,}" if k in p else "" for k in ("copies", "statements")] + [f"{p['seconds']:.1f}"]
            rows[-1] += [f"{p['seconds'] / max(unit, 1) * 1000:.2f}", f"{p['prepare_s']:.1f}"]
            rows[-1].append(f"{p.get('delta_s', p.get('database_s', 0.0)):.1f}")
    if not rows:
        return
    para(
        add,
        "**Baselines.** Time per unit: per commit, or per statement for row-by-row; *preparing*: typing the images, ",
        "compiling and encoding; *writing*: in delta-rs or in the database.",
    )
    head = ["baseline", "transactions", "changes", "read before timing s", "commits", "COPYs", "statements"]
    table(add, [*head, "s", "ms per unit", "preparing s", "writing s"], rows)
    if {"pg-pertxn", "pg-rowbyrow"} & set(r):
        _pg_basis(r, add)


def _pg_basis(r: dict[str, Any], add: Add) -> None:
    """How the PostgreSQL baselines were extrapolated, and whether they leave the compiled run's rows."""
    n, checks = f.committed(r), r.get("pg-baselines", {})
    matches = checks.get("match_compiled", {})
    versus = "; ".join(
        f"{label} and the one-cycle compiled apply leave the same rows: {yes(matches[key])}"
        for key, label in (("pg-pertxn", "per-transaction"), ("pg-rowbyrow", "row-by-row"))
        if key in matches
    )
    agree = f"Both baselines leave the same rows (count and digest) in every table: {yes(checks.get('agree'))}"
    parts = [(label, r[k]) for k, label in (("pg-pertxn", "per-transaction"), ("pg-rowbyrow", "row-by-row")) if k in r]
    if all(f.whole(p, n) for _, p in parts):
        para(
            add,
            f"The baselines applied all {n:,} committed transactions, so nothing is extrapolated. {agree}; {versus}.",
        )
        return
    halves = "; ".join(
        f"{label}: first {p['half_transactions']:,} transactions ({p['half_rows']:,} changes) {p['half_s']:.1f} s, "
        f"next {p['transactions'] - p['half_transactions']:,} ({p['rows'] - p['half_rows']:,} changes) "
        f"{p['seconds'] - p['half_s']:.1f} s"
        for label, p in parts
    )
    para(
        add,
        f"A baseline that applied a prefix is extrapolated linearly to all {n:,} committed transactions, and also by ",
        "counting the prefix's first half (with the initial loads) once and extrapolating its second half's rate ",
        f"({halves}); a goal is met when both estimates meet it. {agree}",
        f"; {versus}." if versus else ".",
    )


def _details(r: dict[str, Any], add: Add) -> None:
    if not {"narrow", "pg-compiled", "limit", "pg-limit", "pertxn", "pg-pertxn", "pg-rowbyrow", "small"} & set(r):
        return
    add("## Details")
    add("")
    for key, label in (("narrow", "engine"), ("pg-compiled", "compiled")):
        if c := r.get(key):
            one, digest = c["one"], " (count and digest)" if key == "pg-compiled" else ""
            para(
                add,
                f"Net rows written by the one-cycle {label} run: {ops(one['net_rows'])}; {one['committed']:,} ",
                f"transactions committed, {one['rolled_back']:,} rolled back. Both {label} runs leave the same rows",
                f"{digest} in every table: {yes(c['agree'])}.",
            )
            if not c["agree"]:
                para(add, "```\n" + json.dumps(c["rows"], indent=1) + "\n```")
    for run in (r["pg-compiled"]["one"], r["pg-compiled"]["cycles"]) if "pg-compiled" in r else ():
        shown = "; ".join(
            f"cycle {i}: " + (" | ".join(", ".join(b) for b in batches) or "none")
            for i, batches in enumerate(run["load_batches"], 1)
        )
        para(add, f"Load batches of the PostgreSQL {cycles(run)} run: {shown or 'none'}.")
    if small := r.get("small"):
        t = small["tails"]
        text = f"**Small cycles.** The bulk run took {small['bulk']['call_s']:.1f} s after a Spark start of "
        text += f"{small['spark_startup_s']:.1f} s; then {len(t)} pairs of {t[0]['transactions']} transactions "
        text += f"({t[0]['changes']} changes), each applied by a new run in the same session"
        if "bulk_agrees" in small:
            text += "; the bulk left the one-cycle run's rows in the tables the pairs leave alone: "
            text += yes(small["bulk_agrees"])
        para(add, text, ".")
        rows = [
            [
                i,
                f"{x['cycle_walls_s'][0]:.2f}",
                ", ".join(f"{k} {v:.1f}" for k, v in x["cycle_phases"][0].items()),
                f"{x['call_s']:.2f}",
                f"{x['before_first_cycle_s']:.2f}",
            ]
            for i, x in enumerate(t, 1)
        ]
        table(add, ["small cycle", "cycle s", "phases s", "whole run s", "before the cycle s"], rows)
    _limits(r, add)
    _baselines(r, add)


def _memory(r: dict[str, Any], add: Add) -> None:
    if not {"wide", "many-open", "run-length"} & set(r):
        return
    add("## Wide schemas, open transactions and long runs")
    add("")
    if "wide" in r:
        rows = []
        for key, run in (("narrow", r["narrow"]["one"]), ("wide", r["wide"]["one"])):
            per = run["wall_s"] / max(run["rows_read"], 1) * 1e6
            rows.append(
                [key, r["workloads"][key]["tables"], f"{run['rows_read']:,}", f"{run['wall_s']:.1f}", f"{per:.1f}"]
            )
        table(add, ["workload", "tables", "changes read", "wall s", "µs per change"], rows)
    if m := r.get("many-open"):
        i, cycle, one_s = f.commit_cycle(r)
        split, one = m["split"], m["one"]
        para(
            add,
            f"**Many open transactions.** With a queue of {split['queue']['budget_bytes'] / MIB:g} MiB, the split ",
            f"run ({cycles(split)}) committed {cycle['committed']:,} transactions in cycle {i}, in {cycle['s']:.1f} ",
            f"s, its queue holding at most {cycle['queue_peak_mib']:g} MiB; the same pairs in one cycle took ",
            f"{one_s:.1f} s. Driver peaks: split {split['driver_peak_rss_mib']:,.0f} MiB, one cycle ",
            f"{one['driver_peak_rss_mib']:,.0f} MiB. Both runs leave the same row count in every table: ",
            f"{yes(m['agree'])}.",
        )
        para(add, f"![Queue memory of the split many-open run, drawn by applier advise]({m['chart']})")
    if rl := r.get("run-length"):
        w, n, run, ledger = f.windows(r), rl["window"], rl["run"], sum(rl["ledger"].values())
        para(
            add,
            f"**Run length.** {run['cycles']:,} one-pair cycles in one `applier run --run-key` ",
            f"({run['wall_s']:.0f} s): ",
            f"the first {n} took {w['s'][0]:.3f} s per cycle (median), the last {n} {w['s'][1]:.3f} s; the driver's ",
            f"peak was {w['rss'][0]:.0f} then {w['rss'][1]:.0f} MiB (medians). The run ledger holds ",
            f"{len(rl['ledger'])} files, {ledger / 1024:,.0f} KiB ({ledger / run['cycles']:,.0f} bytes per cycle).",
        )


SECTIONS = (_memory, _details)
