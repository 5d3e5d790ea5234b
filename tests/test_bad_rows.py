"""One bad row costs one transaction: the enhanced retry finds it, its error action decides (PostgreSQL).

The target table carries a CHECK constraint and a unique index the source
does not have. 1,000 transactions of 10 rows each commit in one cycle; one
(then three) of them break a constraint.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from applier.cli import main
from applier.config import load_config
from applier.engine.checkpoint import CheckpointStore
from applier.engine.split import attempt_bound
from applier.errors import TransactionStoppedError
from applier.summary import read_summary, summary_lines
from applier.targets.delta import DeltaTarget
from engine_support import make_config, run
from handmade import event, row, write_pair

pytestmark = pytest.mark.spark

ITEMS = {
    "columns": [
        {"name": "id", "type": "bigint", "nullable": False},
        {"name": "qty", "type": "int", "nullable": True},
        {"name": "sku", "type": "string", "nullable": True},
    ],
    "primary_key": ["id"],
}
TRANSACTIONS, ROWS_EACH, THRESHOLD = 1_000, 10, 100


def write_workload(directory: Path, bad_check: set[int], bad_unique: set[int], seqs: range = range(1, 5)) -> None:
    """4 pairs of 250 transactions; transaction t inserts ids 10t..10t+9, or breaks a constraint."""
    for seq in seqs:
        lsn = 1 + (seq - 1) * 250 * (ROWS_EACH + 2)
        rows, events = [], []
        for t in range((seq - 1) * 250, seq * 250):
            xid = f"x{t}"
            events.append(event("begin", xid, lsn))
            lsn += 1
            for k in range(ROWS_EACH):
                ident = t * ROWS_EACH + k
                qty = -1 if t in bad_check and k == 3 else k
                sku = "s0" if t in bad_unique and k == 5 else f"s{ident}"
                rows.append(row(lsn, xid, "I", after={"id": ident, "qty": qty, "sku": sku}, table="shop.items"))
                lsn += 1
            events.append(event("commit", xid, lsn))
            lsn += 1
        write_pair(directory, seq, rows, events, tables={"shop.items": ITEMS})


def constrained_target(url: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute("CREATE SCHEMA shop")
        conn.execute("CREATE TABLE shop.items (id bigint PRIMARY KEY, qty integer, sku text)")
        conn.execute("ALTER TABLE shop.items ADD CONSTRAINT qty_not_negative CHECK (qty >= 0)")
        conn.execute("CREATE UNIQUE INDEX items_sku ON shop.items (sku)")


def ids(url: str) -> set[int]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM shop.items")}


def ids_of(transactions: range | set[int]) -> set[int]:
    return {t * ROWS_EACH + k for t in transactions for k in range(ROWS_EACH)}


def configured(tmp_path: Path, url: str, *extra: str) -> Any:
    return make_config(
        tmp_path,
        tmp_path / "pairs",
        ["target.type=postgres", f"target.url={url}", *extra],
        compile_retry_threshold=THRESHOLD,
        transient_retries=0,
    )


@pytest.mark.postgres
def test_with_stop_exactly_the_transactions_before_the_bad_one_are_applied_and_checkpointed(
    tmp_path: Path, spark: Any, pg_url: str
) -> None:
    write_workload(tmp_path / "pairs", bad_check={617}, bad_unique=set())
    constrained_target(pg_url)
    config = configured(tmp_path, pg_url)
    with pytest.raises(TransactionStoppedError) as stopped:
        run(config, spark)
    message = str(stopped.value)
    assert "transaction x617 (commit lsn" in message and "pair 000000000003" in message
    assert "table shop.items" in message and "qty_not_negative" in message and "errors.actions.check is stop" in message
    assert stopped.value.exit_code == 4 and "\n" not in message
    assert ids(pg_url) == ids_of(range(617))
    intent = CheckpointStore(config.work_dir).load_intent()
    assert intent is not None and intent.through == 617
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT cycle_id, part_through FROM applier_checkpoint").fetchone() == (0, 617)

    # The next run stops at the same transaction, having applied nothing twice.
    with pytest.raises(TransactionStoppedError, match="x617"):
        run(config, spark)
    assert ids(pg_url) == ids_of(range(617))

    # Once the operator fixes the target, the cycle finishes: every transaction exactly once.
    with psycopg.connect(pg_url) as conn:
        conn.execute("ALTER TABLE shop.items DROP CONSTRAINT qty_not_negative")
    summary = run(config, spark)
    assert summary.checkpoint.cycle_id == 1 and summary.committed == TRANSACTIONS
    assert ids(pg_url) == ids_of(range(TRANSACTIONS))
    assert CheckpointStore(config.work_dir).load_intent() is None


@pytest.mark.postgres
def test_with_log_the_good_transactions_are_applied_and_the_bad_ones_kept_with_every_change(
    tmp_path: Path, spark: Any, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_check, bad_unique = {3, 500}, {999}
    write_workload(tmp_path / "pairs", bad_check, bad_unique)
    constrained_target(pg_url)
    config = configured(tmp_path, pg_url, "errors.actions.check=log", "errors.actions.unique=log")
    summary = run(config, spark)
    bad = bad_check | bad_unique
    assert ids(pg_url) == ids_of(set(range(TRANSACTIONS)) - bad)
    assert summary.checkpoint.cycle_id == 1
    report = summary.reports[-1]
    assert sorted((e["xid"], e["class"], e["action"]) for e in report.exceptions) == [
        ("x3", "check", "log"),
        ("x500", "check", "log"),
        ("x999", "unique", "log"),
    ]
    assert summary.cycles[-1].set_aside == {"log": 3}  # as the run ledger records it, for the DAG's report
    (group,) = report.groups
    leaf = math.ceil(THRESHOLD / ROWS_EACH) - 1  # the most transactions of a group under the threshold
    assert group["attempts"] <= len(bad) * attempt_bound(TRANSACTIONS, 3, leaf), group
    with psycopg.connect(pg_url) as conn:
        kept = conn.execute(
            "SELECT id, xid, cycle_id, pair_seq, table_name, error_class, sqlstate FROM applier_exceptions ORDER BY id"
        ).fetchall()
        assert [k[1:] for k in kept] == [
            ("x3", 1, 1, "shop.items", "check", "23514"),
            ("x500", 1, 3, "shop.items", "check", "23514"),
            ("x999", 1, 4, "shop.items", "unique", "23505"),
        ]
        changes = conn.execute(
            "SELECT op, after FROM applier_exception_changes WHERE exception_id = %s ORDER BY lsn", [kept[0][0]]
        ).fetchall()
        assert len(changes) == ROWS_EACH and {op for op, _ in changes} == {"I"}
        assert changes[3][1] == '{"id": 33, "qty": -1, "sku": "s33"}'  # the image as the pair held it
        assert conn.execute("SELECT cycle_id, part_through FROM applier_checkpoint").fetchone() == (1, 0)

    # An operator lists them, reads one with its changes, and deletes it.
    settings = tmp_path / "applier.yaml"
    settings.write_text(
        f"configuration_name: test_cfg\nintermediate_dir: {tmp_path / 'pairs'}\noutput_dir: {tmp_path / 'out'}\n"
        f"target:\n  type: postgres\n  url: '{pg_url}'\n"
    )
    status = cli(capsys, "status", "--config", str(settings))
    line = "transactions set aside by error actions: 3 (3 log); see applier exceptions list (the last 1 cycles)"
    assert line in status
    summary_text = "\n".join(summary_lines(read_summary(load_config(settings))))
    assert "transactions set aside by error actions: 3 (3 log)" in summary_text
    listed = cli(capsys, "exceptions", "list", "--config", str(settings))
    assert [line.split(": ")[0] for line in listed] == [str(k[0]) for k in kept]
    assert "transaction x500 (commit lsn" in listed[1] and "check 23514 [log] 10 changes" in listed[1]
    shown = cli(capsys, "exceptions", "show", str(kept[0][0]), "--config", str(settings))
    assert "qty_not_negative" in shown[1] and shown[5].endswith('after={"id": 33, "qty": -1, "sku": "s33"}')
    assert cli(capsys, "exceptions", "delete", str(kept[0][0]), "--config", str(settings)) == ["deleted 1 exceptions"]
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM applier_exception_changes").fetchone() == (2 * ROWS_EACH,)

    # Resubmitting before the cause is fixed changes nothing; after it, applies the transaction exactly once.
    x500 = str(kept[1][0])
    assert main(["exceptions", "resubmit", x500, "--config", str(settings)]) == 4
    assert "qty_not_negative" in capsys.readouterr().err
    assert ids(pg_url) == ids_of(set(range(TRANSACTIONS)) - bad)
    with psycopg.connect(pg_url) as conn:
        conn.execute("ALTER TABLE shop.items DROP CONSTRAINT qty_not_negative")
    assert cli(capsys, "exceptions", "resubmit", x500, "--config", str(settings)) == [
        f"exception {x500}: transaction x500 applied (10 changes to shop.items)"
    ]
    assert ids(pg_url) == ids_of(set(range(TRANSACTIONS)) - {3, 999})
    assert main(["exceptions", "resubmit", x500, "--config", str(settings)]) == 2
    assert f"exception {x500} was resubmitted at" in capsys.readouterr().err
    assert "resubmitted" in cli(capsys, "exceptions", "list", "--config", str(settings))[0]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(list(argv)) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.postgres
def test_split_in_two_also_finds_the_bad_transaction_and_warn_keeps_nothing(
    tmp_path: Path, spark: Any, pg_url: str
) -> None:
    write_workload(tmp_path / "pairs", bad_check={250}, bad_unique=set())
    constrained_target(pg_url)
    config = configured(tmp_path, pg_url, "errors.actions.check=warn", "apply.retry_split=2")
    summary = run(config, spark)
    assert ids(pg_url) == ids_of(set(range(TRANSACTIONS)) - {250})
    assert [(e["xid"], e["action"]) for e in summary.reports[-1].exceptions] == [("x250", "warn")]
    (group,) = summary.reports[-1].groups
    assert group["attempts"] <= attempt_bound(TRANSACTIONS, 2, math.ceil(THRESHOLD / ROWS_EACH) - 1)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('applier_exceptions')").fetchone() == (None,)  # warn keeps nothing


class Crash(BaseException):
    """Stands for the process dying right after a target commit: nothing in the Applier may catch it."""


class DyingAfter:
    """Wraps target methods so that the process "dies" right after the ``after``-th commit of a part."""

    def __init__(self, after: int) -> None:
        self.after, self.commits = after, 0

    def wrap(self, real: Any, part_of: Any) -> Any:
        """``real``, counting the calls whose arguments (after the cycle id) ``part_of`` finds a part in."""

        def commit_then_die(target: Any, cycle_id: int, *args: Any) -> Any:
            result = real(target, cycle_id, *args)
            if part_of(args) is not None:  # a part, not the whole cycle
                self.commits += 1
                if self.commits == self.after:
                    raise Crash
            return result

        return commit_then_die


@pytest.mark.postgres
@pytest.mark.parametrize("after_commits", [1, 3, 6])
def test_a_crash_between_the_parts_of_a_retry_resumes_to_the_same_state_each_transaction_once(
    tmp_path: Path, spark: Any, pg_url: str, after_commits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_workload(tmp_path / "pairs", bad_check={40, 41}, bad_unique={700})
    constrained_target(pg_url)
    config = configured(tmp_path, pg_url, "errors.actions.check=log", "errors.actions.unique=log")
    from applier.targets.postgres import PostgresTarget

    dies = DyingAfter(after_commits)
    monkeypatch.setattr(PostgresTarget, "pass_transaction", dies.wrap(PostgresTarget.pass_transaction, lambda a: a[0]))
    monkeypatch.setattr(PostgresTarget, "_commit", dies.wrap(PostgresTarget._commit, lambda a: a[-1]))
    monkeypatch.setattr(PostgresTarget, "apply_log_order", dies.wrap(PostgresTarget.apply_log_order, lambda a: a[0]))
    with pytest.raises(Crash):
        run(config, spark)
    monkeypatch.undo()
    summary = run(config, spark)
    assert summary.checkpoint.cycle_id == 1
    assert ids(pg_url) == ids_of(set(range(TRANSACTIONS)) - {40, 41, 700})
    assert summary.checkpoint.row_counts == {"shop.items": (TRANSACTIONS - 3) * ROWS_EACH}  # the crashed run's too
    with psycopg.connect(pg_url) as conn:
        logged = [r[0] for r in conn.execute("SELECT xid FROM applier_exceptions ORDER BY commit_lsn")]
    assert logged == ["x40", "x41", "x700"]


def delta_ids(config: Any) -> set[int]:
    table = DeltaTable(str(config.target.path / "shop" / "items"))
    return set(table.to_pyarrow_table(columns=["id"])["id"].to_pylist())


@pytest.mark.parametrize("max_cmds", [100_000, 2_000], ids=["one group", "groups applied together"])
def test_on_delta_a_check_constraint_refuses_before_any_table_commits_and_the_bad_transactions_are_found(
    tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str], max_cmds: int
) -> None:
    pairs = tmp_path / "pairs"
    write_workload(pairs, bad_check={300, 600}, bad_unique=set(), seqs=range(1, 2))
    config = make_config(tmp_path, pairs, compile_retry_threshold=THRESHOLD, compile_max_cmds=max_cmds)
    run(config, spark)  # creates the table
    DeltaTable(str(config.target.path / "shop" / "items")).alter.add_constraint({"qty_not_negative": "qty >= 0"})
    write_workload(pairs, bad_check={300, 600}, bad_unique=set(), seqs=range(2, 5))

    with pytest.raises(TransactionStoppedError) as stopped:
        run(config, spark)
    assert "transaction x300 (commit lsn" in str(stopped.value) and "qty_not_negative" in str(stopped.value)
    assert delta_ids(config) == ids_of(range(300))  # exactly the transactions before it
    intent = CheckpointStore(config.work_dir).load_intent()
    assert intent is not None and intent.through == 300 - 250

    logging = replace(config, errors=replace(config.errors, actions=MappingProxyType({"check": "log"})))
    summary = run(logging, spark)
    assert delta_ids(config) == ids_of(set(range(TRANSACTIONS)) - {300, 600})
    assert [e["xid"] for e in summary.reports[-1].exceptions] == ["x300", "x600"]
    groups = summary.reports[-1].groups
    if max_cmds < TRANSACTIONS * ROWS_EACH:  # after x300, the rest's groups were tried as one part, then one by one
        (together,) = [g for g in groups if g["mode"] == "together"]
        assert "qty_not_negative" in str(together["refused"]) and together["transactions"] == TRANSACTIONS - 301
        one_by_one = groups[groups.index(together) + 1 :]
        assert len(one_by_one) == together["groups"] == 4
        assert sum(g["transactions"] for g in one_by_one) == together["transactions"]
        assert [g["mode"] for g in one_by_one].count("retry") == 1  # the group of x600
    kept = DeltaTarget(config.target.path, config.configuration_name).exceptions()
    assert [(e["xid"], e["error_class"], e["changes"], e["pair_seq"]) for e in kept] == [
        ("x300", "check", ROWS_EACH, 2),
        ("x600", "check", ROWS_EACH, 3),
    ]
    shown = DeltaTarget(config.target.path, config.configuration_name).exceptions(kept[0]["id"])[0]["changes_list"]
    assert shown[3]["after"] == '{"id": 3003, "qty": -1, "sku": "s3003"}'
    assert run(logging, spark).cycles_run == 0  # nothing left, nothing logged twice
    assert len(DeltaTarget(config.target.path, config.configuration_name).exceptions()) == 2


@pytest.mark.parametrize("after_commits", [2, 5])
def test_on_delta_a_crash_between_the_parts_of_a_retry_resumes_to_the_same_state(
    tmp_path: Path, spark: Any, after_commits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    pairs = tmp_path / "pairs"
    write_workload(pairs, bad_check={300, 301, 777}, bad_unique=set(), seqs=range(1, 2))
    config = make_config(tmp_path, pairs, ["errors.actions.check=log"], compile_retry_threshold=THRESHOLD)
    run(config, spark)
    DeltaTable(str(config.target.path / "shop" / "items")).alter.add_constraint({"qty_not_negative": "qty >= 0"})
    write_workload(pairs, bad_check={300, 301, 777}, bad_unique=set(), seqs=range(2, 5))
    dies = DyingAfter(after_commits)
    monkeypatch.setattr(DeltaTarget, "apply_cycle", dies.wrap(DeltaTarget.apply_cycle, lambda a: a[-1]))
    monkeypatch.setattr(DeltaTarget, "pass_transaction", dies.wrap(DeltaTarget.pass_transaction, lambda a: a[0]))
    with pytest.raises(Crash):
        run(config, spark)
    monkeypatch.undo()
    summary = run(config, spark)
    assert delta_ids(config) == ids_of(set(range(TRANSACTIONS)) - {300, 301, 777})
    assert summary.checkpoint.row_counts == {"shop.items": (TRANSACTIONS - 3) * ROWS_EACH}  # the crashed run's too
    kept = DeltaTarget(config.target.path, config.configuration_name).exceptions()
    assert [e["xid"] for e in kept] == ["x300", "x301", "x777"]
