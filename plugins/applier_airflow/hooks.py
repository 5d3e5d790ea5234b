"""The hook: where a DAG run finds its configuration and its target.

:class:`ApplierHook` resolves, at run time only, the configuration file (an
Airflow Variable, then an environment variable, then the project's default)
and the optional target connection, into one :class:`ApplierRun`: the
validated configuration plus the overrides every task of the run uses alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook, Variable
from airflow.sdk.exceptions import AirflowNotFoundException

from applier.config import Config, load_config
from applier.targets.dialects import password_env
from applier_airflow.builders import target_overrides

PROJECT_DIR = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = PROJECT_DIR / "config" / "demo.yaml"
CONFIG_VARIABLE = "applier_config"
CONFIG_ENV = "APPLIER_CONFIG"
TARGET_CONN_ID = "applier_target"


@dataclass(frozen=True)
class ApplierRun:
    """One DAG run's view of the Applier.

    Attributes:
        config_path: the configuration file.
        overrides: ``key=value`` overrides on top of it (target connection, then params).
        config: the validated configuration with the overrides applied.
    """

    config_path: Path
    overrides: tuple[str, ...]
    config: Config


class ApplierHook(BaseHook):
    """Finds the configuration and the target connection of a run.

    Args:
        config_path: an explicit configuration file; None discovers it.
        config_variable: the Airflow Variable naming the configuration file.
        target_conn_id: the optional connection naming the target (type ``fs``,
            extra ``{"path": "/absolute/folder"}``).
    """

    conn_name_attr = "target_conn_id"
    default_conn_name = TARGET_CONN_ID
    conn_type = "fs"
    hook_name = "Applier target"

    def __init__(
        self,
        *,
        config_path: str | None = None,
        config_variable: str = CONFIG_VARIABLE,
        target_conn_id: str = TARGET_CONN_ID,
    ) -> None:
        super().__init__()
        self.explicit_config = config_path
        self.config_variable = config_variable
        self.target_conn_id = target_conn_id

    def get_conn(self) -> Any:
        """The target connection, or None when it is not defined."""
        try:
            return self.get_connection(self.target_conn_id)
        except AirflowNotFoundException:
            return None

    def config_path(self) -> Path:
        """The configuration file: explicit, else the Variable, else ``$APPLIER_CONFIG``, else the project's.

        A relative path is relative to the project folder (the one holding
        ``dags/`` and ``plugins/``), not to the worker's current directory.
        """
        chosen = self.explicit_config or Variable.get(self.config_variable, default=None) or os.environ.get(CONFIG_ENV)
        path = PROJECT_DIR / chosen if chosen else DEFAULT_CONFIG
        self.log.info("configuration file %s", path)
        return path

    def target_overrides(self) -> list[str]:
        """The overrides the target connection carries; none when it is not defined."""
        conn = self.get_conn()
        if conn is None:
            return []
        variable = password_env(conn.conn_type or "")
        if variable and conn.password:
            # The driver (libpq) reads it from the environment, here and in the spark-submit child:
            # never on a command line.
            os.environ[variable] = conn.password
        return target_overrides(
            conn.conn_type or "",
            conn.extra_dejson,
            self.target_conn_id,
            host=conn.host,
            port=conn.port,
            login=conn.login,
            database=conn.schema,
        )

    def resolve(self, param_overrides: list[str]) -> ApplierRun:
        """Load the run's configuration with the target connection's and the params' overrides.

        Args:
            param_overrides: ``key=value`` overrides from the run's params.

        Raises:
            ConfigError: the file or an override is not a valid configuration.
            ValueError: the target connection is not usable.
        """
        path = self.config_path()
        overrides = (*self.target_overrides(), *param_overrides)
        return ApplierRun(path, overrides, load_config(path, overrides))
