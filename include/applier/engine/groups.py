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

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from applier.advise.arithmetic import DEFAULT_LAYOUT, Layout, mixed_transaction_bytes

COMPILED = "compiled"
LOG_ORDER = "log order"


@dataclass(frozen=True, slots=True)
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


class Shapes(Sequence[TxnShape]):
    """Committed transactions' shapes in commit order, held as columns; a :class:`TxnShape` is made when asked for.

    A cycle holds one shape per committed transaction, 392,000 in the 4x
    benchmark workload's: as objects (and the lists of their counts) they
    took 39 MiB of the driver, as columns 10. A slice is a view of the same
    columns, as a group of a run of commit order is.

    Args:
        xids: the transactions, in commit order (kept, not copied).
        commit_lsn, commands, cdb_bytes, truncates: their fields, one value per transaction.
    """

    def __init__(
        self, xids: Sequence[str], commit_lsn: Any, commands: Any, cdb_bytes: Any, truncates: Any,
        start: int = 0, end: int | None = None,
    ) -> None:  # fmt: skip
        self.xids = xids
        self.commit_lsn = np.asarray(commit_lsn, np.int64)
        self.commands = np.asarray(commands, np.int64)
        self.cdb_bytes = np.asarray(cdb_bytes, np.int64)
        self.truncates = np.asarray(truncates, np.bool_)
        if not len(xids) == len(self.commit_lsn) == len(self.commands) == len(self.cdb_bytes) == len(self.truncates):
            raise ValueError("the shapes' columns differ in length")
        self.start, self.end = start, len(xids) if end is None else end

    @classmethod
    def of(cls, txns: Iterable[TxnShape]) -> Shapes:
        """The shapes of ``txns`` (already in commit order) as columns."""
        listed = list(txns)
        return cls(
            [t.xid for t in listed], [t.commit_lsn for t in listed], [t.commands for t in listed],
            [t.cdb_bytes for t in listed], [t.truncates for t in listed],
        )  # fmt: skip

    def __len__(self) -> int:
        return self.end - self.start

    @overload
    def __getitem__(self, at: int) -> TxnShape: ...
    @overload
    def __getitem__(self, at: slice) -> Shapes: ...
    def __getitem__(self, at: int | slice) -> TxnShape | Shapes:
        if isinstance(at, slice):
            first, last, step = at.indices(len(self))
            if step != 1:
                raise ValueError("shapes are sliced in runs of commit order")
            view = Shapes.__new__(Shapes)
            view.__dict__.update(self.__dict__)
            view.start, view.end = self.start + first, self.start + max(first, last)
            return view
        i = range(self.start, self.end)[at]
        return TxnShape(
            self.xids[i], int(self.commit_lsn[i]), int(self.commands[i]), int(self.cdb_bytes[i]),
            bool(self.truncates[i]),
        )  # fmt: skip

    def __iter__(self) -> Iterator[TxnShape]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable columns: compared by value, never hashed

    def column(self, name: str) -> Any:
        """This run's values of ``commit_lsn``, ``commands``, ``cdb_bytes`` or ``truncates`` (a numpy view)."""
        return getattr(self, name)[self.start : self.end]

    def xid_list(self) -> list[str]:
        """The transactions of this run, in commit order."""
        return list(self.xids[self.start : self.end])


def shapes_of(txns: Sequence[TxnShape]) -> Shapes:
    """``txns`` as :class:`Shapes` (themselves when they are)."""
    return txns if isinstance(txns, Shapes) else Shapes.of(txns)


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

    txns: Sequence[TxnShape]
    mode: str = COMPILED
    reason: str = ""

    @property
    def commands(self) -> int:
        return int(shapes_of(self.txns).column("commands").sum())

    @property
    def cdb_bytes(self) -> int:
        return int(shapes_of(self.txns).column("cdb_bytes").sum())

    @property
    def xids(self) -> list[str]:
        """Its transactions, in commit order."""
        return shapes_of(self.txns).xid_list()

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


def form_groups(txns: Sequence[TxnShape], limits: GroupLimits) -> list[Group]:
    """The cycle's groups, in commit order.

    Args:
        txns: the committed transactions in commit order.
        limits: the compile limits.

    Returns:
        Compilable groups, each within both limits (a lone compilable
        transaction always fits: it is within them by definition), and one
        log-order group per noncompilable transaction, in the order their
        transactions committed. Each group is a run of ``txns`` (a view, when
        they are :class:`Shapes`).

    A group takes transactions while both sums stay within the limits, so its
    end is found by bisecting the running sums of commands and bytes: the
    work grows with the groups, not with the transactions.
    """
    shapes = shapes_of(txns)
    commands, sizes = shapes.column("commands"), shapes.column("cdb_bytes")
    alone = shapes.column("truncates") | (commands > limits.max_cmds) | (sizes > limits.cdb_max_bytes)
    if not limits.compile:
        alone[:] = True
    stops = np.flatnonzero(alone)
    summed_commands = np.concatenate(([0], np.cumsum(commands)))
    summed_sizes = np.concatenate(([0], np.cumsum(sizes)))
    groups: list[Group] = []
    at, count = 0, len(shapes)
    while at < count:
        if alone[at]:
            reason = noncompilable_reason(shapes[at], limits)
            groups.append(Group(shapes[at : at + 1], LOG_ORDER, reason or ""))
            at += 1
            continue
        end = min(
            int(stops[np.searchsorted(stops, at)]) if len(stops) and stops[-1] > at else count,
            int(np.searchsorted(summed_commands, summed_commands[at] + limits.max_cmds, "right")) - 1,
            int(np.searchsorted(summed_sizes, summed_sizes[at] + limits.cdb_max_bytes, "right")) - 1,
        )
        end = max(end, at + 1)  # a lone compilable transaction is within the limits
        groups.append(Group(shapes[at:end]))
        at = end
    return groups
