"""What each ``applier`` command does, between argument parsing and the library.

Each handler takes the parsed arguments, calls the library, prints the
result for a person, and returns the exit code.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from applier.config import load_config
from applier.engine.checkpoint import CheckpointStore
from applier.errors import UsageError
from applier.intermediate.pairs import MIB, list_pairs
from applier.intermediate.scan import scan_directory
from applier.planner import plan_backlog
from applier.preflight import check_folders, refused_pairs, tables_to_validate

if TYPE_CHECKING:
    from applier.engine.jvm_launch import LaunchedJvm
    from applier.generate import GenerateSummary

_err = Console(stderr=True)


@contextmanager
def _progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr (drawn only on a terminal) fed by ``(done, total)`` calls."""
    with Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_err,
        transient=True,
        disable=not _err.is_terminal,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _generate_sizing(args: argparse.Namespace) -> tuple[int | None, tuple[int, int] | None]:
    """``--tables`` and ``--columns`` of ``applier generate``, refused for profiles that size their own tables."""
    from applier.generate import SHAPE_PROFILES, parse_columns

    given = [f"--{name}" for name in ("tables", "columns") if getattr(args, name) is not None]
    shape = SHAPE_PROFILES.get(args.profile)
    refused = [option for option in given if shape is None or option[2:] not in shape.options]
    if refused:
        takers = ", ".join(name for name, p in SHAPE_PROFILES.items() if p.options)
        raise UsageError(f"{' and '.join(refused)} not allowed with --profile {args.profile}; only {takers} takes it")
    if args.tables is not None and args.tables < 1:
        raise UsageError(f"--tables {args.tables} must be at least 1")
    try:
        columns = None if args.columns is None else parse_columns(args.columns)
    except ValueError as e:
        raise UsageError(f"--columns: {e}") from None
    return args.tables, columns


def _print_generated(s: GenerateSummary) -> None:
    """The summary ``applier generate`` prints; a table set of more than a dozen shows its busiest tables."""
    print(
        f"wrote {s.pairs} pairs ({s.bytes / MIB:.2f} MiB) to {s.out_dir}: profile {s.profile}, seed {s.seed}, "
        f"{s.rows} rows in {s.transactions} transactions ({s.committed} committed, {s.rolled_back} rolled back, "
        f"{s.left_open} left open)"
    )
    if len(s.rows_per_table) <= 12:
        print("  rows per table: " + ", ".join(f"{t} {n}" for t, n in sorted(s.rows_per_table.items())))
    else:
        busiest = sorted(s.rows_per_table.items(), key=lambda item: (-item[1], item[0]))
        shown = ", ".join(f"{t} {n}" for t, n in busiest[:10])
        print(f"  rows per table ({len(busiest)} tables, the 10 busiest): {shown}, ...")
    print("  rows per op: " + ", ".join(f"{op} {n}" for op, n in sorted(s.rows_per_op.items())))
    print("  features: " + ", ".join(s.features))


def generate(args: argparse.Namespace) -> int:
    """``applier generate``: write a seeded workload."""
    from applier.generate import generate_workload, profile_descriptions

    profiles = profile_descriptions()
    if args.list_profiles:
        for name, description in profiles.items():
            print(f"{name}: {description}")
        return 0
    if args.profile not in profiles:
        raise UsageError(f"--profile {args.profile!r} is unknown; use one of: {', '.join(profiles)}")
    if args.transactions is not None and args.transactions < 1:
        raise UsageError(f"--transactions {args.transactions} must be at least 1")
    if args.file_size_mb is not None and args.file_size_mb <= 0:
        raise UsageError(f"--file-size-mb {args.file_size_mb} must be above 0")
    tables, columns = _generate_sizing(args)
    with _progress("generating transactions") as progress:
        summary = generate_workload(
            args.out,
            seed=args.seed,
            transactions=args.transactions,
            file_size_mb=args.file_size_mb,
            profile=args.profile,
            progress=progress,
            tables=tables,
            columns=columns,
        )
    _print_generated(summary)
    return 0


def check(args: argparse.Namespace) -> int:
    """``applier check``: read and check every pair of a directory."""
    if not args.directory.is_dir():
        raise UsageError(f"{args.directory} is not a directory")
    with _progress("checking pairs") as progress:
        s = scan_directory(args.directory, progress)
    print(
        f"{s.pairs} pairs ok (through {s.last_seq:012d}), {s.bytes / MIB:.2f} MiB, {s.rows} rows; "
        f"transactions: {s.committed} committed, {s.rolled_back} rolled back, {len(s.open_xids)} open"
    )
    for table, rows in sorted(s.rows_by_table.items()):
        print(f"  {table}: {rows} rows")
    return 0


