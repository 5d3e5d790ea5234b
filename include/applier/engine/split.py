"""The enhanced retry (HVAR): a failing compiled group is split until its failing transactions are found.

When a compiled group fails with a permanent error, it is rolled back and
split into ``apply.retry_split`` groups (3, as HVAR; 2, as its older
mechanism) of as near equal numbers of transactions as can be, retried in
commit order. A group of fewer commands than ``apply.compile_retry_threshold``,
or of one transaction, is not compiled again: its transactions are applied one
at a time in log order, which names the failing transaction. Every
transaction before it is applied; what happens to it, and to those after it,
is the error action's decision (``on_failure``).

With one failing transaction among ``n``, each level of splitting costs one
failed attempt and ``split - 1`` that succeed, so the attempts are at most
:func:`attempt_bound`: ``1 + split x ceil(log_split(n / leaf)) + leaf``, where
``leaf`` is the most transactions a group below the threshold holds.

This module decides only the order of attempts; applying a group is the
caller's (a target's compiled or log-order apply), so it is tested without one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from applier.engine.groups import LOG_ORDER, Group


@dataclass
class RetryOutcome:
    """What the enhanced retry of one group did.

    Attributes:
        applied: the groups that committed, in commit order.
        failed: each transaction that failed alone in log order, with its error.
        attempts: the applies made, the first (failed) one included.
        stopped: a failure's action stopped the run: nothing after it was applied.
    """

    applied: list[Group] = field(default_factory=list)
    failed: list[tuple[Group, Exception]] = field(default_factory=list)
    attempts: int = 0
    stopped: bool = False


def split_group(group: Group, parts: int) -> list[Group]:
    """``group`` cut into ``parts`` groups (fewer when it has fewer transactions) of near equal sizes, in order."""
    if parts < 2:
        raise ValueError(f"a group is split in 2 or more parts, not {parts}")
    txns = group.txns
    count = min(parts, len(txns))
    cuts = [round(i * len(txns) / count) for i in range(count + 1)]
    return [Group(txns[a:b]) for a, b in itertools.pairwise(cuts)]


def in_log_order(group: Group, reason: str) -> list[Group]:
    """Each transaction of ``group`` as a log-order group of its own."""
    return [Group((txn,), LOG_ORDER, reason) for txn in group.txns]


def enhanced_retry(
    failed: Group,
    apply: Callable[[Group], None],
    on_failure: Callable[[Group, Exception], bool],
    *,
    split: int = 3,
    threshold: int = 100,
    permanent: Callable[[Exception], bool] = lambda e: True,
) -> RetryOutcome:
    """Apply the transactions of a compiled group that failed once, finding those that fail.

    Args:
        failed: the group whose compiled apply just failed (and was rolled back).
        apply: applies a group in one target transaction, or raises and leaves
            nothing of it (a permanent error: transient ones are retried by the caller).
        on_failure: given a transaction that failed alone in log order and its
            error, carries out the error's action (retry, log, pass) and
            answers whether it stops the run; nothing after it is tried then.
        split: parts a failing group is split into.
        threshold: groups of fewer commands go to log order, transaction by transaction.
        permanent: whether an error is one splitting can find the cause of;
            any other (a transient error past its retries) is raised at once.

    Returns:
        The outcome; ``attempts`` counts the failed first apply too.
    """
    outcome = RetryOutcome(attempts=1)

    def attempt(group: Group) -> None:
        if outcome.stopped:
            return
        outcome.attempts += 1
        try:
            apply(group)
        except Exception as e:  # the target's permanent error: find the failing transaction
            if not permanent(e):
                raise
            settle(group, e)
            return
        outcome.applied.append(group)

    def settle(group: Group, error: Exception) -> None:
        if not group.compiled:  # one transaction, alone in log order: it is the failing one
            outcome.failed.append((group, error))
            outcome.stopped = on_failure(group, error)
            return
        narrow(group)

    def narrow(group: Group) -> None:
        if len(group.txns) == 1 or group.commands < threshold:
            parts = in_log_order(group, f"retry: under {threshold} commands")
        else:
            parts = split_group(group, split)
        for part in parts:
            attempt(part)

    narrow(failed)
    return outcome


def attempt_bound(transactions: int, split: int, leaf: int) -> int:
    """The most applies the enhanced retry makes for one failing transaction among ``transactions``.

    Args:
        transactions: the failing group's transactions.
        split: parts per split.
        leaf: the most transactions of a group that goes to log order (below the threshold).
    """
    levels = math.ceil(math.log(max(transactions / max(leaf, 1), 1), split))
    return 1 + split * levels + max(leaf, 1)
