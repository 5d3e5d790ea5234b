"""Net changes of a cycle's committed rows, per table (engine design, "Row ordering and net changes").

The Spark side (one job for all tables) is :mod:`applier.engine.netting`; this
module prepares its input (the committed rows) and hands the chunk files it
writes to a :class:`~applier.engine.compiled.CompiledCycle`, from which targets
take each table's :class:`~applier.engine.changes.TableChanges` when they apply it.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from applier.engine.changes import TableChanges
from applier.engine.compiled import CompiledCycle
from applier.engine.image_checks import Checks, first_refusal
from applier.engine.netting import net_changes, table_spreads
from applier.engine.queue import MemoryQueue
from applier.engine.sources import ReadTasks
from applier.errors import LateImageRefusal
from applier.intermediate.pairs import pair_name
from applier.intermediate.schema import TableDef


def last_truncate(rows: DataFrame) -> tuple[int, int] | None:
    """The position ``(commit_lsn, lsn)`` of the last ``T`` row, or None without one.

    Args:
        rows: committed rows of one table (with ``commit_lsn``).

    Returns:
        The latest truncate's position. Runs one small Spark job; the ``T``
        rows are few, so they are collected as they are (no shuffle).
    """
    truncates = rows.filter(F.col("op") == "T").select("commit_lsn", "lsn").collect()
    return max(((r["commit_lsn"], r["lsn"]) for r in truncates), default=None)


def compile_cycle(
    rows: DataFrame | ReadTasks,
    tables: Mapping[str, TableDef],
    truncates: Mapping[str, tuple[int, int]],
    touched: Iterable[str],
    into: CompiledCycle | None = None,
    *,
    partitions: int | None = None,
    weights: Mapping[str, float] | None = None,
    groups: Sequence[tuple[int, CompiledCycle]] = (),
    checks: Checks | None = None,
) -> CompiledCycle:
    """Compile a cycle's committed rows into each table's net changes, in one Spark job.

    Args:
        rows: the committed rows (``.dat`` columns plus ``commit_lsn``), ``T`` rows
            included, or the tasks that read them (:class:`~applier.engine.sources.ReadTasks`).
        tables: table definitions (the latest of the cycle) by name; must hold every touched table.
        truncates: each truncated table's last truncate position ``(commit_lsn, lsn)``.
        touched: the tables the committed rows change (from the driver's reading).
        into: where the chunks go (None: an unbounded holder in a temporary folder, for tests).
        partitions: shuffle partitions of the job (None: the session's setting).
        weights: rows per table, to spread busy tables over the partitions
            (None: every table in one partition, for small cycles and tests).
        groups: the compilable groups after the first, in commit order, each
            as the commit lsn it starts at and its holder: each group's net
            changes go to its own holder, the first group's to ``into``, all
            from the one job (none: the rows are one group). Groups hold no
            truncate (a truncating transaction is applied on its own).
        checks: the pairs whose images the job checks first (see
            :func:`~applier.engine.netting.net_changes`; ``rows`` then read
            tasks that keep every row, :func:`~applier.engine.sources.read_tasks` with ``checks``).

    Returns:
        The compiled cycle: every touched table (empty changes when its rows net
        to nothing), its net row counts (``stats``: ``I``/``U``/``D``, for a
        table without a key copies inserted and deleted, and ``T`` 1 when the
        table is truncated first) and its changes, taken table by table.

    Raises:
        LateImageRefusal: an image of a pair in ``checks`` breaks the spec.
        pyspark.errors.PySparkException: a value in an image does not fit its
            type (images are checked first, so this means a broken input).
    """
    names = sorted(set(touched) | set(truncates))
    if into is None:
        spill = Path(tempfile.mkdtemp(prefix="applier-compile-"))
        into = CompiledCycle({n: tables[n] for n in names}, frozenset(truncates), MemoryQueue(2**62), spill, "compile")
        weakref.finalize(into, shutil.rmtree, spill, True)  # the temporary folder goes with its holder
    if names:
        spreads = table_spreads(weights, partitions or 1) if weights else {}
        bounds = [start for start, _ in groups]
        holders = [into, *(holder for _, holder in groups)]
        definitions = {n: tables[n] for n in names}
        chunks = net_changes(rows, definitions, truncates, str(into.folder), partitions, spreads, bounds, checks)
        _raise_refusal(into.folder)
        for chunk in chunks:
            holders[chunk["group"]].add_file(chunk["table"], Path(chunk["path"]), chunk["bytes"], chunk)
    return into


def _raise_refusal(folder: Path) -> None:
    """A pair an executor refused (recorded in ``folder``) becomes a :class:`LateImageRefusal`."""
    refused = first_refusal(folder)
    if refused is not None:
        raise LateImageRefusal(pair_name(refused.seq) + ".dat", refused.seq, refused.code, refused.detail)


def compile_table(rows: DataFrame, table: TableDef) -> TableChanges:
    """Compile one table's committed rows of a cycle into its net changes.

    Every row counts as a row of ``table``, whatever its ``table`` column says.
    Runs two Spark jobs: a small one finding the last truncate, and
    :func:`compile_cycle`'s.

    Args:
        rows: the table's committed rows (``.dat`` columns plus ``commit_lsn``),
            ``T`` rows included.
        table: the table's definition, the latest of the cycle.

    Returns:
        The table's :class:`~applier.engine.changes.TableChanges`.
    """
    rows = rows.withColumn("table", F.lit(table.name))
    at = last_truncate(rows)
    truncates = {table.name: at} if at is not None else {}
    compiled = compile_cycle(rows, {table.name: table}, truncates, [table.name])
    try:
        return compiled[table.name]
    finally:
        compiled.close()
