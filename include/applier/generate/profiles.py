"""Workload profiles: how big, how busy and how failure-prone a generated stream is.

A profile is a frozen dataclass of figures; a new profile is usually the demo
profile with a few figures replaced (see :data:`PROFILES`). Every profile runs
the same special scenarios (key moves, truncates, long transactions, ...); the
figures only decide their size and the mix of ordinary transactions around
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from applier.generate.shapes.profiles import SHAPE_PROFILES

# Ordinary transaction kinds a profile can mix (see ``scripts.py``).
TXN_KINDS = (
    "new_order",
    "order_update",
    "price_update",
    "customer_update",
    "cart",
    "event_log",
    "cancel_order",
)


@dataclass(frozen=True)
class Profile:
    """The figures that shape one generated workload.

    Attributes:
        name: the name the CLI selects the profile by.
        description: one line for ``applier generate --help``.
        transactions: default number of transactions to start.
        file_size_mb: default pair size (MiB) at which the writer rotates.
        mix: relative weights of the ordinary transaction kinds (``TXN_KINDS``).
        changes_per_txn: typical row changes of an ordinary transaction.
        concurrency: most ordinary transactions open at once.
        rollback_rate: share of ordinary transactions that roll back.
        empty_rate: share of ordinary transactions without rows.
        initial_customers: customers loaded at the start.
        initial_products: products loaded at the start.
        initial_events: event-log rows loaded at the start.
        initial_orders: orders (with two or three lines each) loaded at the start.
        load_chunk: rows per initial-load transaction.
        long_commits: long transactions that commit.
        long_rollbacks: long transactions that roll back.
        long_open: long transactions still open at the end of the stream.
        long_rows_min: fewest rows of a long transaction (it also spans >= 3 pairs).
        long_share: share of steps given to long transactions while they run.
        open_at_end: short transactions left open at the end of the stream.
        evolve_schema: whether ``shop.customers`` gains a nullable column mid-stream.
    """

    name: str
    description: str
    transactions: int
    file_size_mb: float
    mix: Mapping[str, float]
    changes_per_txn: int = 8
    concurrency: int = 6
    rollback_rate: float = 0.05
    empty_rate: float = 0.01
    initial_customers: int = 300
    initial_products: int = 120
    initial_events: int = 200
    initial_orders: int = 100
    load_chunk: int = 100
    long_commits: int = 1
    long_rollbacks: int = 1
    long_open: int = 0
    long_rows_min: int = 3000
    long_share: float = 0.15
    open_at_end: int = 3
    evolve_schema: bool = True

    def __post_init__(self) -> None:
        unknown = sorted(set(self.mix) - set(TXN_KINDS))
        if unknown or not self.mix or min(self.mix.values()) < 0 or sum(self.mix.values()) <= 0:
            raise ValueError(f"profile {self.name}: mix {dict(self.mix)} needs positive weights of {TXN_KINDS}")
        for field_name in ("rollback_rate", "empty_rate", "long_share"):
            value = getattr(self, field_name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"profile {self.name}: {field_name}={value} must be in [0, 1)")
        if self.transactions < 1 or self.file_size_mb <= 0 or self.concurrency < 1 or self.load_chunk < 1:
            raise ValueError(f"profile {self.name}: transactions, file_size_mb, concurrency, load_chunk must be > 0")
        if self.long_rows_min < 1000:
            raise ValueError(f"profile {self.name}: long_rows_min={self.long_rows_min} must be at least 1000")


DEMO = Profile(
    name="demo",
    description="small mixed shop workload, a few dozen 0.25 MiB pairs",
    transactions=2000,
    file_size_mb=0.25,
    mix=MappingProxyType(
        {
            "new_order": 3.0,
            "order_update": 2.0,
            "price_update": 1.0,
            "customer_update": 1.5,
            "cart": 1.5,
            "event_log": 1.5,
            "cancel_order": 0.5,
        }
    ),
)

BENCH = replace(
    DEMO,
    name="bench",
    description="update-heavy, ~10 changes per transaction, 64 MiB pairs (1M changes by default)",
    transactions=100_000,
    file_size_mb=64.0,
    mix=MappingProxyType(
        {
            "new_order": 1.0,
            "order_update": 3.0,
            "price_update": 3.0,
            "customer_update": 3.0,
            "cart": 0.5,
            "event_log": 0.5,
            "cancel_order": 0.2,
        }
    ),
    changes_per_txn=10,
    concurrency=8,
    rollback_rate=0.02,
    empty_rate=0.002,
    initial_customers=20_000,
    initial_products=5_000,
    initial_events=2_000,
    initial_orders=5_000,
    load_chunk=1_000,
    long_rows_min=5_000,
    long_share=0.03,
)

ROLLBACK_HEAVY = replace(
    DEMO,
    name="rollback-heavy",
    description="demo workload where a third of transactions and most long ones roll back",
    rollback_rate=0.35,
    long_commits=1,
    long_rollbacks=3,
)

LONG_TRANSACTIONS = replace(
    DEMO,
    name="long-transactions",
    description="demo workload dominated by long transactions, one of them left open",
    long_commits=3,
    long_rollbacks=2,
    long_open=1,
    long_rows_min=5000,
    long_share=0.4,
)

PROFILES: Mapping[str, Profile] = MappingProxyType(
    {p.name: p for p in (DEMO, BENCH, ROLLBACK_HEAVY, LONG_TRANSACTIONS)}
)


def get_profile(name: str) -> Profile:
    """Return the profile called ``name``.

    Args:
        name: a key of :data:`PROFILES`.

    Returns:
        The profile.

    Raises:
        ValueError: no profile has that name; the message lists the allowed ones.
    """
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown workload profile {name!r}; allowed: {', '.join(profile_descriptions())}") from None


def profile_descriptions() -> Mapping[str, str]:
    """Every profile ``applier generate`` knows, by name: the shop profiles, then the shaped ones.

    Returns:
        Each profile's one-line description, in listing order.
    """
    every = {name: p.description for name, p in PROFILES.items()}
    every.update((name, p.description) for name, p in SHAPE_PROFILES.items())
    return MappingProxyType(every)
