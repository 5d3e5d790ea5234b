"""What the PostgreSQL benchmark's approaches would take against a server across a network: a model, not a measurement.

The benchmark's server runs on this machine, so a round trip costs about
0.05 ms. A warehouse sits across a network, and every statement an applier
waits for costs it one round trip more. The model adds to each measured time
``round trips x RTT`` and, for the compiled apply, ``bytes COPYed / bandwidth``:

- **row-by-row**: one round trip per statement, plus ``BEGIN`` and ``COMMIT``
  per source transaction (psycopg's transaction block sends both on their own);
- **per-transaction**: one per statement and per ``COPY``, plus ``BEGIN`` and
  ``COMMIT``;
- **compiled**: an upper bound of :data:`COMPILED_ROUND_TRIPS_PER_TABLE` per
  table and cycle, and :data:`COMPILED_ROUND_TRIPS_PER_CYCLE` per cycle,
  counted from :mod:`applier.targets.postgres` with room to spare (it issues
  about ten per table: staging table, ``COPY``, create or evolve, ``MERGE``,
  checks, drop; and about ten per cycle: checkpoint reads, lock, upsert,
  ``BEGIN``/``COMMIT``), plus its final rows' bytes at the given bandwidth.

Baselines are counted on their prefix and scaled to every committed
transaction, as their times are. The model leaves out that a remote server
would not share the applier's cores, which would help every approach.

:func:`measured_network_section` checks the model against a measurement:
the benchmark runs the compiled apply whole, and each baseline on a prefix,
through a relay that delays every byte (:mod:`bench.pg_delay`). A baseline's
whole-workload time at that round-trip time is its time measured directly plus
its round trips on the whole workload x what a round trip through the relay
takes more than one directly; its prefix, run directly and through the relay,
checks that rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from bench.common import GOAL_PG_PER_TRANSACTION, GOAL_SPEEDUP
from bench.pg_server import is_local
from bench.report import Add, met

if TYPE_CHECKING:
    from bench.pg_report import Figures

COMPILED_ROUND_TRIPS_PER_TABLE = 20
COMPILED_ROUND_TRIPS_PER_CYCLE = 20
RTTS_MS = (0.1, 0.25, 0.5, 1.0)
BANDWIDTH_MBIT_S = 1000.0


class Network(NamedTuple):
    """The modelled seconds of each approach at one round-trip time."""

    rtt_ms: float
    compiled_s: float
    per_transaction_s: float
    row_by_row_s: float


class RoundTrips(NamedTuple):
    """Round trips of each approach on the whole workload, and the compiled apply's COPY bytes."""

    compiled: float
    per_transaction: float
    row_by_row: float
    copy_bytes: int


def _scaled(count: float, part: dict[str, Any], committed: int) -> float:
    return count * committed / part["transactions"]


def baseline_trips(name: str, part: dict[str, Any]) -> int:
    """The round trips one baseline run (``pertxn`` or ``rowbyrow``) waited for: statements, COPYs, BEGIN and COMMIT."""
    copies = part["copies"] if name == "pertxn" else 0
    return int(part["statements"] + copies + 2 * part["commits"])


def round_trips(r: dict[str, Any]) -> RoundTrips:
    """Count the round trips of each approach from the benchmark's result ``r``."""
    committed, one, per, row = r["workload"]["committed"], r["compiled_one"], r["pertxn"], r["rowbyrow"]
    tables = len(r["limit"]["per_table"])
    compiled = one["cycles"] * (tables * COMPILED_ROUND_TRIPS_PER_TABLE + COMPILED_ROUND_TRIPS_PER_CYCLE)
    return RoundTrips(
        compiled=float(compiled),
        per_transaction=_scaled(baseline_trips("pertxn", per), per, committed),
        row_by_row=_scaled(baseline_trips("rowbyrow", row), row, committed),
        copy_bytes=sum(int(t["bytes"]) for t in r["limit"]["per_table"].values()),
    )


