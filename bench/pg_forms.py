"""``MERGE`` against ``INSERT … ON CONFLICT`` on the same staged rows (runs in a child process, ``--part pg-forms``).

Issue 5 leaves the set-wise statement to the benchmark. The staged rows are
the final rows of every keyed table (from the compiled run's database), in two
scenarios, each run ``repeats`` times per form in alternating order, every
trial on tables emptied (and refilled) first and after a ``CHECKPOINT``:

* **insert**: the tables are empty and every staged row is an upsert, as in a
  first cycle;
* **update + delete**: the tables hold every row; every tenth staged row is a
  delete, the others update their row (to the same values), as in a later cycle.

The forms: ``pg_sql.delete_keyed`` then ``pg_sql.upsert_keyed`` (``INSERT …
ON CONFLICT DO UPDATE``); one ``MERGE`` doing the deletes, updates and
inserts; and the target's (issue 13) ``pg_apply.apply_keyed``: ``DELETE``,
``UPDATE`` of the net updates, ``INSERT`` of the net inserts whose key is
free, whose row counts show collisions. All must leave the same rows.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from psycopg import sql

from bench.limit import count_rows, final_changes, stage
from bench.measure import BenchError
from bench.pg_server import fingerprints
from bench.workload import latest_table_defs

SCENARIOS = ("insert", "update + delete")
COUNTED = "DELETE, UPDATE, INSERT (counted)"
FORMS = ("INSERT … ON CONFLICT", "MERGE", COUNTED)
DELETE_EVERY = 10


def form_statements(form: str, ident: sql.Identifier, stage_ident: sql.Identifier, table: Any) -> list[sql.Composed]:
    """The statements one form runs for one table."""
    from applier.targets import pg_sql as q

    if form == "MERGE":
        return [q.merge_keyed(ident, stage_ident, table)]
    if form == COUNTED:
        return []  # its statements depend on their row counts: pg_apply.apply_keyed
    return [q.delete_keyed(ident, stage_ident, table), q.upsert_keyed(ident, stage_ident, table)]


def with_deletes(net: Any, every: int = DELETE_EVERY) -> Any:
    """A keyed table's final rows as net changes of a later cycle: every ``every``-th row a delete, the rest upserts."""
    import numpy as np
    import pyarrow as pa

    from applier.engine.changes import TableChanges

    rows = net.upserts
    gone = np.arange(rows.num_rows) % every == every - 1
    upserts, deletes = rows.filter(pa.array(~gone)), rows.filter(pa.array(gone)).select(list(net.table.primary_key))
    stats = {"I": 0, "U": upserts.num_rows, "D": deletes.num_rows, "T": 0}
    return TableChanges(net.table, False, upserts, deletes, None, stats, pa.repeat(pa.scalar(False), upserts.num_rows))


def _reset(conn: Any, changes: dict[str, Any], staged: dict[str, Any], filled: bool) -> None:
    """Empty every table, refill it from its all-upsert staging table when ``filled``, vacuum, checkpoint."""
    from applier.targets import pg_sql as q

    for name, net in changes.items():
        ident = q.target_table(net.table, {})
        conn.execute(q.truncate(ident))
        if filled:
            conn.execute(q.upsert_keyed(ident, staged[name]["stage"], net.table))
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(ident))
    conn.execute("CHECKPOINT")


def _trial(conn: Any, form: str, changes: dict[str, Any], staged: dict[str, Any]) -> dict[str, Any]:
    """One form applying every table's staging table in one transaction; seconds per table and in all."""
    from applier.targets import pg_apply
    from applier.targets import pg_sql as q

    per_table: dict[str, float] = {}
    started = time.perf_counter()
    with conn.transaction():
        for name, net in changes.items():
            t = time.perf_counter()
            ident, stage_ident = q.target_table(net.table, {}), staged[name]["stage"]
            if form == COUNTED:
                pg_apply.apply_keyed(conn, ident, stage_ident, net.table)
            for statement in form_statements(form, ident, stage_ident, net.table):
                conn.execute(statement)
            per_table[name] = time.perf_counter() - t
    return {"seconds": time.perf_counter() - started, "per_table_s": per_table}


