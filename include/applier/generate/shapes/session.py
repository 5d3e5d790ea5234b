"""The shop model's database and session, taught two things the shaped tables need.

- A table without a key can be truncated: the shop model truncates keyed
  tables only, but a source truncates any table, and the Applier must cut a
  keyless table's multiset too.
- Which tables log whole before-images is a property of each shaped table,
  not the shop's fixed list.
"""

from __future__ import annotations

from applier.generate.database import ConflictError, Database
from applier.generate.model import BagTable, Txn
from applier.generate.session import Session
from applier.generate.stream import Stream
from applier.generate.values import Row, RowFactory


class ShapeDatabase(Database):
    """:class:`Database` whose truncates also empty tables without a key."""

    def stage_bag_truncate(self, txn: Txn, table: str) -> None:
        """Record that ``txn`` empties the keyless ``table``; it must own the gate and not have deleted from it.

        Args:
            txn: the truncating transaction.
            table: a table without a primary key.

        Raises:
            ConflictError: ``txn`` does not own the table alone, or already deleted copies from it
                (their reservations would outlive the emptied multiset).
        """
        if any(name == table for name, _ in txn.bag_deletes):
            raise ConflictError(f"{txn.xid} truncates {table} after deleting from it")
        self.stage_truncate(txn, table)
        txn.bag_inserts = [(name, row) for name, row in txn.bag_inserts if name != table]

    def commit(self, txn: Txn) -> None:
        """Apply ``txn``: keyless tables it truncated start empty, then its changes apply as for keyed ones.

        Args:
            txn: the committing transaction.
        """
        for table in [t for t in txn.truncated if t in self.bags]:
            del txn.truncated[table]
            self.bags[table] = BagTable(self.bags[table].definition)
        super().commit(txn)


class ShapeSession(Session):
    """:class:`Session` whose keyed tables log whole before-images when the table says so.

    Args:
        db: the simulated database.
        stream: the log changes are written to.
        rows: the shop's row factory, shared and unused here but for its random source.
        txn: the transaction this session runs.
        outcome: ``commit``, ``rollback`` or ``open``.
        full_before: names of the keyed tables that log the whole old row.
    """

    def __init__(
        self, db: Database, stream: Stream, rows: RowFactory, txn: Txn, outcome: str, full_before: frozenset[str]
    ) -> None:
        super().__init__(db, stream, rows, txn, outcome)
        self.full_before = full_before

    def _before(self, table: str, row: Row) -> Row:
        return row if table in self.full_before else self.db.pk[table].key_image(row)

    def truncate(self, table: str) -> None:
        """Empty ``table`` (keyed or not); the transaction must own the table's gate."""
        if table in self.db.bags:
            if not isinstance(self.db, ShapeDatabase):
                raise ConflictError(f"{self.txn.xid} truncates keyless {table} on a database that cannot")
            self.db.stage_bag_truncate(self.txn, table)
            self.stream.row(self.txn, table, "T", None, None)
            return
        super().truncate(table)
