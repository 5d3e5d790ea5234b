"""Row images checked on Spark's executors, pair by pair, as the compile job decodes the rows.

The driver reads a cycle's pairs without decoding their images
(:mod:`applier.engine.reading`); the compile job's first Python step checks
every row of them against its own pair's definitions with the reader's rules
(:func:`applier.intermediate.images.row_checker`), so the executors refuse
exactly what the reader refuses. A refusal fails the job with a text the driver
finds (:data:`REFUSED`) and turns into a
:class:`~applier.errors.LateImageRefusal`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from applier.intermediate.images import ImageProblem, row_checker
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

    :func:`applier.engine.identity.event_batch` asks it of every row as it
    decodes them: a row of a pair not in ``checks`` (checked before, or a
    buffered row) has no problem.
    """

    def __init__(self, checks: Checks) -> None:
        self.checks = checks
        self._checkers: dict[tuple[int, str], Callable[[str, str | None, str | None], ImageProblem | None]] = {}

    def problem(self, seq: int | None, table: str, op: str, before: Any, after: Any) -> ImageProblem | None:
        if seq is None or seq not in self.checks:
            return None
        checker = self._checkers.get((seq, table))
        if checker is None:
            checker = self._checkers[seq, table] = row_checker(self.checks[seq][table])
        return checker(op, before, after)
