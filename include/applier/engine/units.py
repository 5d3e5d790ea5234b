"""The apply step of a cycle: its groups in commit order, and the failing transaction found when one is refused.

A cycle's committed transactions form groups (:mod:`applier.engine.groups`),
applied in commit order as parts of the cycle. When the target refuses a
group with a permanent error (a CHECK constraint, a unique index, a value out
of range), the group was rolled back whole; :func:`~applier.engine.split.enhanced_retry`
(SAP Replication Server's HVAR) then splits it into ``apply.retry_split`` groups, retried in commit order,
down to single transactions below ``apply.compile_retry_threshold`` commands.
Every transaction before a failing one is applied; the failing one meets its
error action (``errors.actions.<class>``):

- ``retry_stop`` / ``retry_log``: tried again ``errors.command_retry`` times;
- ``stop``: the run stops (exit 4) naming the transaction, its commit, its pair,
  the table and the error; everything before it stays applied and checkpointed;
- ``log``: passed, and kept with every change in the target's exceptions store;
- ``warn``: passed with a warning; ``ignore``: passed quietly.

Exactly once inside a cycle: transactions are numbered in commit order, and
each part ``[start, end)`` is recorded in the intent before the target is
touched and after it committed (:class:`~applier.engine.checkpoint.Intent`);
the target tags what it commits with the part's end
(:class:`~applier.targets.Part`), so a re-run resumes at the first
transaction not applied or passed, re-applying the part under way first.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from applier.config import ErrorsConfig
from applier.engine.groups import LOG_ORDER, Group, GroupLimits, Shapes, TxnShape, form_groups, shapes_of
from applier.engine.split import enhanced_retry
from applier.errors import TargetError, TransactionStoppedError
from applier.targets import Part

log = logging.getLogger("applier")

Changed = dict[str, tuple[bool, int]]
"""Per table: whether it was truncated, and the change in its row count."""


def commit_order(commits: Mapping[str, int]) -> list[str]:
    """The committed transactions in commit order (by commit lsn; xid for a tie, which the spec rules out)."""
    return commit_order_lsns(commits)[0]


def commit_order_lsns(commits: Mapping[str, int]) -> tuple[list[str], np.ndarray]:
    """:func:`commit_order`, and the commit lsns in that order."""
    order = sorted(commits, key=commits.__getitem__)  # a third of the time of a (lsn, xid) key per transaction
    lsns = np.fromiter(map(commits.__getitem__, order), np.int64, len(order))
    if len(lsns) > 1 and not bool((lsns[1:] > lsns[:-1]).all()):
        order.sort(key=lambda xid: (commits[xid], xid))
        lsns = np.fromiter(map(commits.__getitem__, order), np.int64, len(order))
    return order, lsns


def then(before: Changed, after: Changed) -> Changed:
    """The row-count changes of one part followed by the next's."""
    out = dict(before)
    for table, (truncated, delta) in after.items():
        was_truncated, was = out.get(table, (False, 0))
        out[table] = (True, delta) if truncated else (was_truncated, was + delta)
    return out


class ImageSizes(Protocol):
    """A cycle's size estimates, waiting for the images its compile job measures (:mod:`applier.engine.measuring`)."""

    def pending(self) -> bool:
        """Whether pairs are left to measure, which a compile of what is left would measure."""

    def shapes(self) -> Sequence[TxnShape]:
        """The cycle's shapes with every pair measured (the driver measures any pair left)."""


