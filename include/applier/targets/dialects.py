"""The registry of target dialects: everything that differs per ``target.type``, found in one place.

A *dialect* is what the rest of the Applier needs to know about one kind of
target before it holds a :class:`~applier.targets.Target`: which settings the
type requires, how to open it, how validation reads one of its tables into
Spark, the asset URI of a table (Airflow's lineage), and how a connection's
plain fields become ``target.*`` settings. The Delta dialect is
:mod:`applier.targets.delta_dialect`, the PostgreSQL dialect
:mod:`applier.targets.pg_dialect`; each module's docstring points to the
modules that hold the rest of its target (types, DDL, set-wise and log-order
apply, error classes).

Configuration (:mod:`applier.config`), :func:`applier.targets.open_target`,
validation (:mod:`applier.validate.read`) and the Airflow plugin ask this
module, never compare a ``target.type`` or a connection type with a name: a
new target type is one more dialect in :data:`DIALECTS`. Nothing here imports
a target's driver (delta-rs, psycopg) or Spark until a dialect is used, and
nothing imports Airflow: a connection arrives as :class:`TargetConnection`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from applier.errors import ConfigError
from applier.targets.delta_dialect import DeltaDialect
from applier.targets.pg_dialect import PostgresDialect

if TYPE_CHECKING:
    from applier.config import Config, TargetConfig
    from applier.targets import Target


@dataclass(frozen=True)
class TargetConnection:
    """A target connection's plain fields (an Airflow connection's, without Airflow and without the password).

    Attributes:
        conn_type: the connection's type (``fs``, ``postgres``).
        host, port, login, database: its fields; ``database`` is Airflow's *schema* field.
        extra: its extra, as a mapping.
    """

    conn_type: str
    host: str | None = None
    port: int | None = None
    login: str | None = None
    database: str | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@runtime_checkable
class Dialect(Protocol):
    """What one target type is, to everything outside the target itself.

    Attributes:
        name: its ``target.type``.
        required_keys: the ``target.*`` settings a configuration of this type
            must set (another type's required settings are optional to it).
        conn_type: the type of a connection that names such a target.
        conn_hint: how an error names that connection type and what it needs.
        password_env: the environment variable the target's driver reads a
            connection's password from (never a setting, never a command
            line); None when the target has no password.
    """

    name: str
    required_keys: tuple[str, ...]
    conn_type: str
    conn_hint: str
    password_env: str | None

    def open(self, config: Config) -> Target:
        """The configured target, ready to use (:func:`applier.targets.open_target`).

        Raises:
            ConfigError: a required setting is missing.
        """
        ...

    def read_arrow(self, config: Config, table: str) -> Any | None:
        """``table``'s current contents as an Arrow table; None when the target lacks it (validation, in memory).

        Raises:
            ConfigError: a required setting is missing.
            TargetError: the table cannot be read.
        """
        ...

    def read_table(self, config: Config, spark: Any, table: str) -> Any | None:
        """``table``'s current contents as a Spark DataFrame; None when the target lacks it (validation).

        Raises:
            ConfigError: a required setting is missing.
            TargetError: the table cannot be read.
        """
        ...

    def asset_uri(self, target: TargetConfig, table: str) -> str | None:
        """The Airflow asset URI of ``table`` (``schema.table``); None when the target's location is not set."""
        ...

    def where(self, target: TargetConfig) -> str:
        """Where this target's tables are, for people (never a password)."""
        ...

    def settings(self, conn: TargetConnection, conn_id: str) -> list[str]:
        """The ``key=value`` overrides a connection of :attr:`conn_type` carries (``target.type`` first).

        Raises:
            ValueError: a field the target needs is missing or unusable, naming ``conn_id``.
        """
        ...


DIALECTS: Mapping[str, Dialect] = MappingProxyType({d.name: d for d in (DeltaDialect(), PostgresDialect())})
"""Every target type, by ``target.type``, the default first."""

TARGET_TYPES = tuple(DIALECTS)
DEFAULT_TYPE = TARGET_TYPES[0]
REQUIRED_KEYS = frozenset(key for d in DIALECTS.values() for key in d.required_keys)
"""The settings some target type requires: optional to the others."""


def dialect(kind: str, allowed: str = "use one of") -> Dialect:
    """The dialect of ``target.type`` ``kind``.

    Args:
        kind: the configured ``target.type``.
        allowed: how the error introduces the known types (``use one of``, ``validation reads``).

    Raises:
        ConfigError: ``kind`` is not a known target type.
    """
    found = DIALECTS.get(kind)
    if found is None:
        raise ConfigError("target.type", kind, f"{allowed}: {', '.join(DIALECTS)}")
    return found


def required_keys(kind: str) -> tuple[str, ...]:
    """The ``target.*`` settings target type ``kind`` requires; none for an unknown type (refused elsewhere)."""
    found = DIALECTS.get(kind)
    return found.required_keys if found is not None else ()


def asset_uri(target: TargetConfig, table: str) -> str:
    """The Airflow asset URI of one target table (see each dialect's :meth:`Dialect.asset_uri`).

    Raises:
        ValueError: the target type is unknown, or its location is not set.
    """
    found = DIALECTS.get(target.type)
    uri = found.asset_uri(target, table) if found is not None else None
    if uri is None:
        raise ValueError(f"target.type {target.type!r} without its path or url has no asset URI")
    return uri


def _by_conn_type(conn_type: str) -> Dialect | None:
    return next((d for d in DIALECTS.values() if d.conn_type == conn_type), None)


def connection_settings(conn: TargetConnection, conn_id: str) -> list[str]:
    """The ``key=value`` overrides a target connection carries, by the dialect of its type.

    Raises:
        ValueError: no dialect takes the connection's type, or a field it needs is missing.
    """
    found = _by_conn_type(conn.conn_type)
    if found is None:
        hints = [d.conn_hint for d in DIALECTS.values()]
        choices = f"{', '.join(hints[:-1])}, or {hints[-1]}" if len(hints) > 1 else hints[0]
        raise ValueError(f"connection {conn_id}: type {conn.conn_type!r} is not supported; use {choices}")
    return found.settings(conn, conn_id)


def password_env(conn_type: str) -> str | None:
    """The environment variable a connection of ``conn_type`` hands its password in; None: it has none."""
    found = _by_conn_type(conn_type)
    return found.password_env if found is not None else None