def plan(args: argparse.Namespace) -> int:
    """``applier plan``: show the cycles the backlog makes."""
    config = load_config(args.config, args.overrides)
    check_folders(config, writing=False)
    applied = args.applied_seq if args.applied_seq is not None else CheckpointStore(config.work_dir).load().applied_seq
    listing = list_pairs(config.intermediate_dir, applied + 1)
    refused = next(refused_pairs(listing.pairs), None)  # a run applies the pairs before it, then stops there
    usable = [p for p in listing.pairs if refused is None or p.seq < refused.seq]
    cycles = plan_backlog(usable, applied, config.apply.cycle_limit_bytes)
    limit = config.apply.process_intermediate_size_per_job
    print(f"{len(cycles)} cycles after pair {applied} (limit {limit or 'none'} MiB per cycle)")
    for number, cycle in enumerate(cycles, start=1):
        print(f"  cycle {number}: pairs {cycle.seqs[0]}..{cycle.seqs[-1]} ({cycle.bytes / MIB:.2f} MiB)")
    gap = listing.gap_error()
    if refused is not None:
        print(
            f"  then REFUSED pair {refused.seq}: {refused.path}: {refused.detail} [{refused.code}]; a run stops there"
        )
    elif gap is not None:
        _err.print(f"[yellow]stops before a gap:[/] {gap.detail}")
    return 0


def run(args: argparse.Namespace) -> int:
    """``applier run``: apply cycles until caught up or the cycle limit."""
    jvm: LaunchedJvm | None = args.jvm  # launched as the process started (applier.cli, applier.run_ahead)
    try:
        config = load_config(args.config, args.overrides)
        if args.max_cycles is not None and args.max_cycles < 0:
            raise UsageError(f"--max-cycles {args.max_cycles} must be 0 (until caught up) or more")
        from applier.engine.api import configure_logging, run_applier

        configure_logging()
        summary = run_applier(config, max_cycles=args.max_cycles, run_key=args.run_key, jvm=jvm)
    finally:
        if jvm is not None:
            jvm.drop()  # the run ended before it needed Spark: the JVM stops, unheard
    cp = summary.checkpoint
    if not (summary.replay or summary.cycles_run):
        print(
            f"nothing to do: applied through pair {cp.applied_seq} (commit lsn {cp.applied_commit_lsn}), "
            "no pair after it"
        )
    elif summary.replay:
        outcomes = summary.table_outcomes
        print(
            f"replayed run {summary.run_key}: {summary.cycles_recorded} cycles, {outcomes.get('reapplied', 0)} table "
            f"changes reapplied, {outcomes.get('verified', 0)} verified; checkpoint unchanged at cycle {cp.cycle_id}"
        )
    else:
        print(
            f"{summary.cycles_run} cycles; applied through pair {cp.applied_seq} "
            f"(commit lsn {cp.applied_commit_lsn}), restart at pair {cp.restart_seq}"
        )
    if summary.pruned_pairs:
        from applier.engine.ledger import describe_seqs

        print(f"intermediate retention removed pairs {describe_seqs(summary.pruned_pairs)}")
    return 0


def extract(args: argparse.Namespace) -> int:
    """``applier extract``: the source's committed transactions into pairs (or ``--setup`` the source)."""
    import signal

    from applier.engine.api import configure_logging
    from applier.extract import extract as run_extract
    from applier.extract import setup_source

    config = load_config(args.config, args.overrides)
    if args.setup:
        report = setup_source(config)
        print(
            f"publication {config.source.publication} {'created' if report.publication_created else 'exists'}, "
            f"slot {config.source.slot} {'created' if report.slot_created else 'exists'}"
        )
        for warning in report.warnings:
            print(f"warning: {warning}")
        return 0
    if args.max_wal_mb is not None and args.max_wal_mb <= 0:
        raise UsageError(f"--max-wal-mb {args.max_wal_mb} must be above 0")
    configure_logging()
    stop: list[int] = []
    if args.follow:  # SIGTERM (a container stop) ends the loop after the batch in hand
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    summary = run_extract(config, follow=args.follow, max_wal_mb=args.max_wal_mb, should_stop=lambda: bool(stop))
    print(
        f"{summary.pairs} pairs written, {summary.transactions} transactions, {summary.rows} rows; "
        f"slot confirmed at {summary.confirmed_lsn >> 32:X}/{summary.confirmed_lsn & 0xFFFFFFFF:X}"
        + ("; held back by the unapplied backlog (extract.max_backlog_mb): ended early" if summary.held_back else "")
    )
    return 0


