"""Configuration: one validated, frozen object; bad input named by key, value and what is allowed."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from applier.config import load_config
from applier.errors import ConfigError

MINIMAL = "configuration_name: prod_1\nintermediate_dir: in\noutput_dir: out\ntarget:\n  path: tgt\n"


def _file(tmp_path: Path, text: str = MINIMAL) -> Path:
    path = tmp_path / "conf" / "applier.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_and_paths_relative_to_the_config_file(tmp_path: Path) -> None:
    config = load_config(_file(tmp_path))
    assert config.configuration_name == "prod_1"
    assert config.intermediate_dir == tmp_path / "conf" / "in"
    assert config.target.path == tmp_path / "conf" / "tgt" and config.target.type == "delta"
    assert config.apply.process_intermediate_size_per_job == 0
    assert config.apply.buffer_size_for_split_records == 1048576
    assert config.apply.max_cycles_per_run == 0
    assert config.spark.master == "local[*]"
    assert config.work_dir == tmp_path / "conf" / "out" / "prod_1"
    assert config.spill_dir == config.work_dir / "tmp"


def test_overrides_win_and_are_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(
        _file(tmp_path),
        [
            "apply.process_intermediate_size_per_job=2.5",
            "apply.max_cycles_per_run=3",
            "output_dir=elsewhere",
            "spark.conf.spark.driver.memory=2g",
        ],
    )
    assert config.apply.process_intermediate_size_per_job == 2.5
    assert config.apply.cycle_limit_bytes == int(2.5 * 1024 * 1024)
    assert config.apply.max_cycles_per_run == 3
    assert config.output_dir == tmp_path / "elsewhere"
    assert dict(config.spark.conf) == {"spark.driver.memory": "2g"}


def test_the_config_is_frozen(tmp_path: Path) -> None:
    config = load_config(_file(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.configuration_name = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("override", "key", "says"),
    [
        ("configuration_name=has-dash", "configuration_name", "[A-Za-z0-9_]+"),
        ("configuration_name=_hidden", "configuration_name", "not starting with '_'"),
        ("apply.process_intermediate_size_per_job=-1", "apply.process_intermediate_size_per_job", ">= 0"),
        ("apply.process_intermediate_size_per_job=lots", "apply.process_intermediate_size_per_job", ">= 0"),
        ("apply.buffer_size_for_split_records=0", "apply.buffer_size_for_split_records", ">= 1"),
        ("apply.buffer_size_for_split_records=1.5", "apply.buffer_size_for_split_records", "whole number"),
        ("apply.max_cycles_per_run=true", "apply.max_cycles_per_run", "whole number"),
        ("target.type=oracle", "target.type", "one of: delta"),
        ("extract.max_backlog_mb=-1", "extract.max_backlog_mb", "MiB >= 0"),
        ("extract.max_backlog_mb=lots", "extract.max_backlog_mb", "0 means no limit"),
        ("extract.resume_backlog_mb=true", "extract.resume_backlog_mb", "null for half of extract.max_backlog_mb"),
        ("extract.resume_backlog_mb=2048", "extract.resume_backlog_mb", "at most extract.max_backlog_mb (1024)"),
        ("extract.warn_retained_wal_mb=.nan", "extract.warn_retained_wal_mb", "0 means never"),
        ("alert.max_lag_seconds=0", "alert.max_lag_seconds", "> 0, or null for no lag alert"),
        ("alert.max_lag_seconds=-5", "alert.max_lag_seconds", "> 0, or null for no lag alert"),
        ("alert.max_lag_seconds=10m", "alert.max_lag_seconds", "a number of seconds"),
        ("alert.max_lag_seconds=true", "alert.max_lag_seconds", "a number of seconds"),
        ("apply.executor_write_mb=-1", "apply.executor_write_mb", "MiB >= 0, off, or null for 4 on a cluster"),
        ("apply.executor_write_mb=never", "apply.executor_write_mb", "MiB >= 0, off, or null"),
        ("apply.buffer_size=10", "apply.buffer_size", "unknown key"),
        ("novalue", "--set", "key=value"),
    ],
)
def test_a_bad_value_or_unknown_key_is_refused_naming_key_value_and_what_is_allowed(
    tmp_path: Path, override: str, key: str, says: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(_file(tmp_path), [override])
    assert refused.value.key == key
    assert f"'{key}'" in str(refused.value) and says in str(refused.value)


def test_executor_commits_are_sized_by_the_master_unless_a_size_or_off_is_set(tmp_path: Path) -> None:
    assert load_config(_file(tmp_path)).apply.executor_write_mb is None
    assert load_config(_file(tmp_path), ["apply.executor_write_mb=0"]).apply.executor_write_mb == 0.0
    assert load_config(_file(tmp_path), ["apply.executor_write_mb=16"]).apply.executor_write_mb == 16.0
    assert load_config(_file(tmp_path), ["apply.executor_write_mb=off"]).apply.executor_write_mb == float("inf")


def test_the_lag_alert_is_off_unless_a_threshold_is_set(tmp_path: Path) -> None:
    assert load_config(_file(tmp_path)).alert.max_lag_seconds is None
    assert load_config(_file(tmp_path, MINIMAL + "alert: {max_lag_seconds: 900}\n")).alert.max_lag_seconds == 900.0
    assert load_config(_file(tmp_path), ["alert.max_lag_seconds=1.5"]).alert.max_lag_seconds == 1.5
    assert load_config(_file(tmp_path), ["alert.max_lag_seconds=null"]).alert.max_lag_seconds is None


def test_a_bad_lag_threshold_is_one_line_naming_key_value_and_what_is_allowed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(_file(tmp_path, MINIMAL + "alert:\n  max_lag_seconds: 15 minutes\n"))
    assert str(refused.value) == (
        "configuration key 'alert.max_lag_seconds': '15 minutes' is not allowed; "
        "use a number of seconds > 0, or null for no lag alert"
    )


def test_a_missing_required_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'output_dir'.*required"):
        load_config(_file(tmp_path, "configuration_name: a\nintermediate_dir: in\ntarget: {path: t}\n"))


def test_an_unreadable_or_non_mapping_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="YAML mapping"):
        load_config(_file(tmp_path, "- a\n- b\n"))


def test_the_demo_config_in_the_repository_is_valid() -> None:
    config = load_config(Path(__file__).resolve().parents[1] / "config" / "demo.yaml")
    assert config.configuration_name == "demo" and config.target.type == "delta"


def test_a_postgres_target_needs_a_url_and_takes_a_schema_map(tmp_path: Path) -> None:
    text = "configuration_name: c\nintermediate_dir: i\noutput_dir: o\n"
    with pytest.raises(ConfigError, match=r"target\.url.*required"):
        load_config(_file(tmp_path, text + "target: {type: postgres}\n"))
    config = load_config(
        _file(
            tmp_path,
            text + "apply: {threads: 2}\ntarget:\n  type: postgres\n  url: host=db dbname=w\n"
            "  schema_map: {shop: replica_shop}\n",
        )
    )
    assert (config.target.type, config.target.url, config.target.path) == ("postgres", "host=db dbname=w", None)
    assert dict(config.target.schema_map) == {"shop": "replica_shop"} and config.apply.threads == 2
    with pytest.raises(ConfigError, match=r"apply\.threads.*0"):
        load_config(_file(tmp_path, text + "target: {path: t}\n"), ["apply.threads=0"])
    with pytest.raises(ConfigError, match=r"target\.schema_map\.shop"):
        load_config(_file(tmp_path, text + "target: {path: t}\n"), ["target.schema_map.shop=a\tb"])


@pytest.mark.parametrize(
    "secret_setting",
    [
        "target.uri=postgres://app:s3cret@db.example:5432/warehouse",
        "target.uri=host=db.example user=app password=s3cret dbname=warehouse",
        "target.url_=postgresql://app@db.example/warehouse?sslmode=require&password=s3cret",
    ],
)
def test_a_misspelt_key_never_echoes_a_password(tmp_path: Path, secret_setting: str) -> None:
    key, value = secret_setting.split("=", 1)
    with pytest.raises(ConfigError) as on_the_command_line:
        load_config(_file(tmp_path), [secret_setting])
    in_a_file = _file(tmp_path, MINIMAL.replace("target:\n", f"target:\n  {key.split('.')[1]}: '{value}'\n"))
    with pytest.raises(ConfigError) as in_the_file:
        load_config(in_a_file)
    for refused in (on_the_command_line.value, in_the_file.value):
        message = str(refused)
        assert "s3cret" not in message and "***" in message, message
        assert f"'{key}'" in message and "db.example" in message and "unknown key" in message


def test_show_row_values_is_off_unless_asked(tmp_path: Path) -> None:
    assert load_config(_file(tmp_path)).target.show_row_values is False
    assert load_config(_file(tmp_path), ["target.show_row_values=true"]).target.show_row_values is True
    with pytest.raises(ConfigError, match=r"target\.show_row_values.*true or false"):
        load_config(_file(tmp_path), ["target.show_row_values=sometimes"])


def test_error_actions_are_per_class_and_transient_classes_only_stop(tmp_path: Path) -> None:
    base = ["configuration_name=c", f"intermediate_dir={tmp_path}", f"output_dir={tmp_path}", f"target.path={tmp_path}"]
    config = load_config(None, [*base, "errors.actions.check=log", "errors.actions.lock=retry_stop"])
    assert config.errors.action("check") == "log" and config.errors.action("unique") == "stop"
    assert config.errors.command_retry == 3 and config.apply.retry_split == 3
    assert config.apply.compile_retry_threshold == 100
    for setting, named in [
        ("errors.actions.lock=log", "a transient class is retried"),
        ("errors.actions.nosuch=log", "unknown error class"),
        ("errors.actions.check=shrug", "use one of: ignore, warn, retry_log, log, retry_stop, stop"),
        ("apply.retry_split=4", "split in 3 (HVAR) or 2"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(named)):
            load_config(None, [*base, setting])


def test_collisions_warn_by_default_and_command_convert_names_sap_conversions(tmp_path: Path) -> None:
    base = ["configuration_name=c", f"intermediate_dir={tmp_path}", f"output_dir={tmp_path}", f"target.path={tmp_path}"]
    config = load_config(None, base)
    assert config.errors.action("collision") == "warn" and config.apply.command_convert == frozenset()
    config = load_config(None, [*base, "apply.command_convert=i2di, d2none", "errors.actions.collision=log"])
    assert config.apply.command_convert == {"i2di", "d2none"} and config.errors.action("collision") == "log"
    assert load_config(None, [*base, "apply.command_convert=none"]).apply.command_convert == frozenset()
    file = tmp_path / "c.yaml"
    file.write_text(
        f"configuration_name: c\nintermediate_dir: {tmp_path}\noutput_dir: {tmp_path}\n"
        f"target: {{path: {tmp_path}}}\napply: {{command_convert: [u2di]}}\n"
    )
    assert load_config(file).apply.command_convert == {"u2di"}
    with pytest.raises(ConfigError, match=r"apply\.command_convert.*unknown conversion 'u2none'"):
        load_config(None, [*base, "apply.command_convert=u2di,u2none"])


def test_flow_control_defaults_and_the_low_water_mark(tmp_path: Path) -> None:
    extract = load_config(_file(tmp_path)).extract
    assert (extract.max_backlog_mb, extract.resume_backlog_mb, extract.warn_retained_wal_mb) == (1024, None, 4096)
    assert extract.resume_backlog_bytes == 512 * 1024 * 1024, "half the limit by default"
    marks = load_config(_file(tmp_path), ["extract.max_backlog_mb=100", "extract.resume_backlog_mb=90"]).extract
    assert marks.resume_backlog_bytes == 90 * 1024 * 1024
    unlimited = load_config(_file(tmp_path), ["extract.max_backlog_mb=0", "extract.resume_backlog_mb=5"]).extract
    assert unlimited.max_backlog_mb == 0, "no limit: the low-water mark is never used"


def test_a_bad_flow_control_value_is_one_line_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from applier.cli import main

    assert main(["status", "--config", str(_file(tmp_path)), "--set", "extract.max_backlog_mb=-5"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "applier: error: configuration key 'extract.max_backlog_mb': -5 is not allowed; use a number of MiB >= 0 "
        "(unapplied backlog that holds extraction back; 0 means no limit)\n"
    )
