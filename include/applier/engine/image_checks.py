"""Row images checked on Spark's executors, pair by pair, as the compile job decodes the rows.

The driver reads a cycle's pairs without decoding their images
(:mod:`applier.engine.reading`); the compile job's first Python step checks
every row of them against its own pair's definitions with the reader's rules
(:func:`applier.intermediate.images.check_rows`), so the executors refuse
exactly what the reader refuses. A refusal fails the job with a text the driver
finds (:data:`REFUSED`) and turns into a
:class:`~applier.errors.LateImageRefusal`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from applier.intermediate.images import Checked, ImageProblem, ImageRules, check_rows
from applier.intermediate.schema import TableDef

REFUSED = "applier-image-refused"
"""Marks an executor's refusal of a row image in the text of the failed Spark job (see :func:`refusal`)."""

Checks = Mapping[int, Mapping[str, TableDef]]
"""The pairs whose images a compile job checks: seq -> the pair's table definitions (``cdc.tables``)."""


def refusal(seq: int, lsn: int, xid: str, table: str, problem: ImageProblem) -> RuntimeError:
    """The error an executor raises for a refused row: the reader's words, after :data:`REFUSED` and the pair."""
    where = f"row lsn {lsn} (xid {xid}, table {table})"
    return pair_refusal(seq, f"{where} {problem.detail}", problem.code)


def pair_refusal(seq: int, detail: str, code: str) -> RuntimeError:
    """The error an executor raises for a refused pair (``detail``: the reader's words, ``code``: its code)."""
    return RuntimeError(f"{REFUSED} seq={seq}: {detail} [{code}]")


class PairRules:
    """The image rules of the pairs of ``checks``, built once per (pair, table) a batch meets.

    :func:`applier.engine.events.event_batch` asks it to check each batch
    before it computes the rows' identities: a row of a pair not in
    ``checks`` (checked before, or a buffered row) is not checked. One serves
    a partition's batches.
    """

    def __init__(self, checks: Checks) -> None:
        self.checks = checks
        self._rules: dict[tuple[int, str], ImageRules] = {}
        self._same: dict[tuple[int | None, str], bool] = {}

    def check(
        self, seqs: Sequence[int | None], tables: Sequence[str], ops: Sequence[str], befores: Sequence[Any],
        afters: Sequence[Any],
    ) -> Checked:  # fmt: skip
        """The rows checked against their own pair's definitions (:func:`~applier.intermediate.images.check_rows`)."""
        return check_rows(list(zip(seqs, tables, strict=True)), ops, befores, afters, self.rules)

    def rules(self, where: tuple[int | None, str]) -> ImageRules | None:
        """The rules of a table in a pair (None: the pair is not checked here)."""
        seq, table = where
        if seq is None or seq not in self.checks:
            return None
        rules = self._rules.get((seq, table))
        if rules is None:
            rules = self._rules[seq, table] = ImageRules.of(self.checks[seq][table])
        return rules

    def defines_as(self, where: tuple[int | None, str], tables: Mapping[str, TableDef]) -> bool:
        """Whether the pair checked here defines the table as ``tables`` does (the cycle's latest definitions)."""
        same = self._same.get(where)
        if same is None:
            seq, name = where
            pair = None if seq is None else self.checks.get(seq)
            same = self._same[where] = pair is not None and pair[name] == tables.get(name)
        return same
