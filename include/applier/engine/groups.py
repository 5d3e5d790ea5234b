"""Compilable groups of a cycle's committed transactions (SAP Replication Server HVAR), as pure functions.

The *group* step between reading and compiling. Committed transactions, in
commit order, are either compilable (only inserts, updates and deletes, within
the compile limits) or not:

- a transaction that truncates a table is noncompilable;
- so is one of more than ``compile_max_cmds`` commands (rows), or whose
  estimated net-change database is larger than ``cdb_max_size``.

A noncompilable transaction is applied alone, in continuous log order.
Successive compilable transactions form a compilable group; a group closes
when adding the next transaction would take it over either limit (that
transaction then starts the next group), before a noncompilable transaction,
and at once at the end of the cycle: it never waits for more.

The net-change estimate is the queue arithmetic of
:mod:`applier.advise.arithmetic` (a transaction header, then per row a row
header, a hash option and the row expanded to its full width), so the
advisor's sizes and the groups' limits speak of the same bytes.

The enhanced retry that splits a failing group is :mod:`applier.engine.split`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from applier.advise.arithmetic import DEFAULT_LAYOUT, Layout, mixed_transaction_bytes

COMPILED = "compiled"
LOG_ORDER = "log order"


@dataclass(frozen=True, slots=True)  # slots: a cycle holds one per committed transaction, 400,000 in a large one
class TxnShape:
    """What grouping needs of one committed transaction.

    Attributes:
        xid: the transaction.
        commit_lsn: its commit's lsn (groups keep commit order).
        commands: its changes (rows), ``T`` rows included.
        cdb_bytes: the estimated size of its net changes (:func:`estimate_cdb_bytes`).
        truncates: whether it truncates a table.
    """

    xid: str
    commit_lsn: int
    commands: int
    cdb_bytes: int
    truncates: bool = False


@dataclass(frozen=True)
class GroupLimits:
    """The compile limits (``apply.compile``, ``apply.compile_max_cmds``, ``apply.cdb_max_size_mb``)."""

    compile: bool = True
    max_cmds: int = 100_000
    cdb_max_bytes: int = 1024 * 1024 * 1024


@dataclass(frozen=True)
class Group:
    """Transactions applied together: compiled to one net change, or one transaction in log order.

    Attributes:
        txns: the transactions, in commit order.
        mode: :data:`COMPILED` or :data:`LOG_ORDER`.
        reason: why a transaction goes in log order (empty for a compiled group).
    """

    txns: tuple[TxnShape, ...]
    mode: str = COMPILED
    reason: str = ""

    @property
    def commands(self) -> int:
        return sum(t.commands for t in self.txns)

    @property
    def cdb_bytes(self) -> int:
        return sum(t.cdb_bytes for t in self.txns)

    @property
    def compiled(self) -> bool:
        return self.mode == COMPILED


def estimate_cdb_bytes(
    rows_by_table: Mapping[str, int], row_sizes: Mapping[str, int], layout: Layout = DEFAULT_LAYOUT
) -> int:
    """A transaction's estimated net-change size: header + rows x (row header + hash + expanded row).

    Args:
        rows_by_table: the transaction's rows per table.
        row_sizes: each table's expanded row size (variable-length columns at
            their observed maximum; :func:`~applier.advise.arithmetic.expanded_row_size`).
        layout: the row and transaction headers.
    """
    return mixed_transaction_bytes(layout, [(row_sizes[table], rows) for table, rows in rows_by_table.items()])


def noncompilable_reason(txn: TxnShape, limits: GroupLimits) -> str | None:
    """Why ``txn`` must be applied alone in log order, or None when it is compilable."""
    if not limits.compile:
        return "apply.compile is off"
    if txn.truncates:
        return "it truncates a table"
    if txn.commands > limits.max_cmds:
        return f"{txn.commands:,} commands, over apply.compile_max_cmds {limits.max_cmds:,}"
    if txn.cdb_bytes > limits.cdb_max_bytes:
        return f"about {txn.cdb_bytes:,} bytes of net changes, over apply.cdb_max_size_mb"
    return None


def form_groups(txns: Iterable[TxnShape], limits: GroupLimits) -> list[Group]:
    """The cycle's groups, in commit order.

    Args:
        txns: the committed transactions in commit order.
        limits: the compile limits.

    Returns:
        Compilable groups, each within both limits (a lone compilable
        transaction always fits: it is within them by definition), and one
        log-order group per noncompilable transaction, in the order their
        transactions committed.
    """
    groups: list[Group] = []
    current: list[TxnShape] = []
    commands = size = 0

    def close() -> None:
        nonlocal current, commands, size
        if current:
            groups.append(Group(tuple(current)))
        current, commands, size = [], 0, 0

    for txn in txns:
        reason = noncompilable_reason(txn, limits)
        if reason is not None:
            close()
            groups.append(Group((txn,), LOG_ORDER, reason))
            continue
        if current and (commands + txn.commands > limits.max_cmds or size + txn.cdb_bytes > limits.cdb_max_bytes):
            close()
        current.append(txn)
        commands += txn.commands
        size += txn.cdb_bytes
    close()
    return groups