def at_rtt(
    rtt_ms: float, trips: RoundTrips, measured: tuple[float, float, float], bandwidth_mbit_s: float = BANDWIDTH_MBIT_S
) -> Network:
    """The modelled seconds at ``rtt_ms`` from the ``measured`` (compiled, per-transaction, row-by-row) seconds."""
    rtt = rtt_ms / 1000.0
    compiled, per, row = measured
    transfer = trips.copy_bytes * 8 / (bandwidth_mbit_s * 1e6)
    return Network(
        rtt_ms=rtt_ms,
        compiled_s=compiled + trips.compiled * rtt + transfer,
        per_transaction_s=per + trips.per_transaction * rtt,
        row_by_row_s=row + trips.row_by_row * rtt,
    )


def break_even_rtt_ms(
    goal: float,
    baseline_s: float,
    baseline_trips: float,
    trips: RoundTrips,
    compiled_s: float,
    bandwidth_mbit_s: float = BANDWIDTH_MBIT_S,
) -> float | None:
    """The smallest RTT (ms) at which the baseline takes ``goal`` times the compiled apply; None if none does.

    Solves ``baseline_s + baseline_trips * rtt >= goal * (compiled_s + transfer + trips.compiled * rtt)``.
    """
    fixed = goal * (compiled_s + trips.copy_bytes * 8 / (bandwidth_mbit_s * 1e6)) - baseline_s
    if fixed <= 0:
        return 0.0
    slope = baseline_trips - goal * trips.compiled
    if slope <= 0:
        return None
    return fixed / slope * 1000.0


def network_section(r: dict[str, Any], fig: Figures, add: Add) -> None:
    """The report's section: each approach at several round-trip times, and where the goals would hold."""
    trips = round_trips(r)
    one = r["compiled_one"]["wall_s"]
    measured = (one, fig.per_total, fig.row_total)
    add("## Against a server across a network (a model, not a measurement)")
    add("")
    add(
        f"{_measured_over(r['server'])} Across a network every statement an applier waits for costs one "
        f"round trip (RTT) more. Adding RTT x round trips to the times measured above (and, for the compiled apply, "
        f"its {trips.copy_bytes / 1e6:,.1f} MB of COPY data at {BANDWIDTH_MBIT_S:,.0f} Mbit/s) gives the table "
        f"below (`bench/pg_network.py` says how each approach's round trips are counted). Round trips on the whole "
        f"workload: row-by-row {trips.row_by_row:,.0f}, per-transaction {trips.per_transaction:,.0f}, compiled at "
        f"most {trips.compiled:,.0f}."
    )
    add("")
    add("| RTT added | compiled s | per-transaction s | row-by-row s | x per-transaction | x row-by-row |")
    add("|---|---:|---:|---:|---:|---:|")
    add(
        f"| none (as measured) | {one:.1f} | {fig.per_total:,.0f} | {fig.row_total:,.0f} | {fig.vs_per:.1f}x | "
        f"{fig.vs_row:.1f}x |"
    )
    for rtt in RTTS_MS:
        n = at_rtt(rtt, trips, measured)
        add(
            f"| {rtt:g} ms | {n.compiled_s:.1f} | {n.per_transaction_s:,.0f} | {n.row_by_row_s:,.0f} | "
            f"{n.per_transaction_s / n.compiled_s:.1f}x | {n.row_by_row_s / n.compiled_s:.1f}x |"
        )
    add("")
    row_at = break_even_rtt_ms(GOAL_SPEEDUP, fig.row_total, trips.row_by_row, trips, one)
    steady_at = break_even_rtt_ms(GOAL_SPEEDUP, fig.row_steady, trips.row_by_row, trips, one)
    second_half = f" ({_from(steady_at)} with the second-half rate)" if fig.extrapolated else ""
    per_at = break_even_rtt_ms(GOAL_PG_PER_TRANSACTION, fig.per_total, trips.per_transaction, trips, one)
    add(
        f"By this model the compiled apply is {GOAL_SPEEDUP:g}x faster than row-by-row {_from(row_at)}"
        f"{second_half}, and {GOAL_PG_PER_TRANSACTION:g}x faster than "
        f"per-transaction {_from(per_at)}. The calibrated limit itself ({fig.limit_e2e:.1f} s) is "
        f"{fig.row_total / fig.limit_e2e:.1f}x faster than row-by-row as measured, so no apply that reads and parses "
        f"every image could be more than that here. To measure against a real warehouse, run the benchmark with "
        f"`--server`."
    )
    add("")


