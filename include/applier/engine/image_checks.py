"""Row images checked on Spark's executors, pair by pair, as the compile job decodes the rows.

The driver reads a cycle's pairs without decoding their images
(:mod:`applier.engine.reading`); the compile job's first Python step checks
every row of them against its own pair's definitions with the reader's rules
(:func:`applier.intermediate.images.check_rows`), so the executors refuse
exactly what the reader refuses.

A refusal is a finding about the input, not a failure of the job: the
partition that finds one records it as a small file in the job's folder
(:func:`record_refusal`) and stops, the job ends normally, and the driver
reads the first refusal (:func:`first_refusal`) and turns it into a
:class:`~applier.errors.LateImageRefusal`. Raised as a task failure, it made
Spark log each attempt's Python traceback before the run's one-line error,
and retry the task on a cluster (``spark.task.maxFailures``) for a verdict
that cannot change.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from applier.intermediate.images import Checked, ImageProblem, ImageRules, check_rows
from applier.intermediate.schema import TableDef

REFUSAL_PREFIX = "refused-"
"""Names an executor's refusal file in a compile job's folder (:func:`record_refusal`)."""

REFUSAL_MARK = "refused"
"""A file of a compile job's folder once any partition refused a pair: the others stop (:func:`refused_in`)."""


class Refused(Exception):
    """An executor's refusal of a pair: the reader's words (``detail``) and code."""

    def __init__(self, seq: int, detail: str, code: str) -> None:
        super().__init__(f"pair {seq}: {detail} [{code}]")
        self.seq, self.detail, self.code = seq, detail, code


Checks = Mapping[int, Mapping[str, TableDef]]
"""The pairs whose images a compile job checks: seq -> the pair's table definitions (``cdc.tables``)."""


def refusal(seq: int, lsn: int, xid: str, table: str, problem: ImageProblem) -> Refused:
    """An executor's refusal of a row: the reader's words, after the row's place."""
    return Refused(seq, f"row lsn {lsn} (xid {xid}, table {table}) {problem.detail}", problem.code)


def record_refusal(folder: str, refused: Refused) -> None:
    """Write ``refused`` as a file of the job's ``folder``, whole or not at all (a rename)."""
    name = f"{REFUSAL_PREFIX}{refused.seq:012d}-{uuid.uuid4().hex}.json"
    part = os.path.join(folder, f".{name}.tmp")
    with open(part, "w", encoding="utf-8") as fh:
        json.dump({"seq": refused.seq, "detail": refused.detail, "code": refused.code}, fh)
    os.replace(part, os.path.join(folder, name))
    with open(os.path.join(folder, REFUSAL_MARK), "a", encoding="utf-8"):
        pass


def refused_in(folder: str) -> bool:
    """Whether a partition of the job has refused a pair (one ``stat``: asked before each batch).

    The job's result is then thrown away, so the other partitions stop too. A
    lower pair's refusal they might have found is not lost: the driver re-reads
    the cycle checking every pair up to the refused one.
    """
    return os.path.exists(os.path.join(folder, REFUSAL_MARK))


def first_refusal(folder: Path) -> Refused | None:
    """The refusal of the lowest pair the executors recorded in ``folder`` (None: none); their files are removed."""
    found = []
    for path in sorted(folder.glob(f"{REFUSAL_PREFIX}*.json")):
        raw = json.loads(path.read_text(encoding="utf-8"))
        found.append(Refused(int(raw["seq"]), str(raw["detail"]), str(raw["code"])))
        path.unlink()
    (folder / REFUSAL_MARK).unlink(missing_ok=True)
    return min(found, key=lambda r: r.seq, default=None)


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
        afters: Sequence[Any], images: tuple[pa.Array, pa.Array] | None = None,
    ) -> Checked:  # fmt: skip
        """The rows checked against their own pair's definitions (:func:`~applier.intermediate.images.check_rows`)."""
        return check_rows(list(zip(seqs, tables, strict=True)), ops, befores, afters, self.rules, images)

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
