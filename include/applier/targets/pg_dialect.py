"""The PostgreSQL dialect (``target.type: postgres``): the database ``target.url`` names.

Registered in :mod:`applier.targets.dialects`. The rest of the PostgreSQL target:

- the target itself, one transaction per cycle or part with its checkpoint
  row: :mod:`applier.targets.postgres` (:mod:`applier.targets.pg_checkpoint`);
- types, DDL and the set-wise SQL (staging tables, merges, copies):
  :mod:`applier.targets.pg_sql`; COPY data and rows read back: :mod:`applier.targets.pg_load`;
- set-wise and log-order apply, table preparation: :mod:`applier.targets.pg_apply`;
- error classes, transient errors, the failing key: :mod:`applier.targets.pg_errors`;
  connections and errors turned into target errors: :mod:`applier.targets.pg_connections`;
- drift: :mod:`applier.targets.pg_drift`; the run lock: :mod:`applier.targets.pg_lock`;
  the exceptions store: :mod:`applier.targets.pg_exceptions`;
- how Spark reads a table (the target reads it into Arrow, Spark takes the
  Arrow table): :func:`applier.validate.read.read_through_arrow`.

The password is never a setting: libpq reads it from ``PGPASSWORD`` (or ``~/.pgpass``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from applier.errors import ConfigError

if TYPE_CHECKING:
    from applier.config import Config, TargetConfig
    from applier.targets import Target
    from applier.targets.dialects import TargetConnection


class PostgresDialect:
    """A PostgreSQL database; a ``postgres`` connection's host, port, login and database name it."""

    name = "postgres"
    required_keys: tuple[str, ...] = ("target.url",)
    conn_type = "postgres"
    conn_hint = "'postgres'"
    password_env: str | None = "PGPASSWORD"

    def open(self, config: Config) -> Target:
        from applier.targets.collisions import Collisions
        from applier.targets.postgres import PostgresTarget

        if config.target.url is None:
            raise ConfigError("target.url", None, "a connection string is required for target.type postgres")
        return PostgresTarget(
            config.target.url,
            config.configuration_name,
            schema_map=config.target.schema_map,
            threads=config.apply.threads,
            show_row_values=config.target.show_row_values,
            lock_timeout_s=config.target.lock_timeout_s,
            statement_timeout_s=config.target.statement_timeout_s,
            collisions=Collisions.of(config),
            executor_write_mb=config.apply.executor_write_mb,
        )

    def read_arrow(self, config: Config, table: str) -> Any | None:
        return self.open(config).read_arrow(table)

    def read_table(self, config: Config, spark: Any, table: str) -> Any | None:
        from applier.validate.read import read_through_arrow

        return read_through_arrow(spark, self.open(config), table)

    def asset_uri(self, target: TargetConfig, table: str) -> str | None:
        """``postgres://<host>:<port>/<database>/<schema>/<table>``: the PostgreSQL provider's form.

        The schema is mapped by ``target.schema_map``; the password is never included.
        """
        if target.url is None:
            return None
        from psycopg.conninfo import conninfo_to_dict

        schema, _, name = table.partition(".")
        params = conninfo_to_dict(target.url)
        where = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}/{params.get('dbname') or ''}"
        return f"postgres://{where}/{target.schema_map.get(schema, schema)}/{name}"

    def where(self, target: TargetConfig) -> str:
        from applier.targets.pg_connections import redacted

        return f"postgres tables in {redacted(target.url or '')}"

    def settings(self, conn: TargetConnection, conn_id: str) -> list[str]:
        """``target.type``, ``target.url`` from host, port, login and database, ``target.schema_map.*`` from extra.

        The password is not among them: it travels in :attr:`password_env`.
        """
        from psycopg.conninfo import make_conninfo

        if not conn.host:
            raise ValueError(f"connection {conn_id}: a postgres target connection needs a host")
        fields = {"host": conn.host, "port": conn.port, "user": conn.login, "dbname": conn.database}
        url = make_conninfo(**{k: str(v) for k, v in fields.items() if v})
        maps = conn.extra.get("schema_map") or {}
        if not isinstance(maps, Mapping):
            raise ValueError(f"connection {conn_id}: extra 'schema_map' must map source to target schemas")
        return [
            f"target.type={self.name}",
            f"target.url={url}",
            *(f"target.schema_map.{k}={v}" for k, v in maps.items()),
        ]
