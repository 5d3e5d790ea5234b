"""The report's sections of the ``source`` steps: extraction, pgbench's TPS, latency and materialization.

Sections of :func:`bench.report.render`; each is left out when its step did not run.
"""

from __future__ import annotations

from typing import Any

from bench.report import Add, para, table, yes

TRANSPORT_NOTE = (
    "*decoded in the server only*: `count(*)` over the peek function, nothing sent; *SQL function*: every message "
    "fetched through a psycopg 3 server-side cursor, as the extractor reads them; *decoder*: the same, handed to the "
    "project's decoder, which writes nothing; *advance*: the slot moved over the WAL, decoding it without output, as "
    "the extractor moves its slot after each pair. Peeks leave the slot where it was."
)


def _rate(n: float, s: float) -> str:
    return f"{n / s:,.0f}" if s > 0 else "-"


def _mib(m: dict[str, Any]) -> str:
    return f"{m['mib']:,.1f}" if "mib" in m else ""


def _extract(r: dict[str, Any], add: Add) -> None:
    if not (x := r.get("extract")):
        return
    load, ext, recv, transport = x["load"], x["extractor"], x["recvlogical"], x["transport"]
    server = transport["ways"]["pgoutput, decoded in the server only (count)"]
    changes, wal = server["changes"], x["wal_mib"]
    add("## Extraction from PostgreSQL: the extractor against `pg_recvlogical`")
    add("")
    para(
        add,
        f"A pgbench stream (`pgbench -i -s {x['scale']}`, then `pgbench -n -c 2 -j 2`: {load['transactions']:,} ",
        f"TPC-B-like transactions of three updates and an insert): **{changes:,} changes** in {wal:,.1f} MiB of WAL ",
        "(the server's, from the slots' creation to the load's end). Every consumer has its own pgoutput slot, ",
        "created before the load, and reads the same WAL up to the same position: `applier extract` as one bounded ",
        "batch writing pairs (fsynced, the slot advanced after each), `pg_recvlogical --start --endpos` writing the ",
        "slot's pgoutput stream (`proto_version=1`, the same publication) to a file. Each runs in a fresh process; ",
        "*changes* are the rows the stream holds (counted in the server).",
    )
    rows = []
    for label, run, n in (("`applier extract` (pairs)", ext, ext["rows"]), ("`pg_recvlogical` (file)", recv, changes)):
        s = run["wall_s"]
        rows.append(
            [label, f"{s:.1f}", f"{n:,}", f"**{_rate(n, s)}**", f"{wal / s:,.1f}", f"{run['written_mib']:,.1f}"]
        )
        rows[-1] += [f"{run['written_mib'] / s:,.1f}", f"{run['peak_tree_mib']:,.0f}"]
    head = ["consumer", "wall s", "changes", "changes / s", "WAL MiB / s", "written MiB", "written MiB / s"]
    table(add, [*head, "process tree peak MiB"], rows)
    ratio = ext["wall_s"] / recv["wall_s"] if recv["wall_s"] else 0.0
    para(
        add,
        f"The extractor takes {ratio:.1f}x `pg_recvlogical`'s time; it wrote {ext['rows']:,} rows in ",
        f"{ext['transactions']:,} transactions and {ext['pairs']} pairs; the rows are the stream's changes: ",
        f"{yes(ext['rows'] == changes)}.",
    )
    para(add, "**Where the time goes**, over the same WAL, in one fresh process (part `extract-transport`):")
    rows = [
        [label, f"{m['s']:.2f}", _rate(changes, m["s"]), f"{m['messages']:,}" if m["messages"] else "", _mib(m)]
        for label, m in transport["ways"].items()
    ]
    table(add, ["reading", "s", "changes / s", "messages", "MiB sent"], rows, text=99)
    para(add, TRANSPORT_NOTE, f" Its process tree peaked at {transport['process_peak_tree_mib']:,.0f} MiB.")


