"""Entry point of the shaped profiles: set up the log and run the profile's runner."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from applier.generate.clock import SimClock
from applier.generate.runner import RunState
from applier.generate.shapes.many_open import ManyOpenRunner
from applier.generate.shapes.ops import Shaped
from applier.generate.shapes.profiles import MANY_OPEN, SHAPE_PROFILES, check_columns, check_sizes, check_tables
from applier.generate.shapes.tables import build_tables
from applier.generate.shapes.wide import WideRunner
from applier.generate.stream import Stream, StreamStats
from applier.intermediate.pairs import MIB
from applier.intermediate.writer import IntermediateWriter

# The lsn just below the first one written (as the shop profiles start).
FIRST_LSN = 1_000_000_000


def generate_shaped(
    out_dir: Path,
    *,
    profile: str,
    seed: int,
    transactions: int | None,
    file_size_mb: float | None,
    tables: int | None = None,
    columns: tuple[int, int] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[StreamStats, RunState]:
    """Write the shaped workload ``profile`` to ``out_dir``; the same arguments write the same bytes.

    Args:
        out_dir: where the pairs go (created if missing; the caller checks it holds none).
        profile: a key of :data:`SHAPE_PROFILES`.
        seed: the random seed; it also decides the table set.
        transactions: ordinary transactions; None for the profile's default.
        file_size_mb: pair size (MiB) at which the writer rotates; None for the profile's default.
        tables: number of tables; None for the profile's default (only profiles that take it).
        columns: fewest and most columns of a table; None for the profile's default.
        progress: called with ``(finished, total)`` now and then.

    Returns:
        The stream's totals and the run's figures.

    Raises:
        ValueError: an unknown profile, a sizing option the profile does not take, or a
            count or size out of range.
    """
    shape = SHAPE_PROFILES.get(profile)
    if shape is None:
        raise ValueError(f"unknown shaped profile {profile!r}; allowed: {', '.join(SHAPE_PROFILES)}")
    for option, value in (("tables", tables), ("columns", columns)):
        if value is not None and option not in shape.options:
            raise ValueError(f"profile {profile} does not take {option}; it sizes its own table set")
    total = shape.transactions if transactions is None else transactions
    size_mb = shape.file_size_mb if file_size_mb is None else file_size_mb
    check_sizes(total, size_mb)
    table_count, column_range = tables or shape.tables, columns or shape.columns
    check_tables(table_count)
    check_columns(column_range)
    rng, clock, stats = random.Random(seed), SimClock(), StreamStats()
    writer = IntermediateWriter(
        out_dir, max_file_size_bytes=max(1, int(size_mb * MIB)), clock=clock.now, on_pair=stats.add_pair
    )
    table_set = build_tables(rng, table_count, column_range)
    for table in table_set:
        writer.define_table(table.definition)
    shaped = Shaped(table_set, Stream(writer, rng, clock, stats, FIRST_LSN), rng, clock)
    runner = ManyOpenRunner if profile == MANY_OPEN else WideRunner
    state = runner(shaped, total, progress).run()
    writer.close()
    return stats, state
