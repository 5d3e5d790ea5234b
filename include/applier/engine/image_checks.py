"""Row images checked on Spark's executors, pair by pair, as the compile job decodes the rows.

The driver reads a cycle's pairs without decoding their images
(:mod:`applier.engine.reading`); the compile job's first Python step checks
every row of them against its own pair's definitions with the reader's rules
(:func:`applier.intermediate.images.rows_checker`), so the executors refuse
exactly what the reader refuses. A refusal fails the job with a text the driver
finds (:data:`REFUSED`) and turns into a
:class:`~applier.errors.LateImageRefusal`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from applier.intermediate.images import ImageProblem, RowsChecker, first_problem, rows_checker
from applier.intermediate.schema import TableDef

REFUSED = "applier-image-refused"
"""Marks an executor's refusal of a row image in the text of the failed Spark job (see :func:`refusal`)."""

Checks = Mapping[int, Mapping[str, TableDef]]
"""The pairs whose images a compile job checks: seq -> the pair's table definitions (``cdc.tables``)."""


def refusal(seq: int, lsn: int, xid: str, table: str, problem: ImageProblem) -> RuntimeError:
    """The error an executor raises for a refused row: the reader's words, after :data:`REFUSED` and the pair."""
    where = f"row lsn {lsn} (xid {xid}, table {table})"
    return RuntimeError(f"{REFUSED} seq={seq}: {where} {problem.detail} [{problem.code}]")


class PairRules:
    """The image checkers of the pairs of ``checks``, built once per (pair, table) a batch meets.

    :func:`applier.engine.events.event_batch` asks it for the first wrong
    row of each batch before it decodes the rows: a row of a pair not in
    ``checks`` (checked before, or a buffered row) has no problem.
    """

    def __init__(self, checks: Checks) -> None:
        self.checks = checks
        self._checkers: dict[tuple[int, str], RowsChecker] = {}

    def first_problem(
        self, seqs: Sequence[int | None], tables: Sequence[str], ops: Sequence[str], befores: Sequence[Any],
        afters: Sequence[Any],
    ) -> tuple[int, ImageProblem] | None:  # fmt: skip
        """The first row (its index) whose images break its pair's definitions, and what is wrong; None: none."""
        return first_problem(list(zip(seqs, tables, strict=True)), ops, befores, afters, self._checker)

    def _checker(self, where: tuple[int | None, str]) -> RowsChecker | None:
        seq, table = where
        if seq is None or seq not in self.checks:
            return None
        checker = self._checkers.get((seq, table))
        if checker is None:
            checker = self._checkers[seq, table] = rows_checker(self.checks[seq][table])
        return checker
