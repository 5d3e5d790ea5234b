"""Transient target errors: which PostgreSQL errors are transient, and how a cycle's apply is retried."""

from __future__ import annotations

import logging
import pickle
import re
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from applier.config import load_config
from applier.engine.retry import NO_RETRY, RetryPolicy
from applier.errors import TargetError
from applier.intermediate.schema import Column, TableDef
from applier.targets.delta import DeltaTarget
from applier.targets.pg_errors import error_class, is_transient
from applier.targets.postgres import PostgresTarget
from test_delta_target import keyed
from test_postgres_target import ORDERS, checkpoint_row, rows


class Flaky:
    """Fails with the given errors, in order, then answers ``done``."""

    def __init__(self, *errors: TargetError) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def test_transient_errors_are_retried_with_doubling_waits_each_logged(caplog: pytest.LogCaptureFixture) -> None:
    waits: list[float] = []
    policy = RetryPolicy(retries=3, delay_s=0.5, sleep=waits.append)
    flaky = Flaky(TargetError("lock timeout on a.b", transient=True), TargetError("lost", transient=True))
    with caplog.at_level(logging.WARNING, logger="applier"):
        assert policy.run(flaky, "cycle 7") == "done"
    assert flaky.calls == 3 and waits == [0.5, 1.0]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "cycle 7: transient target error, retry 1 of 3 in 0.5 s: lock timeout on a.b",
        "cycle 7: transient target error, retry 2 of 3 in 1 s: lost",
    ]


def test_a_permanent_error_is_not_retried_and_the_last_transient_one_says_so() -> None:
    waits: list[float] = []
    policy = RetryPolicy(retries=2, delay_s=1, sleep=waits.append)
    permanent = Flaky(TargetError("check constraint"))
    with pytest.raises(TargetError, match=r"^check constraint$"):
        policy.run(permanent, "cycle 1")
    assert permanent.calls == 1 and waits == []
    always = Flaky(*(TargetError(f"lock {i}", transient=True) for i in range(5)))
    with pytest.raises(TargetError, match=r"^lock 2 \(still failing after 2 retries\)$") as gave_up:
        policy.run(always, "cycle 1")
    assert gave_up.value.transient and always.calls == 3 and waits == [1, 2]
    with pytest.raises(TargetError, match=r"^lock 0$"):
        NO_RETRY.run(Flaky(TargetError("lock 0", transient=True)), "cycle 1")


def test_postgresql_errors_are_transient_by_their_class() -> None:
    transient = [
        psycopg.errors.LockNotAvailable(),
        psycopg.errors.QueryCanceled(),
        psycopg.errors.DeadlockDetected(),
        psycopg.errors.SerializationFailure(),
        psycopg.errors.AdminShutdown(),
        psycopg.errors.TooManyConnections(),
        psycopg.OperationalError("connection refused"),
    ]
    permanent = [
        psycopg.errors.CheckViolation(),
        psycopg.errors.UniqueViolation(),
        psycopg.errors.NotNullViolation(),
        psycopg.errors.NumericValueOutOfRange(),
        psycopg.errors.UndefinedTable(),
    ]
    assert [is_transient(e) for e in transient] == [True] * len(transient)
    assert [is_transient(e) for e in permanent] == [False] * len(permanent)
    assert [error_class(e) for e in transient] == [
        "lock", "timeout", "serialization", "serialization", "shutdown", "resources", "connection"
    ]  # fmt: skip
    assert [error_class(e) for e in permanent] == ["check", "unique", "not_null", "data", "schema"]
    assert error_class(psycopg.errors.ForeignKeyViolation()) == "foreign_key"
    assert error_class(psycopg.errors.InsufficientPrivilege()) == "other"


def test_a_target_error_is_transient_as_its_class_says_unless_told() -> None:
    assert TargetError("x", error_class="lock").transient and not TargetError("x", error_class="unique").transient
    assert not TargetError("x").transient and TargetError("x").error_class == "other"
    assert TargetError("x", transient=True).transient
    with pytest.raises(ValueError, match="unknown target error class 'oops'"):
        TargetError("x", error_class="oops")
    carried = pickle.loads(pickle.dumps(TargetError("y", error_class="check")))  # across worker processes
    assert (carried.error_class, carried.transient, str(carried)) == ("check", False, "y")


def test_delta_errors_are_classed_by_constraint_schema_and_conflict(tmp_path: Path) -> None:
    target = DeltaTarget(tmp_path, "c")
    target.apply(1, keyed(ORDERS, [{"id": 1, "status": "first"}]))
    DeltaTable(str(target.table_path(ORDERS.name))).alter.add_constraint({"small": "id < 1000"})
    with pytest.raises(TargetError) as refused:
        target.apply(2, keyed(ORDERS, [{"id": 4321, "status": "second"}]))
    assert refused.value.error_class == "check" and not refused.value.transient
    assert "4321" not in str(refused.value)  # delta-rs's preview of the rows is left out
    assert target.committed_cycle(ORDERS.name) == 1  # nothing of cycle 2 landed
    wider = TableDef(ORDERS.name, (*ORDERS.columns[:1], Column("status", "bigint", True)), ORDERS.primary_key)
    with pytest.raises(TargetError) as mismatch:
        target.apply(2, keyed(wider, [{"id": 2, "status": 5}]))
    assert mismatch.value.error_class == "schema" and not mismatch.value.transient
    assert TargetError("x", error_class="conflict").transient  # a commit another writer beat


