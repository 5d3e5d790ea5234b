"""The registry of target dialects: each provides every piece, and every target switch goes through it."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest

from airflow_support import airflow_home  # noqa: F401  (airflow_home: session fixture)
from applier import config as config_module
from applier.config import Config, TargetConfig, load_config
from applier.errors import ConfigError
from applier.targets import dialects, open_target
from applier.targets.dialects import DIALECTS, Dialect, TargetConnection
from applier.validate.read import read_target_arrow, read_target_table
from applier_airflow.builders import asset_uri, target_overrides

# A usable connection of each target type: a new dialect adds one.
CONNECTIONS = {
    "delta": TargetConnection("fs", extra={"path": "/data/target"}),
    "postgres": TargetConnection("postgres", host="db.example", port=5433, login="app", database="w"),
}
BASE = ["configuration_name=c", "intermediate_dir=/in", "output_dir=/out"]


def test_every_dialect_provides_each_piece() -> None:
    assert set(CONNECTIONS) == set(DIALECTS) and dialects.TARGET_TYPES[0] == dialects.DEFAULT_TYPE == "delta"
    assert config_module.TARGET_TYPES == dialects.TARGET_TYPES == ("delta", "postgres")
    for name, dialect in DIALECTS.items():
        assert isinstance(dialect, Dialect) and dialect.name == name
        assert dialect.required_keys and all(key.startswith("target.") for key in dialect.required_keys)
        assert dialect.conn_type and dialect.conn_hint
        for piece in ("open", "read_table", "asset_uri", "where", "settings"):
            assert callable(getattr(dialect, piece)), f"{name} lacks {piece}"
        assert dialects.dialect(name) is dialect
    assert len({d.conn_type for d in DIALECTS.values()}) == len(DIALECTS), "one dialect per connection type"


def test_each_dialect_points_to_modules_that_exist() -> None:
    for dialect in DIALECTS.values():
        doc = inspect.getdoc(inspect.getmodule(type(dialect))) or ""
        named = set(re.findall(r":mod:`(applier\.[\w.]+)`", doc))
        assert named, f"the {dialect.name} dialect names no modules"
        for module in named:
            assert importlib.util.find_spec(module) is not None, module


@pytest.mark.parametrize("name", sorted(CONNECTIONS))
def test_a_connection_becomes_settings_a_configuration_takes_and_an_asset_uri(name: str) -> None:
    conn = CONNECTIONS[name]
    settings = dialects.connection_settings(conn, "applier_target")
    assert settings[0] == f"target.type={name}"
    assert settings == target_overrides(
        conn.conn_type,
        conn.extra,
        "applier_target",
        host=conn.host,
        port=conn.port,
        login=conn.login,
        database=conn.database,
    )
    config = load_config(None, [*BASE, *settings])
    assert config.target.type == name
    assert asset_uri(config.target, "shop.orders") == dialects.asset_uri(config.target, "shop.orders")
    assert asset_uri(config.target, "shop.orders").endswith("/shop/orders")


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_a_type_requires_its_own_settings_and_only_those(name: str) -> None:
    for key in DIALECTS[name].required_keys:
        with pytest.raises(ConfigError, match=rf"'{re.escape(key)}'.*required"):
            load_config(None, [*BASE, f"target.type={name}"])
    others = dialects.REQUIRED_KEYS - set(DIALECTS[name].required_keys)
    own = [f"{key}=x" for key in DIALECTS[name].required_keys]
    config = load_config(None, [*BASE, f"target.type={name}", *own])
    assert config.target.type == name and others  # the other types' settings were not asked for


def test_an_unknown_type_is_refused_alike_everywhere(tmp_path: Path) -> None:
    config = Config("c", tmp_path, tmp_path, target=TargetConfig("oracle", tmp_path))
    with pytest.raises(ConfigError, match=r"'target\.type'.*use one of: delta, postgres"):
        open_target(config)
    with pytest.raises(ConfigError, match=r"'target\.type'.*validation reads: delta, postgres"):
        read_target_table(config, None, "a.b")
    with pytest.raises(ValueError, match=r"target\.type 'oracle' without its path or url has no asset URI"):
        asset_uri(config.target, "a.b")
    with pytest.raises(ValueError, match="type 'mysql' is not supported; use 'fs' with extra path, or 'postgres'"):
        target_overrides("mysql", {}, "applier_target")
    assert dialects.password_env("mysql") is None
    assert dialects.password_env("postgres") == "PGPASSWORD" and dialects.password_env("fs") is None


class _Memory:
    """A made-up target type, registered only for the test below."""

    name = "memory"
    required_keys: tuple[str, ...] = ("target.path",)
    conn_type = "memory"
    conn_hint = "'memory'"
    password_env: str | None = "MEMORY_PASSWORD"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def open(self, config: Config) -> Any:
        self.calls.append("open")
        return "a memory target"

    def read_arrow(self, config: Config, table: str) -> Any | None:
        self.calls.append(f"read {table} as Arrow")
        return "an Arrow table"

    def read_table(self, config: Config, spark: Any, table: str) -> Any | None:
        self.calls.append(f"read {table}")
        return "a frame"

    def asset_uri(self, target: TargetConfig, table: str) -> str | None:
        return f"memory:///{table}"

    def where(self, target: TargetConfig) -> str:
        return "memory"

    def settings(self, conn: TargetConnection, conn_id: str) -> list[str]:
        return [f"target.type={self.name}", f"target.path={conn.extra['path']}"]


def test_a_new_target_type_is_one_registered_dialect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = _Memory()
    assert isinstance(memory, Dialect)
    monkeypatch.setattr(dialects, "DIALECTS", MappingProxyType({**DIALECTS, "memory": memory}))
    config = Config("c", tmp_path, tmp_path, target=TargetConfig("memory", tmp_path))
    assert open_target(config) == "a memory target"
    assert read_target_table(config, None, "a.b") == "a frame"
    assert read_target_arrow(config, "a.b") == "an Arrow table"
    assert memory.calls == ["open", "read a.b", "read a.b as Arrow"]
    assert asset_uri(config.target, "a.b") == "memory:///a.b"
    assert target_overrides("memory", {"path": "/m"}, "t") == ["target.type=memory", "target.path=/m"]
    assert dialects.password_env("memory") == "MEMORY_PASSWORD"
    assert dialects.required_keys("memory") == ("target.path",)
    with pytest.raises(ValueError, match="use 'fs' with extra path, 'postgres', or 'memory'"):
        target_overrides("mysql", {}, "t")


@pytest.mark.airflow
def test_the_hook_hands_a_connection_password_to_the_variable_its_dialect_names(
    monkeypatch: pytest.MonkeyPatch,
    airflow_home: Path,  # noqa: F811  (Airflow configured before the hook imports it)
) -> None:
    from applier_airflow.hooks import ApplierHook

    conn = SimpleNamespace(
        conn_type="postgres", password="s3cret", extra_dejson={}, host="db", port=5432, login="app", schema="w"
    )
    monkeypatch.setattr(ApplierHook, "get_conn", lambda self: conn)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    overrides = ApplierHook().target_overrides()
    assert overrides == ["target.type=postgres", "target.url=host=db port=5432 user=app dbname=w"]
    assert "s3cret" not in " ".join(overrides)
    assert os.environ.pop("PGPASSWORD") == "s3cret"
    conn = SimpleNamespace(
        conn_type="fs", password="unused", extra_dejson={"path": "/t"}, host=None, port=None, login=None, schema=None
    )
    assert ApplierHook().target_overrides() == ["target.type=delta", "target.path=/t"]
    assert "PGPASSWORD" not in os.environ


def test_where_the_tables_are_names_no_password() -> None:
    delta = TargetConfig(type="delta", path=Path("/data/t"))
    assert dialects.dialect("delta").where(delta) == "delta tables under /data/t"
    pg = TargetConfig(type="postgres", url="host=db dbname=replica user=app password=secret")
    assert dialects.dialect("postgres").where(pg) == "postgres tables in user=app dbname=replica host=db"
