"""What a pair's rows say per transaction, without the rows: what the driver's checks and a cycle's notes need.

A pair's ``.dat`` holds hundreds of thousands of rows and tens of thousands
of (transaction, table) groups: the stream checks judge each transaction's
rows by their first and last per table (:func:`transaction_tables`), and the
cycle's notes count them. :class:`RowFacts` holds that for a pair, made by
whoever read its rows: the driver, or on a cluster a Spark executor
(:mod:`applier.engine.dat_facts`, which sends back a :class:`DatFacts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from applier.intermediate.schema import TableDef

if TYPE_CHECKING:
    from applier.intermediate.reader import Header

STREAM_COLUMNS = ("lsn", "xid", "table", "op")
"""The ``.dat`` columns the stream checks read; the images are read to be checked."""


def transaction_tables(rows: pa.Table) -> pa.Table:
    """Rows of ``.dat`` per transaction and table: columns ``xid``, ``table``, ``rows``, ``first_lsn``, ``last_lsn``.

    One group-by: the stream checks judge a transaction's rows by its first
    and last per table, and a pair has tens of thousands of groups against
    hundreds of thousands of rows.
    """
    grouped = rows.select(["xid", "table", "lsn"]).group_by(["xid", "table"], use_threads=False)
    counted = grouped.aggregate([([], "count_all"), ("lsn", "min"), ("lsn", "max")])
    return counted.select(["xid", "table", "count_all", "lsn_min", "lsn_max"]).rename_columns(
        ["xid", "table", "rows", "first_lsn", "last_lsn"]
    )


@dataclass(frozen=True)
class RowFacts:
    """What the stream checks and a cycle's notes need of a pair's rows: a few rows per transaction, not every row.

    Attributes:
        count: its rows.
        bounds: the lsns of its first and last row (None: no row).
        touches: :func:`transaction_tables` of its rows.
        truncates: its ``T`` rows (columns lsn, xid, table, op).
    """

    count: int
    bounds: tuple[int, int] | None
    touches: pa.Table
    truncates: pa.Table

    @staticmethod
    def of(rows: pa.Table) -> RowFacts:
        """The facts of ``rows`` (a ``.dat``'s columns lsn, xid, table, op at least, in lsn order)."""
        bounds = (rows["lsn"][0].as_py(), rows["lsn"][-1].as_py()) if rows.num_rows else None
        stream = rows.select(list(STREAM_COLUMNS))
        truncates = stream.filter(pc.equal(stream["op"], "T")) if rows.num_rows else stream
        return RowFacts(rows.num_rows, bounds, transaction_tables(rows), truncates)


@dataclass(frozen=True)
class DatFacts:
    """What the driver needs of a pair's ``.dat`` when a Spark executor reads it.

    (:func:`applier.engine.dat_facts.read_dat_facts` makes it.)

    Attributes:
        tables: its table definitions (``cdc.tables``).
        autocorrect: its ``cdc.autocorrect`` ranges.
        rows: what its rows say (:class:`RowFacts`).
        longest_image: per table, its longest image in bytes, when asked for
            (the groups' size estimates: ``applier.engine.touches.longest_images``).
        header, events: its ``.trn``'s header and events, read and checked
            with the ``.dat`` (the events :func:`~applier.intermediate.events.packed`):
            the driver need not read the ``.trn`` again. None: it reads it.
    """

    tables: dict[str, TableDef]
    autocorrect: dict[str, tuple[int, int]]
    rows: RowFacts
    longest_image: dict[str, int] | None = None
    header: Header | None = None
    events: bytes | None = None