def test_timeouts_and_retries_are_configured_with_documented_defaults(tmp_path: Path) -> None:
    base = ["configuration_name=c", "intermediate_dir=i", "output_dir=o", "target.path=t"]
    config = load_config(None, base)
    assert (config.target.lock_timeout_s, config.target.statement_timeout_s) == (60.0, 0.0)
    assert (config.apply.transient_retries, config.apply.transient_retry_delay_s) == (3, 5.0)
    tuned = load_config(None, [*base, "target.lock_timeout_s=1.5", "apply.transient_retries=0"])
    assert tuned.target.lock_timeout_s == 1.5 and tuned.apply.transient_retries == 0
    with pytest.raises(Exception, match=r"target\.lock_timeout_s.*seconds"):
        load_config(None, [*base, "target.lock_timeout_s=-1"])


def _hold_lock(
    url: str, table: str, seconds: float, ready: threading.Event, until: threading.Event | None = None
) -> None:
    """Hold an exclusive lock on ``table`` for ``seconds``, or until ``until`` is set (then a second longer)."""
    with psycopg.connect(url, application_name="a DBA's session") as conn:
        conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        ready.set()
        if until is None:
            time.sleep(seconds)
        elif until.wait(seconds):
            time.sleep(1.0)


class _SeesRetries(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "transient target error" in record.getMessage():
            self.seen.set()


@pytest.mark.postgres
def test_a_lock_held_past_the_timeout_is_a_transient_error_naming_the_holder_then_the_cycle_goes_through(
    pg_url: str, tmp_path: Path
) -> None:
    target = PostgresTarget(pg_url, "demo", lock_timeout_s=0.5)
    target.apply_cycle(1, {ORDERS.name: keyed(ORDERS, [{"id": 1, "status": "first"}])}, {"applied_seq": 1})
    ready = threading.Event()
    holder = threading.Thread(target=_hold_lock, args=(pg_url, "shop.orders", 3.0, ready))
    holder.start()
    ready.wait(10)
    second: dict[str, Any] = {ORDERS.name: keyed(ORDERS, [{"id": 2, "status": "second"}])}
    started = time.monotonic()
    with pytest.raises(TargetError) as blocked:
        target.apply_cycle(2, second, {"applied_seq": 2})
    waited = time.monotonic() - started
    message = str(blocked.value)
    assert blocked.value.transient and "table shop.orders" in message and "lock" in message, message
    assert "lock_timeout 0.5 s; held by pid " in message and "application a DBA's session" in message, message
    assert "AccessExclusiveLock" in message and waited < 2.5
    assert checkpoint_row(pg_url) == (1, 1, 0, 0)
    holder.join()
    target.apply_cycle(2, second, {"applied_seq": 2})  # released: the same cycle goes through, once
    assert rows(pg_url, "shop.orders", "id") == [(1, "first", None), (2, "second", None)]
    assert checkpoint_row(pg_url) == (2, 2, 0, 0)


@pytest.mark.spark
@pytest.mark.postgres
def test_a_run_waits_out_a_lock_with_logged_retries_and_equals_the_reference(
    tmp_path: Path, spark: Any, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from applier.generate import generate_workload
    from engine_support import assert_target_equals_reference, make_config, run

    stream = tmp_path / "in"
    generate_workload(stream, seed=5, transactions=120, file_size_mb=0.03, profile="demo")
    settings = ["target.type=postgres", f"target.url={pg_url}", "target.lock_timeout_s=0.5"]
    config = make_config(
        tmp_path,
        stream,
        settings,
        process_intermediate_size_per_job=0.03,
        transient_retries=3,
        transient_retry_delay_s=0.5,
    )
    run(config, spark, max_cycles=1)
    with psycopg.connect(pg_url) as conn:
        tables = [
            f'"{s}"."{t}"'
            for s, t in conn.execute(
                "SELECT table_schema, table_name FROM information_schema.tables "
                "WHERE table_schema NOT IN ('pg_catalog', 'information_schema', 'applier_staging') "
                "AND table_name <> 'applier_checkpoint'"
            )
        ]
    assert tables
    ready, sees = threading.Event(), _SeesRetries()
    # Held until the run has waited once (a retry logged), and a second more: at most 60 s.
    holder = threading.Thread(target=_hold_lock, args=(pg_url, ", ".join(tables), 60.0, ready, sees.seen))
    holder.start()
    ready.wait(10)
    logging.getLogger("applier").addHandler(sees)
    try:
        with caplog.at_level(logging.WARNING, logger="applier"):
            summary = run(config, spark)
    finally:
        logging.getLogger("applier").removeHandler(sees)
        sees.seen.set()
        holder.join()
    waits = [r.getMessage() for r in caplog.records if "transient target error" in r.getMessage()]
    assert waits and "held by pid " in waits[0] and "a DBA's session" in waits[0], waits
    assert re.match(r"cycle \d+: transient target error, retry 1 of 3 in 0\.5 s: .*: table \w+\.\w+: ", waits[0])
    assert summary.cycles_run >= 1
    assert_target_equals_reference(config, stream)
