"""The ``applier`` command line.

Exit codes: 0 success (including nothing to do), 2 usage or configuration
error, 3 refused intermediate file, 4 target or apply error, 5 a target table
failed validation, 6 another run holds the configuration's run lock, 7 a
state file (checkpoint, intent, run ledger) is damaged, 8 the source cannot
be extracted as it stands, 1 an unexpected error (a bug; its traceback goes to a
file, see :mod:`applier.exits`). Errors are one line on stderr; long work shows
progress on stderr when it is a terminal. Output piped into a program that stops
reading ends quietly with exit code 0.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from applier.exits import flush_stdout, run_command

EXIT_CODES_HELP = """exit codes:
  0  success, including nothing to do
  2  usage or configuration error
  3  refused intermediate file (the message names the pair)
  4  target or apply error
  5  a target table failed validation (the message names the table and the expectation)
  6  another run of the configuration holds its run lock (the message names the holder); nothing was changed
  7  a state file (checkpoint, intent, run ledger) is damaged (the message names it and what to do)
  8  the source cannot be extracted as it stands (the message names the table, column and value, or the setting)
  1  an unexpected error, a bug (the message names the file its traceback was written to)"""


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="the Applier's YAML configuration file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one configuration key (repeatable), e.g. apply.max_cycles_per_run=3",
    )


def _command(commands: Any, name: str, summary: str) -> argparse.ArgumentParser:
    """One sub-command, with its summary and the exit codes in its --help."""
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=summary,
        description=summary,
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="applier",
        description="Applies change-data-capture intermediate files to a target in apply cycles.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = _command(commands, "generate", "write a seeded, realistic OLTP change stream as intermediate files")
    gen.add_argument("--out", type=Path, required=True, help="directory to write pairs into (created if missing)")
    gen.add_argument("--seed", type=int, default=1, help="random seed; the same seed writes the same files")
    gen.add_argument("--transactions", type=int, help="number of transactions (default: the profile's)")
    gen.add_argument("--file-size-mb", type=float, help="rotate to a new pair at this size in MiB")
    gen.add_argument("--profile", default="demo", help="workload profile (default: demo); see --list-profiles")
    gen.add_argument("--list-profiles", action="store_true", help="list the profiles and exit")
    gen.add_argument("--tables", type=int, metavar="N", help="number of tables (profile wide only; default 300)")
    gen.add_argument(
        "--columns", metavar="MIN-MAX", help="fewest and most columns of a table (profile wide only; default 9-41)"
    )

    check = _command(
        commands, "check", "read and check every complete pair of an intermediate directory against the spec"
    )
    check.add_argument("directory", type=Path, help="the intermediate directory")

    plan = _command(commands, "plan", "show the apply cycles the available pairs make under the configured size limit")
    _add_config_args(plan)
    plan.add_argument("--applied-seq", type=int, help="plan after this pair (default: the checkpoint's)")

    run = _command(commands, "run", "one Applier run: apply cycles until caught up or the cycle limit")
    _add_config_args(run)
    run.add_argument("--max-cycles", type=int, help="cycles for this run (default: apply.max_cycles_per_run)")
    run.add_argument(
        "--run-key",
        help="record the run's cycles in the run ledger under this key; a key whose run finished is replayed "
        "(backfill recovery, see README 'Recovery')",
    )

    extract = _command(
        commands, "extract", "read the PostgreSQL source's logical replication slot into intermediate-file pairs"
    )
    _add_config_args(extract)
    extract.add_argument(
        "--setup",
        action="store_true",
        help="check wal_level, free slots and the REPLICATION right; create the publication and slot",
    )
    extract.add_argument("--follow", action="store_true", help="keep extracting as the source commits (SIGTERM stops)")
    extract.add_argument(
        "--max-wal-mb", type=float, metavar="N", help="a batch reads at most N MiB of WAL (default: up to its end)"
    )

    subscribe = _command(
        commands, "subscribe", "add a table to running replication and materialize it (atomic, incremental, nonatomic)"
    )
    _add_config_args(subscribe)
    subscribe.add_argument("--table", required=True, metavar="SCHEMA.TABLE", help="the source table")
    subscribe.add_argument(
        "--mode",
        choices=("atomic", "incremental", "nonatomic"),
        default="atomic",
        help="atomic: one consistent copy in one target transaction (default); incremental: the same copy in "
        "chunks of materialize.chunk_rows; nonatomic: no lock, chunks between watermarks, autocorrected",
    )
    subscribe.add_argument(
        "--chunk-rows", type=int, metavar="N", help="rows per chunk for this table (default: materialize.chunk_rows)"
    )
    subscribe.add_argument(
        "--no-extract", action="store_true", help="only record it: a running extractor materializes it"
    )
    subs = _command(commands, "subscriptions", "list subscriptions and their states; drop or resume one")
    _add_config_args(subs)
    which = subs.add_mutually_exclusive_group()
    which.add_argument("--drop", metavar="SCHEMA.TABLE", help="leave the table's changes out from now on")
    which.add_argument("--resume", metavar="SCHEMA.TABLE", help="retry a recovering subscription once fixed")
    subs.add_argument("--purge", action="store_true", help="with --drop: truncate the table's target rows too")

    runs = _command(commands, "runs", "list the run ledger: each run key's status, mode, cycles and pairs")
    _add_config_args(runs)

    status = _command(
        commands,
        "status",
        "positions, lag, backlog and refused pairs, the run in progress, the last error, open transactions, "
        "spill files, the last cycle",
    )
    _add_config_args(status)
    output = status.add_mutually_exclusive_group()
    output.add_argument(
        "--json", action="store_true", help="print every fact as one JSON object (README lists its fields)"
    )
    output.add_argument(
        "--prometheus", action="store_true", help="print the figures in Prometheus' text exposition format"
    )

    validate = _command(
        commands, "validate", "validate target tables with Great Expectations against their definitions and row counts"
    )
    _add_config_args(validate)
    validate.add_argument(
        "--table",
        dest="tables",
        action="append",
        metavar="SCHEMA.TABLE",
        help="validate this table (repeatable; default: every table of the checkpoint)",
    )

    exceptions = _command(
        commands,
        "exceptions",
        "list, show, resubmit (once the cause is fixed) or delete the transactions error actions set aside",
    )
    _add_config_args(exceptions)
    exceptions.add_argument("action", choices=("list", "show", "resubmit", "delete"), help="what to do")
    exceptions.add_argument("id", nargs="?", type=int, help="the exception (show, resubmit, delete)")
    exceptions.add_argument("--before", metavar="DATE", help="delete: every exception logged before this ISO date")

    advise = _command(
        commands,
        "advise",
        "size the queue memory by Informix ER's arithmetic from the backlog's pairs, with its reasoning, "
        "and draw the queue-memory chart of the recent cycles",
    )
    _add_config_args(advise)
    advise.add_argument(
        "--sample-pairs", type=int, metavar="N", help="read only the backlog's first N pairs (default: all of them)"
    )
    advise.add_argument(
        "--layout",
        type=int,
        choices=(64, 32),
        default=64,
        help="ER layout of the arithmetic: 64 (default; 60-byte row header, 4-byte hash, 292-byte transaction "
        "header) or 32 (52, 4, 258)",
    )
    advise.add_argument(
        "--chart-cycles", type=int, default=200, metavar="N", help="cycles the chart draws, the latest (default 200)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``applier`` command and return its exit code."""
    try:
        args = _build_parser().parse_args(argv)
    except SystemExit:  # --help, --version or a usage error: argparse printed and exits
        flush_stdout()
        raise
    if args.command == "run":
        from applier.run_ahead import launch_for

        args.jvm = launch_for(args)  # first: the JVM starts while the imports below load
        from applier.engine.driver_memory import choose_system_pool

        choose_system_pool()  # before anything loads pyarrow
    from applier import commands  # deferred: keeps --help fast

    handlers = {
        "generate": commands.generate,
        "check": commands.check,
        "plan": commands.plan,
        "run": commands.run,
        "runs": commands.runs,
        "extract": commands.extract,
        "status": commands.status,
        "validate": commands.validate,
        "advise": commands.advise,
        "exceptions": commands.exceptions,
    }
    if args.command in ("subscribe", "subscriptions"):
        from applier.extract import commands as extract_commands

        handlers[args.command] = getattr(extract_commands, args.command)
    return run_command(handlers[args.command], args, args.command)


def entry() -> NoReturn:
    """The ``applier`` command: :func:`main`, then this process's exit without the collector's last passes.

    At the interpreter's teardown the cyclic collector went over every object
    a run leaves tracked (some 95,000: pyarrow, pandas, pyspark and what its
    cycles made), then over them again as each module was cleared: 0.15 s of
    a one-cycle run's end. Frozen first (``gc.freeze``), they are skipped;
    everything else happens as before: exit handlers, streams flushed, objects
    freed as their last reference goes. Not in :func:`main`, which a caller may
    run in a process that goes on.
    """
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
