"""Collisions: where the log and a target table disagree about a row.

A change collides when its table does not hold what the log says it held:

- an **insert** whose key holds a row already;
- an **update** that finds no row under its key (or, in a table without a key,
  no row of its before image);
- a **delete** that finds no row.

They happen when a table was changed behind the Applier's back, restored from
an older backup, or loaded by a copy that overlaps the change stream (a
materialization). A target applies a collision as an upsert would: the
inserted or updated row ends as the log's final row, a delete of nothing does
nothing. What else happens is the error action of the class ``collision``:

- ``warn`` (the default) and ``ignore``: applied as above; the cycle report
  counts them per table, and ``warn`` logs them;
- any other action refuses the transaction like a constraint would, so the
  enhanced retry finds it and the action (``log``, ``stop``, ...) applies.

``apply.command_convert`` (SAP Replication Server's ``dsi_command_convert``)
names the conversions that are intended, for a recovery or a copy known to
overlap: ``i2di`` (an insert is a delete and insert), ``u2di`` (an update is a
delete and insert), ``d2none`` (a delete may find nothing). Those are neither
counted nor refused.

A table a nonatomic materialization is copying (its pairs name it in
``cdc.autocorrect``, see docs/materialization.md) is *autocorrected* for the
cycle: its collisions are the copy overlapping the change stream, intended,
so neither counted nor refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from applier.errors import TargetError

if TYPE_CHECKING:
    from applier.config import Config

KINDS = ("insert", "update", "delete")
CONVERSION = {"insert": "i2di", "update": "u2di", "delete": "d2none"}
_FOUND = {
    "insert": "found their key already held",
    "update": "found no row",
    "delete": "found no row",
}


@dataclass(frozen=True)
class Collisions:
    """What a target does about collisions (see the module docstring).

    Args:
        convert: the conversions of ``apply.command_convert``, neither counted nor refused.
        refuse: whether a counted collision refuses its part (the action is
            neither ``warn`` nor ``ignore``).
        action: the configured action, named in messages.
        autocorrect: tables whose collisions this cycle are a materialization's (neither counted nor refused).
    """

    convert: frozenset[str] = frozenset()
    refuse: bool = False
    action: str = "warn"
    autocorrect: frozenset[str] = frozenset()

    @classmethod
    def of(cls, config: Config) -> Collisions:
        """The policy ``apply.command_convert`` and ``errors.actions.collision`` set."""
        action = config.errors.action("collision")
        return cls(config.apply.command_convert, action not in ("warn", "ignore"), action)

    def settle(self, table: str, found: Mapping[str, int]) -> dict[str, int]:
        """The collisions of ``table`` that count, per kind (none: an empty mapping).

        Raises:
            TargetError: ``refuse`` and some count (class ``collision``, permanent):
                the part must be rolled back.
        """
        if table in self.autocorrect:
            return {}
        counted = {kind: n for kind in KINDS if (n := found.get(kind, 0)) and CONVERSION[kind] not in self.convert}
        if counted and self.refuse:
            raise TargetError(
                f"table {table}: {describe(counted)} (errors.actions.collision is {self.action}; "
                "apply.command_convert i2di, u2di or d2none applies such changes as intended)",
                error_class="collision",
                table=table,
            )
        return counted


def describe(counted: Mapping[str, int]) -> str:
    """``2 inserts found their key already held, 1 update found no row``."""
    return ", ".join(
        f"{n} {kind}{'s' if n != 1 else ''} {_FOUND[kind].replace('their', 'its') if n == 1 else _FOUND[kind]}"
        for kind, n in counted.items()
    )


def add(into: dict[str, dict[str, int]], table: str, counted: Mapping[str, int]) -> None:
    """Add one table's counted collisions to a cycle's (per table, per kind)."""
    if not counted:
        return
    mine = into.setdefault(table, {})
    for kind, n in counted.items():
        mine[kind] = mine.get(kind, 0) + n
