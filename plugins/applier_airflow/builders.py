"""Pure builders behind the Airflow side: plain values in, plain values out.

Everything the operators decide (the run key, the ``--set`` overrides from
the trigger form, the spark-submit application arguments, the plan and run
figures pushed as XCom, the asset URI of a target table) is computed here, so
tests compare it exactly without Airflow, Spark or a metadata database. What
depends on the target type (a connection's settings, an asset URI) is asked of
the library's target dialects (:mod:`applier.targets.dialects`).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from applier.config import TargetConfig
from applier.engine.ledger import RunRecord
from applier.errors import PERMANENT_LINE
from applier.targets import dialects
from applier.targets.dialects import TargetConnection

DEFAULT_SCHEDULE = "*/5 * * * *"
NO_SCHEDULE = ("none", "manual")

# Trigger-form params that override a configuration key for one run.
PARAM_OVERRIDES = {
    "process_intermediate_size_per_job": "apply.process_intermediate_size_per_job",
    "buffer_size_for_split_records": "apply.buffer_size_for_split_records",
}
# Table states of a ledger cycle that changed the target: applied now, applied by
# the same cycle before a crash (skipped on its re-run), or re-applied by a replay.
# A replay's "verified" table already held the cycle and was not changed.
CHANGED_STATES = ("applied", "skipped", "reapplied")

# Exit codes of jobs/apply.py that a retry cannot fix: bad configuration, refused pair, damaged state file.
NOT_RETRIED = {2: "configuration error", 3: "refused intermediate file", 7: "damaged state file"}
# The exit code of jobs/apply.py when another run holds the configuration's run lock.
RUN_LOCKED = 6

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_EXIT_CODE = re.compile(r"Error code is: (\d+)")
_APPLIER_ERROR = re.compile(r"applier: error: (.+)")


def schedule_from_env(value: str | None, default: str = DEFAULT_SCHEDULE) -> str | None:
    """A DAG's schedule from its environment variable (``APPLIER_SCHEDULE``, ``APPLIER_EXTRACT_SCHEDULE``).

    Args:
        value: the variable's text; None or blank means the default.
        default: the DAG's default schedule.

    Returns:
        ``default`` (``*/5 * * * *`` unless given), None (triggered runs only) for ``none`` or
        ``manual``, otherwise the text as given (a cron expression or a preset
        such as ``@hourly``; Airflow checks it when it parses the DAG).
    """
    text = (value or "").strip()
    if not text:
        return default
    if text.lower() in NO_SCHEDULE:
        return None
    return text


def run_key(logical_date: dt.datetime | None, run_id: str) -> str:
    """The key a DAG run records its cycles under in the run ledger.

    A backfill re-runs a logical date, so the key comes from the logical date
    (UTC, to the second, microseconds only when present): the original run and
    its backfill share it. A run without a logical date falls back to its run id.

    Args:
        logical_date: the run's logical date, if it has one.
        run_id: the DAG run id.

    Returns:
        A file-name-safe key, e.g. ``20260101T000500Z`` or ``run_manual__2026-...``.
    """
    if logical_date is not None:
        moment = logical_date.astimezone(dt.UTC)
        fraction = f".{moment.microsecond:06d}" if moment.microsecond else ""
        return f"{moment:%Y%m%dT%H%M%S}{fraction}Z"
    return "run_" + _UNSAFE.sub("_", run_id).strip("_")


def _number(name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"param {name}: {value!r} is not a number")
    return repr(_whole(value))


def _whole(value: int | float) -> int | float:
    """``value``, as an int when it is a whole float (JSON's ``1e3`` and ``1000.0`` are 1000)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def overrides_from_params(params: Mapping[str, Any]) -> list[str]:
    """The ``--set key=value`` overrides the trigger-form params ask for.

    Args:
        params: the run's params; a missing or null param overrides nothing.

    Returns:
        ``key=value`` strings in a fixed order.

    Raises:
        ValueError: a param holds something other than a number (the form's
            schema refuses that before a run starts; this guards direct calls).
    """
    out: list[str] = []
    for param, key in PARAM_OVERRIDES.items():
        value = params.get(param)
        if value is not None:
            out.append(f"{key}={_number(param, value)}")
    return out


def max_cycles_from_params(params: Mapping[str, Any]) -> int | None:
    """The ``max_cycles`` param (None: the configuration's ``apply.max_cycles_per_run``)."""
    value = params.get("max_cycles")
    if value is None:
        return None
    whole = _whole(value) if isinstance(value, float) else value
    if isinstance(whole, bool) or not isinstance(whole, int) or whole < 0:
        raise ValueError(f"param max_cycles: {value!r} is not a whole number >= 0")
    return whole


def target_overrides(
    conn_type: str,
    extra: Mapping[str, Any],
    conn_id: str,
    *,
    host: str | None = None,
    port: int | None = None,
    login: str | None = None,
    database: str | None = None,
) -> list[str]:
    """The overrides a target connection carries, by the dialect of its type (:mod:`applier.targets.dialects`).

    - ``fs`` (Airflow's File (path) connection) with extra ``path``: the Delta
      tables under that folder.
    - ``postgres``: the PostgreSQL target at the connection's host, port, login
      and database (its *schema* field); extra ``schema_map`` (source schema ->
      target schema) maps schemas. The password is not part of the overrides:
      the hook hands it to libpq as ``PGPASSWORD``, so it never reaches a
      command line or a log.

    Args:
        conn_type: the connection's type.
        extra: its extra, as a mapping.
        conn_id: its id, named in errors.
        host, port, login, database: the connection's fields (``postgres``).

    Returns:
        ``["target.type=delta", "target.path=<path>"]``, or
        ``["target.type=postgres", "target.url=<conninfo>", "target.schema_map.<s>=<t>", ...]``.

    Raises:
        ValueError: the type is not supported, or a required field is missing.
    """
    conn = TargetConnection(conn_type, host=host, port=port, login=login, database=database, extra=extra)
    return dialects.connection_settings(conn, conn_id)


def application_args(config_path: str, overrides: Sequence[str], max_cycles: int | None, key: str) -> list[str]:
    """The arguments of ``jobs/apply.py`` under spark-submit.

    Args:
        config_path: the configuration file.
        overrides: ``key=value`` overrides, in order (later ones win).
        max_cycles: the cycle limit of this run, or None for the configuration's.
        key: the run key the job records its cycles under.

    Returns:
        ``--config F [--set K=V]... [--max-cycles N] --run-key KEY``.
    """
    args = ["--config", config_path]
    for override in overrides:
        args += ["--set", override]
    if max_cycles is not None:
        args += ["--max-cycles", str(max_cycles)]
    return [*args, "--run-key", key]


def spark_env(driver_python: str, python: str, path: str) -> dict[str, str]:
    """The environment spark-submit runs in: Pythons that have the ``applier`` package.

    Args:
        driver_python: the worker's own interpreter (absolute); the driver runs
            it (client mode), and its folder holds the ``spark-submit`` to run.
        python: the executors' interpreter (``PYSPARK_PYTHON`` when set, else
            the worker's own).
        path: the current ``PATH``.

    Returns:
        ``PYSPARK_DRIVER_PYTHON``, ``PYSPARK_PYTHON`` and ``PATH`` with the
        driver interpreter's folder first.
    """
    folder = str(Path(driver_python).parent)
    return {
        "PYSPARK_DRIVER_PYTHON": driver_python,
        "PYSPARK_PYTHON": python,
        "PATH": f"{folder}:{path}" if path else folder,
    }


def submit_failure(message: str) -> tuple[int | None, str | None]:
    """The job's exit code and its ``applier: error:`` line from a failed spark-submit's message.

    Args:
        message: the text of the provider's exception (it ends with the output tail).

    Returns:
        ``(exit code, the Applier's error message)``, each None when absent.
    """
    code = _EXIT_CODE.search(message)
    errors = _APPLIER_ERROR.findall(message)
    return (int(code.group(1)) if code else None, errors[-1].strip() if errors else None)


def submit_outcome(message: str) -> tuple[str, str]:
    """What a failed spark-submit of ``jobs/apply.py`` means for the apply task.

    Args:
        message: the text of the provider's exception (it ends with the output tail).

    Returns:
        ``(outcome, reason)``: ``skip`` when another run holds the
        configuration's run lock (exit code 6; this run changed nothing and the
        next scheduled run picks up the backlog), ``fail`` for what a retry
        cannot fix (:data:`NOT_RETRIED`, and a target error the job called
        permanent, :data:`PERMANENT_LINE`), otherwise ``retry`` with the message
        as it is (the DAG's retries decide).
    """
    code, error = submit_failure(message)
    if code == RUN_LOCKED:
        held = error or "another run is applying this configuration"
        return "skip", f"skipped (exit code {code}): {held}; the next scheduled run picks up the backlog"
    if code in NOT_RETRIED:
        return "fail", f"{NOT_RETRIED[code]} (exit code {code}): {error}"
    if code == 4 and PERMANENT_LINE in message:
        return "fail", f"permanent target error (exit code {code}): {error}"
    return "retry", message


def plan_summary(
    key: str,
    applied_seq: int,
    cycles: Sequence[Sequence[int]],
    cycle_bytes: Sequence[int],
    *,
    gap: str | None = None,
    replay_cycles: Sequence[int] = (),
) -> dict[str, Any]:
    """What a run will apply, as pushed to XCom by the plan task.

    Args:
        key: the run key.
        applied_seq: the last pair applied so far.
        cycles: the pair numbers of each planned cycle, in order.
        cycle_bytes: the bytes of each planned cycle.
        gap: the missing pair the listing stops at, if any.
        replay_cycles: the cycle ids a finished record of this run key holds
            (the run replays them instead of planning).

    Returns:
        A JSON-able summary; ``nothing_new`` says whether the run has nothing to do.
    """
    planned = [
        {"first_seq": seqs[0], "last_seq": seqs[-1], "pairs": len(seqs), "bytes": size}
        for seqs, size in zip(cycles, cycle_bytes, strict=True)
    ]
    return {
        "run_key": key,
        "applied_seq": applied_seq,
        "cycles": planned,
        "pairs": sum(c["pairs"] for c in planned),
        "bytes": sum(cycle_bytes),
        "gap": gap,
        "replay": bool(replay_cycles),
        "replay_cycles": list(replay_cycles),
        "nothing_new": not planned and not replay_cycles,
    }


def new_pairs_event(directory: str, applied_seq: int, seqs: Sequence[int]) -> dict[str, Any]:
    """What the new-pairs sensor reports: the complete pairs after ``applied_seq``."""
    return {
        "directory": directory,
        "applied_seq": applied_seq,
        "first_seq": seqs[0] if seqs else None,
        "last_seq": seqs[-1] if seqs else None,
        "pairs": len(seqs),
    }


def touched_tables(record: RunRecord) -> list[str]:
    """Every table a recorded run applied, re-applied or verified, sorted."""
    return sorted({t for c in record.cycles for t in c.tables} | {t for c in record.cycles for t in c.net_rows})


def changed_tables(record: RunRecord) -> list[str]:
    """The tables a recorded run changed (any state but ``verified`` in some cycle), sorted."""
    return sorted({t for c in record.cycles for t, state in c.tables.items() if state in CHANGED_STATES})


def run_figures(record: RunRecord, validation: Mapping[str, Any] | None) -> dict[str, Any]:
    """The figures of one run, for the task log and XCom.

    Args:
        record: the run's ledger record.
        validation: the validate task's result, or None when validation was skipped.

    Returns:
        A JSON-able summary: cycles, pairs, positions before and after, net
        rows per table and operation summed over the cycles, the changed
        tables, the validation result and the transactions error actions set
        aside, per action.
    """
    # One pass over the cycles, which a record read from the ledger streams from its file.
    net: dict[str, dict[str, int]] = {}
    cycle_ids: list[int] = []
    pairs, first_seq, last_seq = 0, None, None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    set_aside: dict[str, int] = {}
    for cycle in record.cycles:
        for table, ops in cycle.net_rows.items():
            into = net.setdefault(table, {})
            for op, n in ops.items():
                into[op] = into.get(op, 0) + n
        for action, n in cycle.set_aside.items():
            set_aside[action] = set_aside.get(action, 0) + n
        cycle_ids.append(cycle.cycle_id)
        if cycle.seqs:
            pairs += len(cycle.seqs)
            first_seq = min(cycle.seqs) if first_seq is None else min(first_seq, *cycle.seqs)
            last_seq = max(cycle.seqs) if last_seq is None else max(last_seq, *cycle.seqs)
        before = dict(cycle.before) if before is None else before
        after = cycle.after
    return {
        "run_key": record.run_key,
        "mode": record.mode,
        "status": record.status,
        "cycles": len(cycle_ids),
        "cycle_ids": cycle_ids,
        "pairs": pairs,
        "first_seq": first_seq,
        "last_seq": last_seq,
        "before": before,
        "after": dict(after) if after is not None else None,
        "net_rows": {t: dict(sorted(ops.items())) for t, ops in sorted(net.items())},
        "changed_tables": changed_tables(record),
        "validation": "skipped" if validation is None else ("passed" if validation.get("success") else "failed"),
        "set_aside": dict(sorted(set_aside.items())),
    }


def figures_lines(figures: Mapping[str, Any]) -> list[str]:
    """The run's figures as readable log lines, one per table after the first."""
    first, last = figures["first_seq"], figures["last_seq"]
    pairs = f"pairs {first}..{last}" if first is not None else "no pairs"
    lines = [
        f"run {figures['run_key']} ({figures['mode']}, {figures['status']}): {figures['cycles']} cycles, "
        f"{pairs}, validation {figures['validation']}"
    ]
    for table, ops in figures["net_rows"].items():
        counts = ", ".join(f"{op} {n}" for op, n in ops.items())
        lines.append(f"  {table}: {counts}")
    if set_aside := figures.get("set_aside"):
        each = ", ".join(f"{n} {action}" for action, n in set_aside.items())
        lines.append(f"  transactions set aside by error actions: {sum(set_aside.values())} ({each})")
    return lines


def asset_uri(target: TargetConfig, table: str) -> str:
    """The Airflow asset URI of one target table, by the dialect of its type (:mod:`applier.targets.dialects`).

    Args:
        target: the configuration's ``target.*``.
        table: ``schema.table`` (the source's name).

    Returns:
        ``file:///<target.path>/<schema>/<table>`` for a Delta table;
        ``postgres://<host>:<port>/<database>/<schema>/<table>`` for a
        PostgreSQL table (the PostgreSQL provider's form; the schema mapped by
        ``target.schema_map``, the password never included).

    Raises:
        ValueError: the target's settings are missing.
    """
    return dialects.asset_uri(target, table)


def asset_uris(target: TargetConfig, tables: Iterable[str]) -> dict[str, str]:
    """The asset URI of each table, keyed by table."""
    return {table: asset_uri(target, table) for table in tables}


def data_docs_url(base_url: str) -> str:
    """The Applier view's Data Docs index under Airflow's base URL (``[api] base_url``; ``/`` when unset)."""
    return (base_url or "/").rstrip("/") + "/applier/docs/index.html"


def unknown_conf_keys(conf: Mapping[str, Any], params: Mapping[str, Any]) -> str | None:
    """Why a run's conf is refused: a key that is not one of the DAG's params (None: every key is known).

    Airflow validates the params a DAG declares and passes any other conf key
    through unread, so ``{"max_cyclez": 1}`` would run with the default: all cycles.
    """
    unknown = sorted(set(conf) - set(params))
    if not unknown:
        return None
    keys = ", ".join(repr(k) for k in unknown)
    return f"conf key {keys} is not a param of this DAG (its params: {', '.join(sorted(params))})"