def _measured_over(server: dict[str, Any]) -> str:
    rtt = f"a prepared `SELECT 1` took {server['round_trip_ms']:.3f} ms (median of 2,000)"
    if is_local(server["server"]):
        return f"The server above answers over loopback: {rtt}."
    return f"The server above is across a network already ({rtt}): the RTTs below come on top of its own."


def _from(value: float | None) -> str:
    """Where a goal starts to hold, in words."""
    if value is None:
        return "at no added RTT"
    return "already as measured" if value == 0 else f"from an added RTT of {value:.2f} ms"


class Measured(NamedTuple):
    """One round-trip time through the relay: the compiled apply measured whole, the baselines at that RTT."""

    rtt_ms: float  # a round trip through the relay, measured
    added_ms: float  # what it takes more than a round trip directly: the cost of each round trip an approach waits for
    compiled_s: float  # the compiled apply of the whole workload through the relay, measured
    prefix_s: dict[str, tuple[float, float, float]]  # per baseline, its prefix: directly, through the relay, predicted
    whole_s: dict[str, float]  # per baseline: its whole-workload seconds directly + its round trips x added_ms


def measured_at(run: dict[str, Any], direct_rtt_ms: float, whole_s: dict[str, float], trips: RoundTrips) -> Measured:
    """The figures of one relay run; ``whole_s`` holds each baseline's whole-workload seconds measured directly."""
    added_ms = run["measured_rtt_ms"] - direct_rtt_ms
    whole_trips = {"pertxn": trips.per_transaction, "rowbyrow": trips.row_by_row}
    prefix = {}
    for name in ("pertxn", "rowbyrow"):
        direct = run["direct"][name]["seconds"]
        predicted = direct + baseline_trips(name, run[name]) * added_ms / 1000
        prefix[name] = (direct, run[name]["seconds"], predicted)
    return Measured(
        rtt_ms=run["measured_rtt_ms"],
        added_ms=added_ms,
        compiled_s=run["compiled"]["wall_s"],
        prefix_s=prefix,
        whole_s={name: whole_s[name] + whole_trips[name] * added_ms / 1000 for name in whole_trips},
    )


def _all_measured(r: dict[str, Any], fig: Figures) -> list[Measured]:
    network, trips = r["network"], round_trips(r)
    whole = {"pertxn": fig.per_total, "rowbyrow": fig.row_total}
    return [measured_at(run, network["direct_rtt_ms"], whole, trips) for run in network["runs"]]


def _meets(m: Measured, name: str) -> bool:
    """Whether the compiled apply is the issue's goal times faster than baseline ``name`` at ``m``'s RTT."""
    goal = GOAL_SPEEDUP if name == "rowbyrow" else GOAL_PG_PER_TRANSACTION
    return m.whole_s[name] >= goal * m.compiled_s


def measured_goals(r: dict[str, Any], fig: Figures) -> str:
    """One sentence for the goals section: each speed-up through the relay ('' when it did not run)."""
    if not r.get("network"):
        return ""
    shown = "; ".join(
        f"at a {m.rtt_ms:.2f} ms round trip {m.whole_s['rowbyrow'] / m.compiled_s:.1f}x row-by-row "
        f"({met(_meets(m, 'rowbyrow'))}) and {m.whole_s['pertxn'] / m.compiled_s:.1f}x per-transaction "
        f"({met(_meets(m, 'pertxn'))})"
        for m in _all_measured(r, fig)
    )
    return f"The same goals across an emulated network (see below): {shown}."


