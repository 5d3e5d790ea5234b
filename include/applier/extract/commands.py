"""``applier subscribe`` and ``applier subscriptions``: tables added to running replication.

``subscribe`` records the subscription, then runs one bounded extraction,
which materializes it (unless another extractor holds the folder: that one
does it at its next batch). ``subscriptions`` lists them with the state the
Applier's checkpoint shows, and asks for a drop or a resume.
"""

from __future__ import annotations

import argparse
import logging

from applier.config import Config, load_config
from applier.config_source import MAX_CHUNK_ROWS
from applier.engine.checkpoint import CheckpointStore
from applier.errors import RunLockedError, UsageError
from applier.extract.subscriptions import Registry, Subscription, applier_state
from applier.intermediate.schema import SchemaError, check_table_name

log = logging.getLogger(__name__)


def _table(config: Config, table: str) -> str:
    try:
        check_table_name(table)
    except SchemaError as e:
        raise UsageError(f"--table {table}: {e}") from e
    if table in config.source.exclude:
        raise UsageError(f"--table {table} is in source.exclude: take it out first")
    return table


def _line(sub: Subscription, applied_commit_lsn: int) -> str:
    state = applier_state(sub, applied_commit_lsn)
    flags = " recovering" if sub.recovering else ""
    error = f"; error: {sub.error} (fix it, then --resume)" if sub.error else ""
    drop = f"; drop asked ({sub.drop})" if sub.drop and sub.state != "dropped" else ""
    return f"{sub.table}  {sub.mode}  {state}{flags}  {sub.copied_rows} rows copied  {sub.updated_at}{drop}{error}"


def _extract_now(config: Config) -> None:
    from applier.engine.api import configure_logging
    from applier.extract.run import extract

    configure_logging()
    try:
        summary = extract(config)
    except RunLockedError as e:
        print(f"another extractor holds the folder; it materializes the table at its next batch ({e})")
        return
    print(f"{summary.pairs} pairs written, {summary.transactions} transactions, {summary.rows} rows")


def subscribe(args: argparse.Namespace) -> int:
    """``applier subscribe --table T --mode M``: add a table to running replication, then materialize it."""
    config = load_config(args.config, args.overrides)
    table = _table(config, args.table)
    if args.chunk_rows is not None and not 1 <= args.chunk_rows <= MAX_CHUNK_ROWS:
        raise UsageError(f"--chunk-rows {args.chunk_rows}: use a whole number from 1 to {MAX_CHUNK_ROWS:,}")
    Registry(config.intermediate_dir).add(table, args.mode, args.chunk_rows)
    print(f"subscription {table} ({args.mode}) defined")
    if not args.no_extract:
        _extract_now(config)
    sub = Registry(config.intermediate_dir).load()[table]
    print(_line(sub, CheckpointStore(config.work_dir).load().applied_commit_lsn or 0))
    return 8 if sub.error else 0


def subscriptions(args: argparse.Namespace) -> int:
    """``applier subscriptions [--drop T [--purge] | --resume T]``: list, drop or resume subscriptions."""
    config = load_config(args.config, args.overrides)
    registry = Registry(config.intermediate_dir)
    if args.drop:
        table = _table(config, args.drop)
        if table in config.source.include:
            raise UsageError(f"--drop {table}: it is in source.include; take it out of the configuration instead")
        registry.ask(table, drop="purge" if args.purge else "keep")
        print(f"subscription {table}: drop asked ({'purge' if args.purge else 'keep'} its target rows)")
    elif args.resume:
        registry.ask(_table(config, args.resume), resume=True)
        print(f"subscription {args.resume}: resumes at the extractor's next batch")
    subs = registry.load()
    if not subs:
        print(f"no subscriptions in {config.intermediate_dir}")
        return 0
    applied = CheckpointStore(config.work_dir).load().applied_commit_lsn or 0
    for sub in subs.values():
        print(_line(sub, applied))
    return 0