def _tps(r: dict[str, Any], add: Add) -> None:
    if not (x := r.get("pgbench-tps")):
        return
    ext = x["extractor"]
    add("## pgbench with and without the extractor")
    add("")
    para(
        add,
        f"`pgbench -T {x['seconds']} -c {x['clients']} -j 2` (TPC-B-like, scale {x['scale']}) on one database, first ",
        "alone, then with `applier extract --follow` reading it throughout (started before, stopped by SIGTERM after; ",
        "both on this machine's cores with the server). Latency percentiles from pgbench's per-transaction log.",
    )
    rows = []
    for label, run in (("without the extractor", x["without"]), ("with `applier extract --follow`", x["with"])):
        rows.append([label, f"**{run['tps']:,.0f}**", f"{run['latency_ms']:.2f}", f"{run['transactions']:,}"])
        rows[-1] += [f"{run.get(k, 0.0):.2f}" for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")]
    table(add, ["run", "tps", "latency avg ms", "transactions", "p50 ms", "p95 ms", "p99 ms", "max ms"], rows)
    w, o = x["with"], x["without"]
    para(
        add,
        f"With the extractor: **{w['tps'] / o['tps']:.2f}x** the TPS, {w['latency_ms'] / o['latency_ms']:.2f}x the ",
        f"average latency. The extractor wrote {ext['rows']:,} rows in {ext['pairs']} pairs (pgbench changed about ",
        f"{w['transactions'] * 4:,} rows), used {ext['cpu_s']:.1f} ",
        f"s of CPU (its decoding in the server is the server's), peaked at {ext['peak_tree_mib']:,.0f} MiB, and ended ",
        f"{ext['stop_s']:.1f} s after SIGTERM (the batch in hand, then the pending pair). At pgbench's end its slot's ",
        f"confirmed position was {ext['behind_mib']:,.1f} MiB behind the WAL end: a pair confirms it when it closes ",
        "(`extract.max_pair_mb`, `extract.max_pair_seconds`).",
    )


def _latency(r: dict[str, Any], add: Add) -> None:
    if not (x := r.get("latency")):
        return
    s, ticks = x["schedule_s"], x["ticks"]
    busy = [t["visible_s"] for t in ticks if t["rows"]]
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    add(f"## Commit to target visibility at a {s:g} s schedule")
    add("")
    para(
        add,
        f"A light load (pgbench, one client at {x['rate']} transactions/s, TPC-B-like, each also inserting a marker ",
        "row stamped with `clock_timestamp()` just before its commit) ran for ",
        f"{len(ticks)} ticks; every {s:g} s one bounded `applier extract` and then one `applier run` ({x['target']} ",
        "target), each a fresh process. A marker is visible when the run's cycle has committed (the time its ",
        "`cycles.jsonl` line was written); its latency is that time less its stamp. The load ends with the last tick.",
    )
    para(
        add,
        "With a schedule of S seconds a change waits on average S/2 for the next tick, then the extract and the ",
        f"apply: expected latency about S/2 + extract + apply time, here {s / 2:.0f} + {mean_busy:.1f} = ",
        f"{s / 2 + mean_busy:.1f} s (the ticks' mean time to visibility), and at most about S + that.",
    )
    rows = []
    for t in ticks:
        rows.append([t["tick"], f"{t['at_s']:.0f}", f"{t['extract_s']:.1f}", f"{t['apply_s']:.1f}"])
        rows[-1] += [f"{t['visible_s']:.1f}", f"{t['rows']:,}"]
        rows[-1] += [f"{t[k]:.1f}" if k in t else "-" for k in ("p50_s", "p95_s", "max_s")]
        rows[-1] += [f"{t['extract_peak_mib']:,.0f}", f"{t['apply_peak_mib']:,.0f}"]
    head = ["tick", "at s", "extract s", "run s", "visible after s", "markers", "p50 s", "p95 s", "max s"]
    table(add, [*head, "extract peak MiB", "run peak MiB"], rows)
    late = [t["tick"] for t in ticks if t["at_s"] > t["tick"] * s + 1]
    late_text = (
        f" Tick{'s' if len(late) > 1 else ''} {', '.join(map(str, late))} started late: the tick before outlasted the "
        "schedule, so the schedule was in effect longer than S there."
        if late
        else ""
    )
    para(
        add,
        f"**Latency over all {x['visible']:,} markers: p50 {x.get('p50_s', 0):.1f} s, p95 {x.get('p95_s', 0):.1f} s, ",
        f"max {x.get('max_s', 0):.1f} s** (mean {x['mean_s']:.1f} s). Every committed marker ({x['markers']:,}) ",
        f"reached the target: {yes(x['visible'] == x['markers'])}.{late_text}",
    )


def _materialize(r: dict[str, Any], add: Add) -> None:
    if not (x := r.get("materialize")):
        return
    targets = x["targets"]
    add(f"## Materializing a {x['rows']:,}-row table")
    add("")
    writer = (
        f"while pgbench updated random rows of it at {x['writer_tps']}/s (the writer ran during the copy only)"
        if x["writer_tps"]
        else "with no writer on it"
    )
    para(
        add,
        f"Each mode on a database of its own: `bench_items` ({x['rows']:,} rows, six columns) beside a replicated ",
        "table whose slot has already moved; `applier subscribe` (a fresh process) records the subscription and ",
        f"runs one bounded extraction that writes the copy into pairs, {writer}; incremental and nonatomic with ",
        f"`--chunk-rows {x['chunk_rows']:,}`. A bounded `applier extract` then takes the changes after the copy, and ",
        f"`applier run` applies the pairs to each target ({', '.join(targets)}) on a new target. *Equal*: the ",
        "target's row count and sum of `qty` (each update adds 1) are the source's; *state*: the subscription's, ",
        "read off that Applier's checkpoint.",
    )
    rows = []
    for mode, m in x["runs"].items():
        c = m["copy"]
        rows.append([mode, f"**{c['wall_s']:.1f}**", f"{c['copied_rows']:,}", _rate(c["copied_rows"], c["wall_s"])])
        rows[-1] += [f"{c['written_mib']:,.1f}", f"{c['peak_tree_mib']:,.0f}", f"{m['catch_up']['wall_s']:.1f}"]
        for kind in targets:
            run = m["applies"][kind]
            rows[-1] += [f"**{run['wall_s']:.1f}**", f"{run['peak_tree_mib']:,.0f}", run["state"], yes(run["agrees"])]
    head = ["mode", "copy s", "rows copied", "rows / s", "pairs MiB", "copy peak MiB", "catch-up extract s"]
    for kind in targets:
        head += [f"{kind} apply s", f"{kind} peak MiB", f"{kind} state", f"{kind} equal"]
    table(add, head, rows)
    para(
        add,
        "*copy s*: `applier subscribe` end to end (start, the marker, the copy read and written into fsynced pairs); ",
        "*apply s*: `applier run` end to end, Spark's start included; peaks are process trees (Spark's JVM included). ",
        "A nonatomic copy leaves out a chunk's rows that a change touched between its watermarks (the change carries ",
        "them), so it may count fewer rows than the table holds.",
    )


SECTIONS = (_extract, _tps, _latency, _materialize)
