"""The Delta dialect (``target.type: delta``, the default): one Delta table per source table under ``target.path``.

Registered in :mod:`applier.targets.dialects`. The rest of the Delta target:

- the target itself, its cycle logic and exactly-once tags: :mod:`applier.targets.delta`;
- types: the Arrow types of a table definition (:func:`applier.engine.changes.arrow_schema`);
  table shape (create, evolve, drift): :mod:`applier.targets.delta_schema`;
- set-wise apply (one MERGE, append or file rewrite per table and cycle):
  :mod:`applier.targets.delta_write`, :mod:`applier.targets.delta_files`,
  tables committed side by side by :mod:`applier.targets.per_table`;
- CHECK constraints checked before any table commits: :mod:`applier.targets.delta_check`;
- log order: none of its own (``log_order`` is False: a log-order transaction
  lands as a part's net change);
- error classes of delta-rs failures: :func:`applier.targets.delta_errors.error_class`;
- the cycle a table holds: :mod:`applier.targets.delta_log`; names that cannot
  land: :mod:`applier.targets.delta_names`; the exceptions store and its
  resubmission: :mod:`applier.targets.delta_exceptions`, :mod:`applier.targets.delta_resubmit`;
- how Spark reads a table (its Parquet files with delta-rs's schema, no Delta
  jars): :func:`applier.validate.read.read_delta_table`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from applier.errors import ConfigError

if TYPE_CHECKING:
    from applier.config import Config, TargetConfig
    from applier.targets import Target
    from applier.targets.dialects import TargetConnection


def _root(config: Config) -> Path:
    if config.target.path is None:
        raise ConfigError("target.path", None, "a folder is required for target.type delta")
    return config.target.path


class DeltaDialect:
    """Delta tables at ``<target.path>/<schema>/<table>``; an ``fs`` connection's extra ``path`` names the folder."""

    name = "delta"
    required_keys: tuple[str, ...] = ("target.path",)
    conn_type = "fs"
    conn_hint = "'fs' with extra path"
    password_env: str | None = None

    def open(self, config: Config) -> Target:
        from applier.targets.collisions import Collisions
        from applier.targets.delta import DeltaTarget

        return DeltaTarget(
            _root(config),
            config.configuration_name,
            threads=config.apply.threads,
            collisions=Collisions.of(config),
            executor_write_mb=config.apply.executor_write_mb,
            compact_min_files=config.target.compact_min_files,
        )

    def read_arrow(self, config: Config, table: str) -> Any | None:
        from applier.targets.delta import DeltaTarget
        from applier.validate.read import read_delta_arrow

        return read_delta_arrow(DeltaTarget(_root(config), config.configuration_name).table_path(table), table)

    def read_table(self, config: Config, spark: Any, table: str) -> Any | None:
        from applier.targets.delta import DeltaTarget
        from applier.validate.read import read_delta_table

        path = DeltaTarget(_root(config), config.configuration_name).table_path(table)
        return read_delta_table(spark, path, table)

    def asset_uri(self, target: TargetConfig, table: str) -> str | None:
        """``file:///<target.path>/<schema>/<table>``."""
        if target.path is None:
            return None
        schema, _, name = table.partition(".")
        return (Path(target.path) / schema / name).as_uri()

    def where(self, target: TargetConfig) -> str:
        return f"delta tables under {target.path}"

    def settings(self, conn: TargetConnection, conn_id: str) -> list[str]:
        """``["target.type=delta", "target.path=<path>"]`` from Airflow's File (path) connection."""
        path = conn.extra.get("path")
        if not isinstance(path, str) or not Path(path).is_absolute():
            raise ValueError(f"connection {conn_id}: extra 'path' must be an absolute folder, got {path!r}")
        return [f"target.type={self.name}", f"target.path={path}"]
