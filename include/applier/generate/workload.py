"""The entry point: generate a seeded workload as intermediate-file pairs."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from applier.generate.clock import SimClock
from applier.generate.database import Database
from applier.generate.profiles import get_profile
from applier.generate.runner import Runner, RunState
from applier.generate.shapes.profiles import SHAPE_PROFILES, check_sizes
from applier.generate.shapes.run import generate_shaped
from applier.generate.stream import Stream, StreamStats
from applier.generate.tables import TABLE_DEFS
from applier.generate.values import RowFactory
from applier.intermediate.pairs import MIB
from applier.intermediate.writer import IntermediateWriter

# The lsn just below the first one written; any positive 64-bit value would do.
FIRST_LSN = 1_000_000_000


@dataclass(frozen=True)
class GenerateSummary:
    """What :func:`generate_workload` wrote.

    Attributes:
        out_dir: the directory holding the pairs.
        profile: the profile's name.
        seed: the random seed.
        pairs: pairs written (sequence numbers 1..pairs).
        bytes: total size of the pairs (``.dat`` plus ``.trn``).
        transactions: transactions begun in the stream.
        committed: transactions that committed.
        rolled_back: transactions that rolled back.
        left_open: transactions with a begin and no end at the end of the stream.
        empty: transactions without rows.
        rows: row changes.
        rows_per_table: row changes per ``schema.table``.
        rows_per_op: row changes per op (``I``, ``U``, ``D``, ``T``).
        first_lsn: the stream's first lsn.
        last_lsn: the stream's last lsn.
        features: the special scenarios the stream holds, sorted.
    """

    out_dir: Path
    profile: str
    seed: int
    pairs: int
    bytes: int
    transactions: int
    committed: int
    rolled_back: int
    left_open: int
    empty: int
    rows: int
    rows_per_table: Mapping[str, int]
    rows_per_op: Mapping[str, int]
    first_lsn: int
    last_lsn: int
    features: tuple[str, ...]


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and any(p.suffix in (".dat", ".trn") for p in out_dir.iterdir()):
        raise ValueError(f"{out_dir} already holds intermediate files; generate into an empty directory")


def generate_workload(
    out_dir: Path,
    *,
    seed: int = 1,
    transactions: int | None = None,
    file_size_mb: float | None = None,
    profile: str = "demo",
    progress: Callable[[int, int], None] | None = None,
    tables: int | None = None,
    columns: tuple[int, int] | None = None,
) -> GenerateSummary:
    """Write a realistic, seeded change stream to ``out_dir`` as intermediate-file pairs.

    The same arguments always give byte-identical pairs. Every stream holds the
    special cases a reader must handle (see ``scenarios.py``), however small
    ``transactions`` is; those run even past ``transactions``.

    Args:
        out_dir: where the pairs go (created if missing; must hold no pairs yet).
        seed: the random seed.
        transactions: transactions to start; None for the profile's default.
        file_size_mb: pair size (MiB) at which the writer rotates; None for the profile's default.
        profile: a name from :data:`applier.generate.PROFILES`.
        progress: called with ``(finished_transactions, total)`` now and then, and
            ``(total, total)`` at the end.
        tables: number of tables, for the profiles that take it (``wide``); None for the default.
        columns: fewest and most columns of a table, for the profiles that take it (``wide``).

    Returns:
        What was written.

    Raises:
        ValueError: unknown profile, a count or size that is not positive, a sizing
            option the profile does not take, or a directory that already holds pairs.
    """
    if profile in SHAPE_PROFILES:
        out_dir = Path(out_dir)
        _check_out_dir(out_dir)
        shaped = generate_shaped(
            out_dir,
            profile=profile,
            seed=seed,
            transactions=transactions,
            file_size_mb=file_size_mb,
            tables=tables,
            columns=columns,
            progress=progress,
        )
        return _summary(out_dir, profile, seed, *shaped)
    if tables is not None or columns is not None:
        takers = ", ".join(name for name, shape in SHAPE_PROFILES.items() if shape.options)
        raise ValueError(f"profile {profile} does not take tables or columns; only {takers} does")
    chosen = get_profile(profile)
    total = chosen.transactions if transactions is None else transactions
    size_mb = chosen.file_size_mb if file_size_mb is None else file_size_mb
    check_sizes(total, size_mb)
    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    rng, clock, stats = random.Random(seed), SimClock(), StreamStats()
    writer = IntermediateWriter(
        out_dir, max_file_size_bytes=max(1, int(size_mb * MIB)), clock=clock.now, on_pair=stats.add_pair
    )
    for definition in TABLE_DEFS:
        writer.define_table(definition)
    stream = Stream(writer, rng, clock, stats, FIRST_LSN)
    state = Runner(chosen, total, Database(TABLE_DEFS), stream, RowFactory(rng, clock), progress).run()
    writer.close()
    return _summary(out_dir, chosen.name, seed, stats, state)


def _summary(out_dir: Path, profile: str, seed: int, stats: StreamStats, state: RunState) -> GenerateSummary:
    return GenerateSummary(
        out_dir=out_dir,
        profile=profile,
        seed=seed,
        pairs=stats.pairs,
        bytes=stats.bytes,
        transactions=stats.committed + stats.rolled_back + state.left_open,
        committed=stats.committed,
        rolled_back=stats.rolled_back,
        left_open=state.left_open,
        empty=stats.empty,
        rows=stats.rows,
        rows_per_table=MappingProxyType(dict(sorted(stats.rows_per_table.items()))),
        rows_per_op=MappingProxyType(dict(sorted(stats.rows_per_op.items()))),
        first_lsn=stats.first_lsn or FIRST_LSN,
        last_lsn=stats.last_lsn or FIRST_LSN,
        features=tuple(sorted(state.features)),
    )