def _check(conn: Any, url: str, changes: dict[str, Any], expected: dict[str, int]) -> dict[str, Any]:
    """Every table holds the expected number of rows; its fingerprint (to compare the forms)."""
    for name, net in changes.items():
        count = conn.execute(count_rows(net.table)).fetchone()
        if count is None or count[0] != expected[name]:
            raise BenchError(f"forms: {name} holds {count} rows, {expected[name]} expected")
    return fingerprints(url, list(changes))


def _summary(trials: dict[str, list[dict[str, Any]]], tables: list[str]) -> dict[str, Any]:
    """Per form: every trial's seconds, their median, and the median per table."""
    return {
        form: {
            "trials_s": [t["seconds"] for t in ts],
            "median_s": statistics.median(t["seconds"] for t in ts),
            "per_table_median_s": {n: statistics.median(t["per_table_s"][n] for t in ts) for n in tables},
        }
        for form, ts in trials.items()
    }


def compare_forms(source_url: str, url: str, defs: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Time both statement forms on the final rows of the keyed tables of ``source_url``, in an empty database.

    Args:
        source_url: the database holding the final rows.
        url: an empty database to stage and apply them in.
        defs: every table's definition (tables without a key are left out).
        repeats: trials per form and scenario.

    Returns:
        Per scenario and form: every trial's seconds and the medians (see :func:`_summary`); the rows staged;
        whether every trial of a scenario left the same rows (``agree``); the faster form per scenario.

    Raises:
        BenchError: a trial left a table with a different number of rows than expected.
    """
    import psycopg

    inserts = final_changes(source_url, {name: t for name, t in defs.items() if t.primary_key})
    later = {name: with_deletes(net) for name, net in inserts.items()}
    result: dict[str, Any] = {"repeats": repeats, "scenarios": {}, "agree": True, "faster": {}}
    with psycopg.connect(url, autocommit=True, application_name="cdc-bench forms") as conn:
        stages = {"insert": stage(conn, inserts, "insert"), "update + delete": stage(conn, later, "later")}
        result["rows"] = {scenario: {n: s["rows"] for n, s in staged.items()} for scenario, staged in stages.items()}
        for scenario in SCENARIOS:
            changes = inserts if scenario == "insert" else later
            expected = {name: net.upserts.num_rows for name, net in changes.items()}
            trials: dict[str, list[dict[str, Any]]] = {form: [] for form in FORMS}
            seen = []
            for r in range(repeats):
                for form in FORMS if r % 2 == 0 else tuple(reversed(FORMS)):
                    _reset(conn, changes, stages["insert"], filled=scenario != "insert")
                    trials[form].append(_trial(conn, form, changes, stages[scenario]))
                    seen.append(_check(conn, url, changes, expected))
                    print(f"{scenario}, {form}: {trials[form][-1]['seconds']:.2f} s", flush=True)
            result["agree"] = result["agree"] and all(f == seen[0] for f in seen)
            result["scenarios"][scenario] = _summary(trials, list(changes))
            medians = {form: v["median_s"] for form, v in result["scenarios"][scenario].items()}
            result["faster"][scenario] = min(medians, key=lambda f: medians[f])
    return result


def part_forms(params: dict[str, Any]) -> dict[str, Any]:
    """:func:`compare_forms` in a child process.

    Args:
        params: ``intermediate_dir`` (for the table definitions), ``source_url``, ``url`` and ``repeats``.
    """
    from pathlib import Path

    defs = latest_table_defs(Path(params["intermediate_dir"]))
    return compare_forms(params["source_url"], params["url"], defs, params["repeats"])