def runs(args: argparse.Namespace) -> int:
    """``applier runs``: the run ledger, one line per run key in start order."""
    from applier.engine.ledger import RunLedger, describe_seqs

    config = load_config(args.config, args.overrides)
    records = RunLedger(config.work_dir).records()
    if not records:
        print(f"no runs recorded in {config.work_dir / 'ledger'} (runs are recorded when given --run-key)")
        return 0
    rows = [("run key", "status", "mode", "cycles", "pairs", "started", "finished")]
    for r in records:
        pairs = r.pair_range
        rows.append(
            (
                r.run_key,
                r.status,
                r.mode,
                describe_seqs(c.cycle_id for c in r.cycles),
                describe_seqs(range(pairs[0], pairs[1] + 1)) if pairs else "none",
                _moment(r.started_at),
                _moment(r.finished_at),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    errors = {r.run_key: r.error for r in records if r.error}
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
        if row[0] in errors:
            print(f"    error: {errors[row[0]]}")
    return 0


def _moment(iso: str | None) -> str:
    """An ISO 8601 UTC moment as ``YYYY-MM-DD HH:MM:SS`` (``-`` for none)."""
    return iso[:19].replace("T", " ") if iso else "-"


def status(args: argparse.Namespace) -> int:
    """``applier status``: where the Applier stands, for people, as JSON (``--json``) or for Prometheus."""
    import json

    from applier.status_document import status_document
    from applier.status_output import prometheus_text, text_lines

    config = load_config(args.config, args.overrides)
    check_folders(config, writing=False)
    if args.json or args.prometheus:
        doc = status_document(config)
        print(json.dumps(doc, indent=1) if args.json else prometheus_text(doc), end="\n" if args.json else "")
        return 0
    print("\n".join(text_lines(status_document(config, source=False))))
    from applier.extract.monitor import source_status_lines

    for line in source_status_lines(config):  # with source.* only; an unreachable source is one line of them
        print(line)
    return 0


def exceptions(args: argparse.Namespace) -> int:
    """``applier exceptions list|show ID|resubmit ID|delete ID|--before DATE``: the target's exceptions store."""
    from applier.targets import open_target

    config = load_config(args.config, args.overrides)
    if args.action in ("show", "resubmit") and args.id is None:
        raise UsageError(f"exceptions {args.action}: give an exception id")
    if args.action == "delete" and (args.id is None) == (args.before is None):
        raise UsageError("exceptions delete: give an exception id or --before DATE (one of them)")
    target = open_target(config)
    if args.action == "resubmit":
        from applier.engine.resubmit import resubmit

        print(resubmit(config, target, args.id))
        return 0
    if args.action == "delete":
        print(f"deleted {target.delete_exceptions(args.id, args.before)} exceptions")
        return 0
    found = target.exceptions(args.id if args.action == "show" else None)
    if args.action == "show" and not found:
        raise UsageError(f"no exception {args.id} in configuration {config.configuration_name}")
    for e in found:
        print(
            f"{e['id']}: cycle {e['cycle_id']} transaction {e['xid']} (commit lsn {e['commit_lsn']}, pair "
            f"{e['pair_seq']}) table {e['table_name']}: {e['error_class']} {e['sqlstate'] or ''} [{e['action']}] "
            f"{e['changes']} changes, logged {_moment(e['logged_at'].isoformat())}"
            + (f", resubmitted {_moment(e['resubmitted_at'].isoformat())}" if e["resubmitted_at"] else "")
        )
        if args.action == "show":
            print(f"  error: {e['message']}")
            for c in e["changes_list"]:
                print(f"  {c['lsn']} {c['table_name']} {c['op']} before={c['before']} after={c['after']}")
    if not found:
        print(f"no exceptions for configuration {config.configuration_name}")
    return 0


def validate(args: argparse.Namespace) -> int:
    """``applier validate``: validate target tables; a failed expectation exits with code 5."""
    config = load_config(args.config, args.overrides)
    tables_to_validate(config, args.tables)  # an unknown table is refused before GX loads
    from applier.validate import validate_target

    report = validate_target(config, None, args.tables)  # Spark starts only for a table too large for memory
    if not report.tables:
        print(f"configuration {config.configuration_name}: no table to validate (nothing applied yet)")
    for name, table in report.tables.items():
        if table.missing:
            outcome = "not in the target (never written)" if table.success else "MISSING from the target"
        elif table.success:
            outcome = f"{len(table.expectations)} expectations passed"
        else:
            outcome = f"{len(table.failed)} of {len(table.expectations)} expectations FAILED"
        print(f"{name}: {outcome}")
        for failure in table.failed:
            print(f"  {failure.describe()}")
    print(f"results: {report.json_path}")
    print(f"data docs: {report.data_docs_path}")
    report.raise_for_failure()
    return 0


def advise(args: argparse.Namespace) -> int:
    """``applier advise``: queue-memory sizing by Informix ER's arithmetic, and the queue-memory chart."""
    from applier.advise import advise as advise_on
    from applier.advise.arithmetic import LAYOUTS

    config = load_config(args.config, args.overrides)  # no folder check: a missing folder is an empty backlog
    if args.sample_pairs is not None and args.sample_pairs < 1:
        raise UsageError(f"--sample-pairs {args.sample_pairs} must be at least 1")
    if args.chart_cycles < 1:
        raise UsageError(f"--chart-cycles {args.chart_cycles} must be at least 1")
    advice = advise_on(config, LAYOUTS[args.layout], args.sample_pairs, args.chart_cycles)
    print("\n".join(advice.lines))
    return 0
