"""The PostgreSQL target's checkpoint row (``applier_checkpoint``): one per configuration.

It holds the last cycle committed whole with its position (``cycle_id``,
``applied_seq``, ``applied_commit_lsn``, ``restart_seq``), how many
transactions of the next cycle are in when that cycle is applied in parts
(``part_through``), and a copy of the Applier's checkpoint (``state``). It is
written in the same transaction as the data it speaks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from applier.targets import Part, holds_part
from applier.targets import pg_sql as q

Position = tuple[int, int]
"""The last whole cycle, and how many transactions of the next one are in."""


def holds(position: Position, cycle_id: int, part: Part | None) -> bool:
    """Whether a row at ``position`` holds ``part`` of cycle ``cycle_id`` (:func:`~applier.targets.holds_part`)."""
    cycle, through = position
    return holds_part(cycle + 1, through, cycle_id, part) if through else holds_part(cycle, None, cycle_id, part)


class CheckpointRow:
    """One configuration's checkpoint row, read and written on a connection the caller holds in a transaction.

    Args:
        name: the configuration.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._ready = False

    def forget_table(self) -> None:
        """After a rollback: the table may have been created by the transaction that was undone."""
        self._ready = False

    def prepare(self, conn: psycopg.Connection[Any]) -> None:
        """Create the table, or add the columns later versions use (once, until :meth:`forget_table`)."""
        if self._ready:
            return
        conn.execute(q.create_checkpoint_table())
        conn.execute(q.add_state_column())
        conn.execute(q.add_part_column())
        self._ready = True

    def exists(self, conn: psycopg.Connection[Any]) -> bool:
        found = conn.execute("SELECT to_regclass(%s)", [q.CHECKPOINT_TABLE]).fetchone()
        return found is not None and found[0] is not None

    def position(self, conn: psycopg.Connection[Any], *, lock: bool = False) -> Position:
        """The row's position ((0, 0) without one); ``lock``: first take the configuration's commit lock."""
        if lock:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"applier {self.name}"])
        elif not self.exists(conn):
            return 0, 0
        self.prepare(conn)
        row = conn.execute(q.committed_position(), [self.name]).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def record(
        self, conn: psycopg.Connection[Any], cycle_id: int, position: Mapping[str, int], part: Part | None
    ) -> None:
        """Write the whole cycle and its position, or how far into the cycle ``part`` took it."""
        if part is None or part.final:
            values = [self.name, cycle_id, *(position.get(k, 0) for k in q.CHECKPOINT_COLUMNS[2:])]
            conn.execute(q.upsert_checkpoint(), values)
        else:
            conn.execute(q.record_part(), [self.name, cycle_id - 1, part.end])

    def state(self, conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
        """The copy of the Applier's checkpoint, if any."""
        if not self.exists(conn):
            return None
        self.prepare(conn)
        row = conn.execute(q.saved_state(), [self.name]).fetchone()
        return dict(row[0]) if row and isinstance(row[0], dict) else None

    def save_state(self, conn: psycopg.Connection[Any], state: Mapping[str, Any]) -> None:
        """Keep ``state``, the checkpoint just written."""
        self.prepare(conn)
        conn.execute(q.save_state(), [self.name, Jsonb(dict(state))])
