"""Targets: where net changes land, behind one small interface.

Everything that differs between targets sits behind :class:`Target`; the
engine never asks which target it is talking to. :func:`open_target` is the one
place that turns the configuration into a target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from applier.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from applier.config import Config
    from applier.engine.changes import TableChanges


class Target(Protocol):
    """Applies a cycle's net changes, one commit per table, tagged with the cycle."""

    def committed_cycle(self, table: str) -> int:
        """The cycle ``table``'s current state holds; 0 when it is missing or was never written.

        After the table was restored to an earlier state (a backup, a Delta
        RESTORE), the cycle of that state: restore detection and replays rely on it.
        """
        ...

    def apply(self, cycle_id: int, changes: TableChanges) -> None:
        """Apply one table's net changes of cycle ``cycle_id`` in one commit; nothing if already committed."""
        ...

    def read_arrow(self, table: str) -> pa.Table | None:
        """The table's current contents (status, validation, tests); None when it is missing."""
        ...


def open_target(config: Config) -> Target:
    """Build the configured target.

    Args:
        config: the validated configuration; ``target.type`` picks the target,
            ``configuration_name`` tags its commits.

    Returns:
        The target, ready to use; tables are created on first sight.

    Raises:
        ConfigError: the target type is unknown or its settings are missing.
    """
    if config.target.type == "delta":
        from applier.targets.delta import DeltaTarget

        if config.target.path is None:
            raise ConfigError("target.path", None, "a folder is required for target.type delta")
        return DeltaTarget(config.target.path, config.configuration_name)
    if config.target.type == "postgres":
        from applier.targets.postgres import PostgresTarget

        if config.target.url is None:
            raise ConfigError("target.url", None, "a connection string is required for target.type postgres")
        return PostgresTarget(
            config.target.url,
            config.configuration_name,
            schema_map=config.target.schema_map,
            threads=config.apply.threads,
            spill_dir=config.spill_dir,
            buffer_size=config.apply.buffer_size_for_split_records,
        )
    raise ConfigError("target.type", config.target.type, "use one of: delta, postgres")
