"""How the Delta target opens a table and reports delta-rs failures, shared by its modules.

:class:`~applier.targets.delta.DeltaTarget` and the resubmission of an
exception (:mod:`applier.targets.delta_resubmit`) write the same tables and
must fail the same way: a :class:`~applier.errors.TargetError` naming the
table, with the failure's class.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, SchemaMismatchError

from applier.errors import TargetError
from applier.targets.delta_parquet import NullInNotNull

_FAILURES = (DeltaError, pa.ArrowException, OSError, NullInNotNull)


@contextmanager
def target_errors(table: str, doing: str) -> Iterator[None]:
    """Turn delta-rs, Arrow and file-system failures into :class:`TargetError` naming the table.

    Only the first line of the cause goes into the message: delta-rs appends a
    preview of offending rows, which may hold data that does not belong in logs.
    """
    try:
        yield
    except _FAILURES as e:
        lines = str(e).strip().splitlines()
        raise TargetError(
            f"table {table}: {doing} failed: {lines[0] if lines else type(e).__name__}",
            error_class=error_class(e),
            table=table,
            code=type(e).__name__,
        ) from e


def error_class(error: Exception) -> str:
    """The class of a delta-rs failure (:data:`~applier.errors.ERROR_CLASSES`): by its type, then its message."""
    if isinstance(error, CommitFailedError):
        return "conflict"  # another writer committed first
    if isinstance(error, SchemaMismatchError):
        return "schema"
    if isinstance(error, NullInNotNull):
        return "check"  # refused as delta-rs's writer refuses a NOT NULL invariant
    if isinstance(error, DeltaError) and ("failed validation check" in str(error) or "Invariant" in str(error)):
        return "check"  # a table constraint (CHECK) or a NOT NULL invariant refused rows
    return "other"


def open_table(path: Path) -> DeltaTable | None:
    """The Delta table at ``path``, freshly opened; None when there is none."""
    return DeltaTable(str(path)) if DeltaTable.is_deltatable(str(path)) else None
