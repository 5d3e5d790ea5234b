"""Which tables each transaction touches, and where it truncates, from a batch of rows.

The driver reads every row once (to check it), so it learns these cheaply with
pyarrow. The compiler needs them before Spark reads the rows again: the tables
a cycle changes decide what is compiled, and each table's last truncate decides
which of its rows still take effect.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.intermediate.row_facts import transaction_tables

Truncate = tuple[str, int]
"""A ``T`` row of a transaction: ``(table, lsn)``."""


def table_touches(rows: pa.Table) -> list[tuple[str, str]]:
    """The distinct ``(xid, table)`` pairs of a batch of ``.dat`` rows."""
    counted = transaction_tables(rows)
    return list(zip(counted["xid"].to_pylist(), counted["table"].to_pylist(), strict=True))


def longest_images(rows: pa.Table | pa.RecordBatch) -> dict[str, int]:
    """Per table, the longest image (in bytes) of a batch of ``.dat`` rows: a bound on a row's variable-length part.

    Rows read without their images (re-reading pairs to rebuild buffers) give none.
    """
    if rows.num_rows == 0 or "after" not in rows.schema.names or "before" not in rows.schema.names:
        return {}
    lengths = pc.max_element_wise(
        pc.binary_length(rows.column("after")), pc.binary_length(rows.column("before")), skip_nulls=True
    )
    # numpy rather than Arrow's group_by: its first call imports Acero and pandas, 0.3-0.4 s of each Spark worker
    tables = rows.column("table")
    encoded = (tables.combine_chunks() if isinstance(tables, pa.ChunkedArray) else tables).dictionary_encode()
    longest = np.zeros(len(encoded.dictionary), np.int64)
    np.maximum.at(longest, encoded.indices.to_numpy(), pc.fill_null(lengths, 0).to_numpy(zero_copy_only=False))
    return dict(zip(encoded.dictionary.to_pylist(), longest.tolist(), strict=True))


def merge_longest(into: dict[str, int], longest: Mapping[str, int]) -> None:
    """Keep in ``into`` the larger of each table's longest image and ``longest``'s."""
    for table, n in longest.items():
        if n > into.get(table, 0):
            into[table] = n


def truncate_rows(rows: pa.Table) -> list[tuple[str, Truncate]]:
    """The ``T`` rows of a batch as ``(xid, (table, lsn))``."""
    if rows.num_rows == 0:
        return []
    found = rows.filter(pc.equal(rows.column("op"), "T"))
    columns = (found.column(name).to_pylist() for name in ("xid", "table", "lsn"))
    return [(xid, (table, lsn)) for xid, table, lsn in zip(*columns, strict=True)]


def last_truncates(commits: Mapping[str, int], truncates: Iterable[tuple[str, Truncate]]) -> dict[str, tuple[int, int]]:
    """Each table's last truncate among committed transactions, as its position ``(commit_lsn, lsn)``.

    Args:
        commits: xid -> commit lsn of the committed transactions.
        truncates: ``(xid, (table, lsn))`` of ``T`` rows; those of other xids are ignored.

    Returns:
        ``{table: (commit_lsn, lsn)}`` for every table a committed transaction truncates.
    """
    last: dict[str, tuple[int, int]] = {}
    for xid, (table, lsn) in truncates:
        commit_lsn = commits.get(xid)
        if commit_lsn is not None:
            last[table] = max(last.get(table, (commit_lsn, lsn)), (commit_lsn, lsn))
    return last