@dataclass
class CycleParts:
    """One cycle's committed transactions, applied part by part from where its intent left off.

    Args:
        cycle_id: the cycle.
        order: its committed transactions in commit order (:func:`commit_order`).
        shapes: what grouping needs of each of them (commands, estimated size,
            truncates), in the same order.
        apply_part: compiles and applies the transactions of a part in one
            target commit (transient errors already retried); raises
            :class:`TargetError` leaving nothing of it.
        compile_groups: compiles several groups' transactions in one job, a holder per group.
        apply_compiled: applies a part from its holder (and closes it), as ``apply_part`` does.
        apply_log_order: applies a part of one transaction change by change, as
            ``apply_part`` does; None: the target cannot, and ``apply_part``
            applies the transaction's net change instead.
        discard: closes a holder that will not be applied (the run stopped).
        pass_transaction: moves the target past a part of one failing
            transaction that its action lets by, keeping it when it logs it.
        progress: records ``(through, part_end)`` in the intent, with the
            row-count changes of the transactions before ``through`` and
            whether the part under way is being passed (not applied).
        describe: names a transaction for messages (xid, commit lsn, pair).
        errors: the error actions.
        limits: the compile limits that close a group.
        split: parts per split; ``threshold``: commands under which a group goes to log order.
        splits: whether a refused group is split whatever the error (the
            target rolls a failed part back whole); if not, only a refusal
            that committed nothing (``TargetError.nothing_applied``) is.
        together: apply the groups of what is left of the cycle as one
            compiled part first, and group by group only when the target
            refuses it (:meth:`apply_from`).
        sizes: None when ``shapes`` are final. Otherwise (with ``together``, no ``apply_log_order``)
            the size estimates wait for the images the compile job measures:
            what is left of the cycle is compiled first, as the one part it is
            applied as, and the groups are formed from :meth:`ImageSizes.shapes`;
            ``shapes`` need hold only the order and the commit lsns until then.
    """

    cycle_id: int
    order: Sequence[str]
    shapes: Sequence[TxnShape]
    apply_part: Callable[[Part, Sequence[str]], Changed]
    compile_groups: Callable[[Sequence[Sequence[str]]], list[Any]]
    apply_compiled: Callable[[Part, Any], Changed]
    discard: Callable[[Any], None]
    pass_transaction: Callable[[Part, str, TargetError, str], None]
    progress: Callable[[int, int, Changed, bool], None]
    describe: Callable[[str], str]
    errors: ErrorsConfig
    apply_log_order: Callable[[Part, str], Changed] | None = None
    limits: GroupLimits = field(default_factory=GroupLimits)
    split: int = 3
    threshold: int = 100
    splits: bool = True
    together: bool = False
    sizes: ImageSizes | None = None
    changed: Changed = field(default_factory=dict)
    groups: list[dict[str, object]] = field(default_factory=list)
    passed: list[dict[str, object]] = field(default_factory=list)
    _shapes: Shapes = field(init=False)

    def __post_init__(self) -> None:
        self._shapes = self._checked(self.shapes)
        if self.sizes is not None and not (self.together and self.apply_log_order is None):
            raise ValueError("only a target that applies a cycle's groups as one part measures images in the compile")

    def _checked(self, shapes: Sequence[TxnShape]) -> Shapes:
        made = shapes_of(shapes)
        xids = made.xids
        if xids is not self.order and (len(xids) != len(self.order) or list(xids) != list(self.order)):
            raise ValueError("the shapes are not those of the cycle's transactions, in commit order")
        return made

    def apply_from(self, through: int, part_end: int, changed: Changed | None = None) -> Changed:
        """Apply the transactions from ``through`` on: first the part under way up to ``part_end``, if any.

        ``changed``: the row-count changes of the transactions before
        ``through``, as an earlier run recorded them in the intent; the
        changes returned add those of this run's parts.

        The rest form groups (:func:`~applier.engine.groups.form_groups`). One
        compilable group is compiled and applied as one part (the whole cycle
        when nothing of it was applied yet); several are compiled together in
        one job, then applied one by one in commit order, with each
        noncompilable transaction alone, in log order, where it falls.

        With :attr:`together` (a target whose tables commit one by one, Delta),
        several groups are first applied as one part: one compiled net change,
        truncates included, and so one commit per table, however many groups
        the limits cut. Its tables commit independently whatever the parts, so
        only the number of commits differs: a part per group cost a commit per
        table per group. When the target refuses that part having committed
        nothing, the groups go one by one as above, and the enhanced retry
        finds the failing transaction as it would have.

        Raises:
            TransactionStoppedError: a failing transaction's action stops the run.
            TargetError: a transient error past its retries, or the target failed otherwise.
        """
        self.changed = dict(changed or {})
        if part_end:
            self._measured(through, compile_rest=False)  # a resumed part: the driver measures what no job did
            self._run(self._range(through, part_end), self._apply)
            through = part_end
        holder = self._measured(through)
        groups = form_groups(self._shapes[through:], self.limits)
        if len(groups) == 1 and (groups[0].compiled or holder is not None):
            self._run(groups[0], functools.partial(self._apply, holder=holder))
            return self.changed
        if self.together and len(groups) > 1 and self._together(groups, holder):
            return self.changed
        compiled = [g for g in groups if g.compiled]
        made = self.compile_groups([g.xids for g in compiled]) if compiled else []
        holders = dict(zip(map(id, compiled), made, strict=True)) if made else {}  # none: no rows to read
        try:
            for group in groups:
                self._run(group, functools.partial(self._apply, holder=holders.pop(id(group), None)))
        finally:
            for holder in holders.values():
                self.discard(holder)
        return self.changed

    def _measured(self, through: int, *, compile_rest: bool = True) -> Any:
        """Make the shapes final (:attr:`sizes`); the holder of what is left, when compiling it measured its images.

        A target that applies what is left as one compiled part whatever its
        groups (``together``, no log order of its own) compiles the same part
        before and after its groups are known.
        """
        sizes, self.sizes = self.sizes, None
        if sizes is None:
            return None
        rest = compile_rest and sizes.pending() and through < len(self.order)
        made = self.compile_groups([self.order[through:]]) if rest else []
        try:
            self._shapes = self._checked(sizes.shapes())
        except BaseException:
            for holder in made:
                self.discard(holder)
            raise
        return made[0] if made else None

    def _together(self, groups: Sequence[Group], holder: Any = None) -> bool:
        """Apply ``groups`` as one compiled part (from ``holder``, if compiled); False when the target refused it with
        nothing applied."""
        whole = self._range(self._place(groups[0].txns[0]), self._place(groups[-1].txns[-1]) + 1)  # runs in order
        try:
            self._apply(whole, holder)
        except TargetError as e:
            if not self._splittable(e):
                raise
            self.groups.append({**_entry(whole), "mode": "together", "groups": len(groups), "refused": str(e)})
            log.warning(
                "cycle %d: its %d groups were refused as one part (%s); applying them group by group",
                *(self.cycle_id, len(groups), e),
            )
            return False
        self.groups.extend({**_entry(g), "applied": "together"} for g in groups)
        return True

    def _range(self, start: int, end: int) -> Group:
        return Group(self._shapes[start:end])

    def _run(self, group: Group, first: Callable[[Group], None]) -> None:
        """Apply ``group`` by ``first``; if the target refuses it, narrow it down (or settle its one transaction)."""
        part = self._part(group)
        entry = _entry(group)
        self.groups.append(entry)
        try:
            first(group)
            return
        except TargetError as e:
            if not self._splittable(e):
                raise
            error = e
        if not group.compiled or len(group.txns) == 1:
            stopped = self._settle(Group(group.txns, LOG_ORDER, group.reason), error)
            if stopped:
                raise self._stop(group.txns[0].xid, error)
            return
        log.warning(
            "cycle %d: transactions %d..%d (%d) were refused as one group (%s); splitting it to find the "
            "failing transaction",
            *(self.cycle_id, part.start, part.end - 1, part.end - part.start, error),
        )
        outcome = enhanced_retry(
            group,
            self._apply,
            self._settle,
            split=self.split,
            threshold=self.threshold,
            permanent=lambda e: isinstance(e, TargetError) and self._splittable(e),
        )
        entry["attempts"], entry["mode"] = outcome.attempts, "retry"
        if outcome.stopped:
            failed, stop_error = outcome.failed[-1]
            raise self._stop(failed.txns[0].xid, stop_error)

    def _splittable(self, error: TargetError) -> bool:
        """Whether a refusal can be narrowed down: permanent, and nothing of the refused part is in the target."""
        return not error.transient and (self.splits or error.nothing_applied)

    def _part(self, group: Group) -> Part:
        return Part(self._place(group.txns[0]), self._place(group.txns[-1]) + 1, len(self.order))

    def _place(self, txn: TxnShape) -> int:
        """The index of ``txn`` in the cycle's commit order (by its commit lsn: no map from every xid)."""
        return int(np.searchsorted(self._shapes.column("commit_lsn"), txn.commit_lsn))

    def _apply(self, group: Group, holder: Any = None) -> None:
        """Apply ``group`` as one part: compiled now, or from ``holder`` (compiled with the other groups)."""
        part = self._part(group)
        self.progress(part.start, part.end, self.changed, False)
        if holder is None and not group.compiled and self.apply_log_order is not None:
            changed = self.apply_log_order(part, group.txns[0].xid)
        elif holder is None:
            changed = self.apply_part(part, group.xids)
        else:
            changed = self.apply_compiled(part, holder)
        self.changed = then(self.changed, changed)
        self.progress(part.end, 0, self.changed, False)

    def _settle(self, group: Group, error: Exception) -> bool:
        """Carry out the action for one transaction that failed alone; True when it stops the run."""
        assert isinstance(error, TargetError)
        xid = group.txns[0].xid
        action = self.errors.action(error.error_class)
        if action.startswith("retry_"):
            for _ in range(self.errors.command_retry):
                try:
                    self._apply(group)
                    return False
                except TargetError as e:
                    if not self._splittable(e):
                        raise
                    error = e
            action = action.removeprefix("retry_")
        if action == "stop":
            return True
        part = self._part(group)
        self.progress(part.start, part.end, self.changed, True)  # a kill from here on: no rows to count for it
        self.pass_transaction(part, xid, error, action)
        self.progress(part.end, 0, self.changed, False)
        self.passed.append({"xid": xid, "action": action, "class": error.error_class, "table": error.table})
        (log.info if action == "ignore" else log.warning)(
            "cycle %d: %s was refused and passed (errors.actions.%s: %s): %s",
            *(self.cycle_id, self.describe(xid), error.error_class, action, error),
        )
        return False

    def _stop(self, xid: str, error: Exception) -> TransactionStoppedError:
        assert isinstance(error, TargetError)
        before = self.order.index(xid)  # once, as the run stops
        return TransactionStoppedError(
            f"cycle {self.cycle_id}: {self.describe(xid)} was refused, and errors.actions.{error.error_class} is "
            f"{self.errors.action(error.error_class)}: {error}. The cycle's {before} transactions before it are "
            f"applied and checkpointed; fix the cause (or set errors.actions.{error.error_class} to log to keep it "
            "in the exceptions store) and run again",
            xid=xid,
            cause=error,
        )


def _entry(group: Group) -> dict[str, object]:
    """A group as the cycle report lists it."""
    entry: dict[str, object] = {
        "transactions": len(group.txns),
        "commands": group.commands,
        "cdb_bytes": group.cdb_bytes,
        "mode": group.mode,
        "attempts": 1,
    }
    if group.reason:
        entry["reason"] = group.reason
    return entry
