"""Small files compacted as a run goes on, so that a table's cost to open stays flat.

Every data commit adds files: an append to a table without a key adds one
(or more) per cycle, and a ``MERGE`` writes its inserts into new files. A run
of thousands of small cycles leaves thousands of small files, and each of
them stays in the table's state: every later open of the table reads them
all (a keyless table of 1,900 one-cycle files took 38 ms to open, against
9 ms for a keyed one of one file with the same history), and so does every
reader of the target. Delta's answer is ``OPTIMIZE``: the small files of a
table rewritten into a few of the table's target size, in a commit that
changes no row (``dataChange`` false).

After a cycle's data commit, a table that held ``min_files`` or more files
smaller than its target size is compacted by delta-rs
(``DeltaTable.optimize.compact``): bin-packed into files of the table's
``delta.targetFileSize`` (delta-rs's default, 100 MiB, when unset). The count
comes from the snapshot the commit was checked against, so it costs no
extra read of the log; as Databricks' auto compaction does, 50 small files
trigger it by default (``target.compact_min_files``; 0 turns it off).

Exactly once is untouched: the ``OPTIMIZE`` commit carries no app
transaction and changes no row, and the held cycle is read past it
(:data:`~applier.targets.delta_log.NO_ROW_CHANGE`). A crash between the data
commit and the compaction only leaves the files for the next cycle to
compact. The files compacted are removed from the table's state, not from
storage: ``VACUUM`` stays the operator's, as does the retention it honours.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

log = logging.getLogger("applier.targets.delta")

DEFAULT_MIN_FILES = 50
DEFAULT_TARGET_BYTES = 100 * 1024 * 1024  # delta-rs's default target size for OPTIMIZE
_TARGET_SIZE = "delta.targetFileSize"


def target_bytes(table: DeltaTable) -> int:
    """The size ``OPTIMIZE`` writes files of: the table's ``delta.targetFileSize``, else delta-rs's default."""
    configured = table.metadata().configuration.get(_TARGET_SIZE)
    try:
        return int(configured) if configured else DEFAULT_TARGET_BYTES
    except ValueError:
        return DEFAULT_TARGET_BYTES


def small_files(table: DeltaTable) -> int:
    """How many of the table's files are smaller than its target size."""
    sizes = table.get_add_actions(flatten=False).column("size_bytes").to_pylist()
    limit = target_bytes(table)
    return sum(1 for size in sizes if int(size) < limit)


def due(table: DeltaTable | None, min_files: int) -> bool:
    """Whether the table, as opened before a commit that adds a file, will then hold ``min_files`` small files."""
    return table is not None and min_files > 0 and small_files(table) + 1 >= min_files


def compact(path: Path, name: str) -> dict[str, Any] | None:
    """Compact the small files of the Delta table at ``path`` (``name`` for the log); delta-rs's metrics.

    The cycle's data commit has landed: a failure here is logged as a warning
    and leaves the files for a later cycle (None), never fails the cycle.
    """
    try:
        table = DeltaTable(str(path))
        metrics: dict[str, Any] = table.optimize.compact(target_size=target_bytes(table))
    except Exception as e:  # delta-rs raises its own errors and OSError alike; the data is committed either way
        log.warning("table %s: compacting its small files failed, left for a later cycle: %s", name, e)
        return None
    removed, added = metrics.get("numFilesRemoved"), metrics.get("numFilesAdded")
    log.info("table %s: compacted %s small files into %s (OPTIMIZE)", name, removed, added)
    return metrics