def measured_network_section(r: dict[str, Any], fig: Figures, add: Add) -> None:
    """The report's section: each approach through the delay relay (when the benchmark ran it)."""
    network = r.get("network")
    if not network:
        return
    prefix, one = network["prefix"], r["compiled_one"]["wall_s"]
    add("## Across an emulated network (measured)")
    add("")
    add(
        "The kernel here has no `netem`, so a relay (`bench/pg_delay.py`, a process of its own on loopback) stands "
        "for the network: it holds every byte for a fixed time each way, so that a round trip through it, its own "
        f"hop included, takes the time asked. A prepared `SELECT 1` took {network['direct_rtt_ms']:.3f} ms directly "
        f"and {network['relay_rtt_ms']:.3f} ms through the relay holding nothing. Through it the compiled apply "
        f"applied the whole workload. Each baseline applied its first {prefix:,} committed transactions directly "
        "and then through the relay, back to back; *predicted* is the direct time plus the prefix's round trips x "
        "what a round trip through the relay takes more than one directly (the model's assumption)."
    )
    add("")
    add(
        f"| RTT asked | RTT measured | compiled, whole workload s (directly {one:.1f}) | per-transaction, first "
        f"{prefix:,}: s directly / through the relay / predicted | row-by-row, first {prefix:,}: s directly / "
        "through the relay / predicted |"
    )
    add("|---|---:|---:|---:|---:|")
    measured = _all_measured(r, fig)
    for run, m in zip(network["runs"], measured, strict=True):
        add(
            f"| {run['rtt_ms']:g} ms | {m.rtt_ms:.3f} ms | {m.compiled_s:.1f} | "
            + " | ".join(" / ".join(f"{v:.1f}" for v in m.prefix_s[name]) for name in ("pertxn", "rowbyrow"))
            + " |"
        )
    add("")
    add(_compiled_phases(r["compiled_one"], network["runs"]))
    add("")
    agree = all(run["compiled_agrees"] for run in network["runs"])
    add(
        f"Every compiled run through the relay leaves the rows of the direct one: {'yes' if agree else 'NO'}. On the "
        "whole workload, each baseline at the measured round-trip time is its direct time (above) plus its round "
        "trips on the whole workload x what a round trip through the relay takes more than one directly:"
    )
    add("")
    add(
        "| RTT measured | compiled s (measured) | per-transaction s | row-by-row s | x per-transaction "
        "| x row-by-row |"
    )
    add("|---|---:|---:|---:|---:|---:|")
    for m in measured:
        per, row = m.whole_s["pertxn"], m.whole_s["rowbyrow"]
        add(
            f"| {m.rtt_ms:.3f} ms | {m.compiled_s:.1f} | {per:,.0f} | {row:,.0f} | {per / m.compiled_s:.1f}x | "
            f"{row / m.compiled_s:.1f}x |"
        )
    add("")
    add(
        f"Compiled at least {GOAL_SPEEDUP:g}x faster than row-by-row, by round-trip time measured: "
        + ", ".join(
            f"{m.rtt_ms:.2f} ms {'met' if _meets(m, 'rowbyrow') else 'not met'}"
            for m in measured
        )
        + ". Where a prefix through the relay took longer than predicted, a round trip cost that baseline more "
        "than a `SELECT 1` shows, and its whole-workload figure above is an underestimate."
    )
    add("")


def _compiled_phases(direct: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    """Where the compiled runs through the relay spent their time: the server is met in the ``tables`` phase."""

    def split(run: dict[str, Any]) -> str:
        tables = run["phases"].get("tables", 0.0)
        return f"{tables:.1f} s in `tables`, {run['cycle_seconds'] - tables:.1f} s in the others"

    through = "; ".join(f"at {run['measured_rtt_ms']:.2f} ms {split(run['compiled'])}" for run in runs)
    return (
        "The compiled apply meets the server in its `tables` phase (staging, COPY, MERGE, commit) and in one "
        "checkpoint read per cycle; its other phases read the files and run Spark on this machine, so whatever "
        f"they gain or lose through the relay is the machine's own drift. Directly: {split(direct)}; through the "
        f"relay: {through}."
    )
