"""The pure builders behind the Airflow operators, compared exactly (no Airflow needed)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import MappingProxyType

import pytest

from applier.config import TargetConfig, load_config
from applier.engine.ledger import LedgerCycle, RunRecord
from applier.errors import PERMANENT_LINE
from applier_airflow.builders import (
    DEFAULT_SCHEDULE,
    application_args,
    asset_uri,
    asset_uris,
    changed_tables,
    figures_lines,
    max_cycles_from_params,
    new_pairs_event,
    overrides_from_params,
    plan_summary,
    run_figures,
    run_key,
    schedule_from_env,
    spark_env,
    submit_failure,
    submit_outcome,
    target_overrides,
    touched_tables,
)

NO_PARAMS = {
    "max_cycles": None,
    "process_intermediate_size_per_job": None,
    "buffer_size_for_split_records": None,
    "plan_only": False,
    "skip_validation": False,
}


def test_schedule_defaults_to_every_five_minutes_and_none_means_triggered_only() -> None:
    assert DEFAULT_SCHEDULE == "*/5 * * * *"
    assert schedule_from_env(None) == "*/5 * * * *"
    assert schedule_from_env("  ") == "*/5 * * * *"
    assert schedule_from_env("none") is None
    assert schedule_from_env("Manual") is None
    assert schedule_from_env(" @hourly ") == "@hourly"
    assert schedule_from_env("0 */2 * * *") == "0 */2 * * *"


def test_run_key_comes_from_the_logical_date_in_utc() -> None:
    assert run_key(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "scheduled__x") == "20260102T030405Z"
    paris = dt.timezone(dt.timedelta(hours=1))
    assert run_key(dt.datetime(2026, 1, 2, 4, 4, 5, tzinfo=paris), "manual__y") == "20260102T030405Z"
    assert run_key(dt.datetime(2026, 1, 2, 3, 4, 5, 123, tzinfo=dt.UTC), "m") == "20260102T030405.000123Z"


def test_run_key_falls_back_to_a_safe_run_id_without_a_logical_date() -> None:
    assert run_key(None, "manual__2026-01-02T03:04:05.5+00:00") == "run_manual__2026-01-02T03_04_05.5_00_00"
    assert run_key(None, "asset_triggered__x y") == "run_asset_triggered__x_y"


def test_params_become_config_overrides_and_null_params_override_nothing() -> None:
    assert overrides_from_params(NO_PARAMS) == []
    assert overrides_from_params({}) == []
    params = {**NO_PARAMS, "process_intermediate_size_per_job": 0.5, "buffer_size_for_split_records": 2048}
    assert overrides_from_params(params) == [
        "apply.process_intermediate_size_per_job=0.5",
        "apply.buffer_size_for_split_records=2048",
    ]
    whole = overrides_from_params({"buffer_size_for_split_records": 4096.0})
    assert whole == ["apply.buffer_size_for_split_records=4096"]
    assert overrides_from_params({"process_intermediate_size_per_job": 3}) == [
        "apply.process_intermediate_size_per_job=3"
    ]


def test_param_overrides_load_into_the_configuration(tmp_path: Path) -> None:
    base = ["configuration_name=c", f"intermediate_dir={tmp_path}", f"output_dir={tmp_path}", f"target.path={tmp_path}"]
    params = {"process_intermediate_size_per_job": 0.25, "buffer_size_for_split_records": 4096}
    config = load_config(None, [*base, *overrides_from_params(params)])
    assert config.apply.process_intermediate_size_per_job == 0.25
    assert config.apply.buffer_size_for_split_records == 4096


def test_a_param_that_is_not_a_number_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="param buffer_size_for_split_records: True is not a number"):
        overrides_from_params({"buffer_size_for_split_records": True})
    with pytest.raises(ValueError, match="param process_intermediate_size_per_job: '1' is not a number"):
        overrides_from_params({"process_intermediate_size_per_job": "1"})


def test_max_cycles_param() -> None:
    assert max_cycles_from_params(NO_PARAMS) is None
    assert max_cycles_from_params({"max_cycles": 0}) == 0
    assert max_cycles_from_params({"max_cycles": 7}) == 7
    assert max_cycles_from_params({"max_cycles": 1000.0}) == 1000  # JSON 1e3, as a form or a script may send it
    with pytest.raises(ValueError, match="param max_cycles: -1 is not a whole number >= 0"):
        max_cycles_from_params({"max_cycles": -1})
    with pytest.raises(ValueError, match=r"param max_cycles: 2\.5 is not a whole number >= 0"):
        max_cycles_from_params({"max_cycles": 2.5})


def test_an_fs_target_connection_sets_the_delta_target_folder() -> None:
    assert target_overrides("fs", {"path": "/data/target"}, "applier_target") == [
        "target.type=delta",
        "target.path=/data/target",
    ]


def test_a_postgres_target_connection_sets_url_and_schema_map_but_never_the_password() -> None:
    got = target_overrides(
        "postgres", {"schema_map": {"shop": "replica"}}, "t", host="db.example", port=5433, login="app", database="w"
    )
    assert got == [
        "target.type=postgres",
        "target.url=host=db.example port=5433 user=app dbname=w",
        "target.schema_map.shop=replica",
    ]


def test_an_unusable_target_connection_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="connection applier_target: type 'mysql' is not supported"):
        target_overrides("mysql", {}, "applier_target")
    with pytest.raises(ValueError, match="connection t: a postgres target connection needs a host"):
        target_overrides("postgres", {}, "t")
    with pytest.raises(ValueError, match="connection t: extra 'path' must be an absolute folder, got 'rel/dir'"):
        target_overrides("fs", {"path": "rel/dir"}, "t")
    with pytest.raises(ValueError, match="got None"):
        target_overrides("fs", {}, "t")


def test_application_args_carry_config_overrides_cycle_limit_and_run_key() -> None:
    assert application_args("/p/demo.yaml", ["a.b=1", "c=2"], 3, "20260102T030405Z") == [
        "--config",
        "/p/demo.yaml",
        "--set",
        "a.b=1",
        "--set",
        "c=2",
        "--max-cycles",
        "3",
        "--run-key",
        "20260102T030405Z",
    ]
    assert application_args("/p/demo.yaml", [], None, "k") == ["--config", "/p/demo.yaml", "--run-key", "k"]
    assert application_args("c.yaml", [], 0, "k") == ["--config", "c.yaml", "--max-cycles", "0", "--run-key", "k"]


def test_spark_env_runs_the_workers_python_and_the_spark_submit_beside_it() -> None:
    assert spark_env("/venv/bin/python", "/venv/bin/python", "/usr/bin:/bin") == {
        "PYSPARK_DRIVER_PYTHON": "/venv/bin/python",
        "PYSPARK_PYTHON": "/venv/bin/python",
        "PATH": "/venv/bin:/usr/bin:/bin",
    }
    assert spark_env("/venv/bin/python", "python3", "") == {
        "PYSPARK_DRIVER_PYTHON": "/venv/bin/python",
        "PYSPARK_PYTHON": "python3",
        "PATH": "/venv/bin",
    }


def test_submit_failure_finds_the_exit_code_and_the_applier_error() -> None:
    message = (
        "Cannot execute: spark-submit --master local[*] --name applier jobs/apply.py --config c.yaml. "
        "Error code is: 3.\nLast spark-submit output:\nINFO something\n"
        "applier: error: /in/000000000004.dat: row 2 is not valid [invalid-change]\nINFO shutdown"
    )
    assert submit_failure(message) == (3, "/in/000000000004.dat: row 2 is not valid [invalid-change]")
    assert submit_failure("Cannot execute: spark-submit x. Error code is: 1.") == (1, None)
    assert submit_failure("something else") == (None, None)


def test_a_held_run_lock_skips_the_apply_task_and_bad_input_fails_it_without_retry() -> None:
    held = (
        "Cannot execute: spark-submit --master local[*] --name applier jobs/apply.py --config c.yaml. "
        "Error code is: 6.\nLast spark-submit output:\n"
        "applier: error: another run is applying this configuration: the run lock of configuration demo "
        "(/out/demo/run.lock) is held by the run on host h, pid 42, started 2026-01-01T10:00:00Z; "
        "this run changed nothing\n"
    )
    assert submit_outcome(held) == (
        "skip",
        "skipped (exit code 6): another run is applying this configuration: the run lock of configuration demo "
        "(/out/demo/run.lock) is held by the run on host h, pid 42, started 2026-01-01T10:00:00Z; "
        "this run changed nothing; the next scheduled run picks up the backlog",
    )
    assert submit_outcome("Error code is: 6.") == (
        "skip",
        "skipped (exit code 6): another run is applying this configuration; "
        "the next scheduled run picks up the backlog",
    )
    refused = "Error code is: 3.\napplier: error: /in/000000000004.dat: bad [invalid-change]"
    assert submit_outcome(refused) == (
        "fail",
        "refused intermediate file (exit code 3): /in/000000000004.dat: bad [invalid-change]",
    )
    assert submit_outcome("Error code is: 2.") == ("fail", "configuration error (exit code 2): None")
    assert submit_outcome("Error code is: 4.\napplier: error: x") == ("retry", "Error code is: 4.\napplier: error: x")
    assert submit_outcome("something else") == ("retry", "something else")
    stopped = f"Error code is: 4.\napplier: error: cycle 2: transaction 7 was refused\n{PERMANENT_LINE}"
    assert submit_outcome(stopped) == (
        "fail",
        "permanent target error (exit code 4): cycle 2: transaction 7 was refused",
    )


def test_plan_summary() -> None:
    assert plan_summary("k", 4, [[5, 6], [7]], [300, 200], gap="pair 9 is missing") == {
        "run_key": "k",
        "applied_seq": 4,
        "cycles": [
            {"first_seq": 5, "last_seq": 6, "pairs": 2, "bytes": 300},
            {"first_seq": 7, "last_seq": 7, "pairs": 1, "bytes": 200},
        ],
        "pairs": 3,
        "bytes": 500,
        "gap": "pair 9 is missing",
        "replay": False,
        "replay_cycles": [],
        "nothing_new": False,
    }


def test_plan_summary_with_nothing_new_unless_the_run_replays() -> None:
    empty = plan_summary("k", 9, [], [])
    assert (empty["nothing_new"], empty["replay"], empty["pairs"], empty["bytes"]) == (True, False, 0, 0)
    replay = plan_summary("k", 9, [], [], replay_cycles=[3, 4])
    assert (replay["nothing_new"], replay["replay"], replay["replay_cycles"]) == (False, True, [3, 4])


def test_new_pairs_event() -> None:
    assert new_pairs_event("/in", 4, [5, 6, 7]) == {
        "directory": "/in",
        "applied_seq": 4,
        "first_seq": 5,
        "last_seq": 7,
        "pairs": 3,
    }


def _position(cycle_id: int, applied_seq: int) -> dict[str, object]:
    return {"cycle_id": cycle_id, "applied_seq": applied_seq, "restart_seq": applied_seq + 1}


RECORD = RunRecord(
    run_key="20260102T030405Z",
    status="finished",
    mode="apply",
    started_at="2026-01-02T03:04:06+00:00",
    cycles=[
        LedgerCycle(
            cycle_id=3,
            seqs=[5, 6],
            before=_position(2, 4),
            after=_position(3, 6),
            committed_at="2026-01-02T03:04:30+00:00",
            net_rows={"shop.orders": {"U": 2, "I": 5}, "shop.events": {"I": 1}},
            tables={"shop.orders": "applied", "shop.events": "skipped"},
        ),
        LedgerCycle(
            cycle_id=4,
            seqs=[7],
            before=_position(3, 6),
            after=_position(4, 7),
            committed_at="2026-01-02T03:04:50+00:00",
            net_rows={"shop.orders": {"D": 1, "I": 1}, "shop.products": {"U": 4}},
            tables={"shop.orders": "applied", "shop.products": "verified"},
            set_aside={"log": 2},
        ),
    ],
)


def test_touched_and_changed_tables_of_a_record() -> None:
    assert touched_tables(RECORD) == ["shop.events", "shop.orders", "shop.products"]
    assert changed_tables(RECORD) == ["shop.events", "shop.orders"]


def test_run_figures_sum_net_rows_over_the_cycles() -> None:
    assert run_figures(RECORD, {"success": True}) == {
        "run_key": "20260102T030405Z",
        "mode": "apply",
        "status": "finished",
        "cycles": 2,
        "cycle_ids": [3, 4],
        "pairs": 3,
        "first_seq": 5,
        "last_seq": 7,
        "before": {"cycle_id": 2, "applied_seq": 4, "restart_seq": 5},
        "after": {"cycle_id": 4, "applied_seq": 7, "restart_seq": 8},
        "net_rows": {"shop.events": {"I": 1}, "shop.orders": {"D": 1, "I": 6, "U": 2}, "shop.products": {"U": 4}},
        "changed_tables": ["shop.events", "shop.orders"],
        "validation": "passed",
        "set_aside": {"log": 2},
    }
    assert run_figures(RECORD, None)["validation"] == "skipped"
    assert run_figures(RECORD, {"success": False})["validation"] == "failed"


def test_run_figures_of_a_run_without_cycles() -> None:
    empty = RunRecord(run_key="k", status="finished", mode="apply", started_at="t")
    figures = run_figures(empty, None)
    assert (figures["cycles"], figures["pairs"], figures["first_seq"], figures["before"]) == (0, 0, None, None)
    assert figures_lines(figures) == ["run k (apply, finished): 0 cycles, no pairs, validation skipped"]


def test_figures_lines() -> None:
    assert figures_lines(run_figures(RECORD, {"success": True})) == [
        "run 20260102T030405Z (apply, finished): 2 cycles, pairs 5..7, validation passed",
        "  shop.events: I 1",
        "  shop.orders: D 1, I 6, U 2",
        "  shop.products: U 4",
        "  transactions set aside by error actions: 2 (2 log)",
    ]


def test_asset_uri_of_a_delta_table_is_its_folder() -> None:
    target = TargetConfig(type="delta", path=Path("/data/target"))
    assert asset_uri(target, "shop.orders") == "file:///data/target/shop/orders"
    assert asset_uris(TargetConfig(path=Path("/t")), ["a.b", "c.d"]) == {"a.b": "file:///t/a/b", "c.d": "file:///t/c/d"}


def test_asset_uri_of_a_postgres_table_names_server_database_and_mapped_schema() -> None:
    target = TargetConfig(
        type="postgres",
        url="postgresql://app:secret@db.example:6543/warehouse",
        schema_map=MappingProxyType({"shop": "shop_copy"}),
    )
    assert asset_uri(target, "shop.orders") == "postgres://db.example:6543/warehouse/shop_copy/orders"
    plain = TargetConfig(type="postgres", url="dbname=dw")
    assert asset_uri(plain, "sales.items") == "postgres://localhost:5432/dw/sales/items"


def test_a_target_without_its_location_has_no_asset_uri() -> None:
    with pytest.raises(ValueError, match=r"target\.type 'postgres' without its path or url"):
        asset_uri(TargetConfig(type="postgres"), "shop.orders")


def test_the_extract_schedule_defaults_to_every_minute() -> None:
    from applier_airflow.extract_builders import EXTRACT_SCHEDULE

    assert schedule_from_env(None, EXTRACT_SCHEDULE) == "* * * * *"
    assert schedule_from_env("none", EXTRACT_SCHEDULE) is None
    assert schedule_from_env("*/2 * * * *", EXTRACT_SCHEDULE) == "*/2 * * * *"


def test_an_extract_batch_is_skipped_under_another_extractor_retried_when_unreachable_else_failed() -> None:
    from applier.errors import ConfigError, ExtractError, RunLockedError, SourceUnavailableError
    from applier_airflow.extract_builders import extract_outcome

    locked = RunLockedError("the lock /in/.extract.lock", "the run on host h, pid 7", "extracting into")
    assert extract_outcome(locked) == (
        "skip",
        "skipped (exit code 6): another run is extracting into this configuration: the lock /in/.extract.lock is "
        "held by the run on host h, pid 7; this run changed nothing",
    )
    assert extract_outcome(SourceUnavailableError("the source cannot be reached: refused")) == (
        "retry",
        "the source cannot be reached: refused",
    )
    assert extract_outcome(ExtractError("table public.t, column d: value 'infinity' cannot be extracted")) == (
        "fail",
        "ExtractError (exit code 8): table public.t, column d: value 'infinity' cannot be extracted",
    )
    assert extract_outcome(ConfigError("source.slot", None, "required"))[0] == "fail"


def test_the_extract_figures_and_line_say_when_a_batch_was_held_back() -> None:
    from applier.extract import ExtractSummary
    from applier_airflow.extract_builders import extract_figures, extract_line, max_wal_mb_from_params

    figures = extract_figures(ExtractSummary(pairs=3, rows=240, transactions=1, confirmed_lsn=(1 << 32) + 255))
    assert figures == {"pairs": 3, "transactions": 1, "rows": 240, "confirmed_lsn": "1/FF", "held_back": False}
    assert extract_line(figures) == "3 pairs written, 1 transactions, 240 rows; slot confirmed at 1/FF"
    held = extract_line({**figures, "held_back": True})
    assert held.endswith("; held back by the unapplied backlog (extract.max_backlog_mb): ended early")
    assert (max_wal_mb_from_params({}), max_wal_mb_from_params({"max_wal_mb": 2})) == (None, 2.0)
    with pytest.raises(ValueError, match="param max_wal_mb: 0 is not a number above 0"):
        max_wal_mb_from_params({"max_wal_mb": 0})


def test_subscription_params_are_checked_naming_the_param() -> None:
    from applier_airflow.extract_builders import subscription_from_params

    assert subscription_from_params({"table": "public.t", "mode": "nonatomic", "chunk_rows": 10}) == (
        "public.t", "nonatomic", 10
    )  # fmt: skip
    assert subscription_from_params({"table": "s.t"}) == ("s.t", "atomic", None)
    for params, named in (({"table": "t"}, "table"), ({"table": "s.t", "mode": "x"}, "mode"),
                          ({"table": "s.t", "chunk_rows": 0}, "chunk_rows")):  # fmt: skip
        with pytest.raises(ValueError, match=f"param {named}:"):
            subscription_from_params(params)


def test_a_conf_key_that_is_no_param_is_named() -> None:
    from applier_airflow.builders import unknown_conf_keys

    params = {"max_cycles": None, "plan_only": False}
    assert unknown_conf_keys({"max_cycles": 2}, params) is None
    assert unknown_conf_keys({"max_cyclez": 1, "plan_only": True}, params) == (
        "conf key 'max_cyclez' is not a param of this DAG (its params: max_cycles, plan_only)"
    )


def test_the_data_docs_link_is_the_views_site_under_airflows_base_url() -> None:
    from applier_airflow.builders import data_docs_url

    assert data_docs_url("http://localhost:8080") == "http://localhost:8080/applier/docs/index.html"
    assert data_docs_url("https://x.example/airflow/") == "https://x.example/airflow/applier/docs/index.html"
    assert data_docs_url("") == "/applier/docs/index.html"


def test_the_materialize_dag_offers_the_modes_the_library_takes() -> None:
    from applier.extract.subscriptions import MODES
    from applier_airflow.extract_builders import MODES as DAG_MODES  # its own: the DAG file must not load the extractor

    assert DAG_MODES == MODES
