"""The advisor's report for people: every figure with how it was computed, a line each (pure)."""

from __future__ import annotations

from applier.advise.arithmetic import (
    Layout,
    rows_that_fit,
    single_row_transaction_bytes,
    transaction_bytes,
    transactions_that_fit,
)
from applier.advise.observe import Observation
from applier.advise.recommend import BUFFER_STEP, CYCLE_STEP_MIB, Recommendation
from applier.advise.shapes import TableShape
from applier.config import QUEUE_MEMORY_SHARE, Config
from applier.intermediate.pairs import MIB

_LISTED_COLUMNS = 6  # variable-length columns named per table; the rest are counted


def _n(value: float) -> str:
    return f"{value:,}"


def _mib(value: float) -> str:
    return f"{value:g}"


def budget_source(config: Config) -> str:
    """Where the queue memory budget comes from, in words."""
    if config.apply.queue_memory_mb is not None:
        return f"apply.queue_memory_mb {_mib(config.apply.queue_memory_mb)}"
    driver = config.spark.conf.get("spark.driver.memory", "1g, Spark's default")
    return f"apply.queue_memory_mb unset: {QUEUE_MEMORY_SHARE:g} of spark.driver.memory {driver}"


def header_lines(config: Config, o: Observation) -> list[str]:
    """The layout, what was read and the budget."""
    lay = o.layout
    lines = [
        f"advice for configuration {config.configuration_name}, {lay.name} layout: per row a {lay.row_header}-byte "
        f"row header and a {lay.hash_option}-byte hash option, per transaction a {lay.transaction_header}-byte header",
    ]
    if o.read:
        first, last = o.read[0].seq, o.read[-1].seq
        which = "all of them" if len(o.read) == o.backlog_pairs else f"a sample of the first {len(o.read)}"
        lines.append(
            f"backlog: {o.backlog_pairs} pairs after pair {o.applied_seq}; read {which} (pairs {first}..{last}, "
            f"{_n(o.pair_bytes)} bytes, the largest {_n(o.largest_pair_bytes)}), {_n(o.rows)} rows"
        )
    budget = config.queue_memory_bytes
    lines.append(
        f"queue memory budget: {_n(budget)} bytes ({budget_source(config)}); "
        f"a transaction spools above half of it, {_n(budget // 2)} bytes"
    )
    return lines


def _variable_detail(shape: TableShape) -> str:
    names = shape.variable_columns
    listed = [f"{n} {shape.maxima[n]}" if n in shape.maxima else f"{n} never seen: 0" for n in names[:_LISTED_COLUMNS]]
    more = f", {len(names) - _LISTED_COLUMNS} more" if len(names) > _LISTED_COLUMNS else ""
    return f" ({', '.join(listed)}{more})" if names else ""


def table_lines(name: str, shape: TableShape, largest: int, layout: Layout, budget: int) -> list[str]:
    """One table: its expanded row size, a single-row transaction and its largest observed transaction."""
    row, fixed_count = shape.row_size, len(shape.definition.columns) - len(shape.variable_columns)
    per_row = f"{layout.row_header} + {layout.hash_option} + {row}"
    single = single_row_transaction_bytes(layout, row)
    lines = [
        f"  {name} ({_n(shape.rows)} rows): row {_n(row)} bytes = {_n(shape.fixed_bytes)} fixed "
        f"({fixed_count} columns) + {_n(shape.variable_bytes)} variable{_variable_detail(shape)}",
        f"    single-row transaction: {per_row} + {layout.transaction_header} = {_n(single)} bytes; "
        f"{_n(transactions_that_fit(budget, single))} fit in the budget",
    ]
    if largest:
        big = transaction_bytes(layout, row, largest)
        lines.append(
            f"    largest observed transaction: {_n(largest)} rows = {layout.transaction_header} + {_n(largest)} x "
            f"({per_row}) = {_n(big)} bytes; {_n(transactions_that_fit(budget, big))} fit in the budget"
        )
    entry = layout.row_overhead + row
    lines.append(
        f"    one transaction holds at most ({_n(budget)} - {layout.transaction_header}) // {_n(entry)} = "
        f"{_n(rows_that_fit(layout, row, budget))} rows in the budget, "
        f"{_n(rows_that_fit(layout, row, budget // 2))} before it spools at half"
    )
    return lines


def tables_lines(o: Observation, budget: int) -> list[str]:
    """Every table of the pairs read."""
    lines = ["tables: row size = fixed-width columns + variable-length columns at their observed maximum (bytes)"]
    for name, shape in o.tables.items():
        largest = o.transactions.largest_by_table.get(name, 0)
        lines += table_lines(name, shape, largest, o.layout, budget)
    return lines


def transaction_lines(o: Observation, budget: int) -> list[str]:
    """The transactions: sizes, percentiles, the most open at once and how many fit."""
    t, lay = o.transactions, o.layout
    last = o.read[-1].seq if o.read else o.applied_seq
    first = o.read[0].seq if o.read else o.applied_seq + 1
    lines = [
        f"transactions (begin to commit or rollback, across pairs): {_n(t.seen)} seen, {_n(t.ended)} ended, "
        f"{_n(t.open_at_end)} still open after pair {last} (counted with their rows so far), "
        f"{_n(t.began_before)} begun before pair {first}",
        f"  rows per transaction: p99 {_n(t.rows_p99)}, max {_n(t.rows_max)}",
        f"  memory by the arithmetic ({lay.transaction_header} + per row {lay.row_header} + {lay.hash_option} + its "
        f"table's row size): p99 {_n(t.memory_p99)} bytes, max {_n(t.memory_max)}",
        "  as the Applier buffers them (per row 8 + the UTF-8 bytes of xid, table, op and both images): "
        f"p99 {_n(t.buffered_p99)} bytes, max {_n(t.buffered_max)}",
        f"  most open at once: {_n(t.most_open)}; their peak memory {_n(t.peak_open_memory)} bytes by the arithmetic, "
        f"{_n(t.peak_open_buffered)} as buffered",
    ]
    if t.memory_p99:
        largest = max(t.memory_max, t.buffered_max)
        spools = "spools" if largest > budget // 2 else "does not spool"
        fit = transactions_that_fit(budget, t.memory_p99)
        lines.append(
            f"  against the budget: {_n(budget)} // {_n(t.memory_p99)} = {_n(fit)} p99 transactions fit; "
            f"the largest ({_n(largest)} bytes, larger measure) {spools} at half the budget"
        )
    return lines


def _queue_line(r: Recommendation, budget: int) -> str:
    least = f"the transactions' share + the smallest cycle = {_n(r.transactions_share)} + "
    least += f"{_n(r.smallest_cycle_memory)} = {_n(r.minimum_queue)} bytes"
    if r.keeps_configured:
        return f"  apply.queue_memory_mb = {_mib(r.queue_memory_mb)}: keep the configured budget; the least is {least}"
    return (
        f"  apply.queue_memory_mb = {_mib(r.queue_memory_mb)}: {least}, rounded up to whole MiB "
        f"(the configured {_n(budget)} bytes is short)"
    )


def _cycle_line(r: Recommendation, config: Config) -> str:
    now = f"configured {_mib(config.apply.process_intermediate_size_per_job)}"
    if r.cycle_mib is None:
        return f"  apply.process_intermediate_size_per_job: no rows were read to size a cycle by; keep it ({now})"
    room = int(r.queue_memory_mb * MIB) - r.transactions_share
    return (
        f"  apply.process_intermediate_size_per_job = {_mib(r.cycle_mib)} or less: the largest cycle that does not "
        f"spool fills the room beside the transactions, "
        f"{_n(room)} bytes / {r.expansion:.2f} / {_n(MIB)}, rounded down to {CYCLE_STEP_MIB:g} MiB, "
        f"at least the largest pair ({now})"
    )


def _strategy_lines(r: Recommendation, budget: int) -> list[str]:
    s, gib = r.strategy, r.driver_memory / (1024 * MIB)
    lines = [
        f"  the article's strategy for a driver memory of {gib:g} GiB ({_n(r.driver_memory)} bytes): "
        f"update-anywhere 1/8 to 1/6 = {_n(s.update_anywhere[0])} to {_n(s.update_anywhere[1])} bytes per queue; "
        f"source to target (the Applier's case) 200 to 250 MB of each GB = {_n(s.source_to_target[0])} to "
        f"{_n(s.source_to_target[1])} bytes"
    ]
    if r.driver_memory_needed is not None:
        lines.append(
            f"  the least queue this workload needs ({_n(r.minimum_queue)} bytes) is above that share: raise "
            f"spark.driver.memory to {r.driver_memory_needed // (1024 * MIB)}g (250 MB of each GB holds it)"
        )
    else:
        lines.append(f"  the least queue this workload needs ({_n(r.minimum_queue)} bytes) is within that share")
    if budget > s.source_to_target[1]:
        lines.append(
            f"  the configured budget ({_n(budget)} bytes) is {_n(budget - s.source_to_target[1])} bytes above "
            "the source-to-target share"
        )
    return lines


def recommendation_lines(r: Recommendation, o: Observation, config: Config) -> list[str]:
    """The recommended settings, each with its reasoning."""
    t, budget = o.transactions, config.queue_memory_bytes
    return [
        "recommendations (no spooling at the 99th-percentile transaction):",
        f"  the p99 transaction needs the larger of its measures, max({_n(t.memory_p99)}, {_n(t.buffered_p99)}) = "
        f"{_n(r.p99_need)} bytes; a transaction spools above half the queue, so the queue holds "
        f"2 x {_n(r.p99_need)} = {_n(r.queue_for_p99)}",
        f"  the open transactions peak at max({_n(t.peak_open_memory)}, {_n(t.peak_open_buffered)}) = "
        f"{_n(r.open_need)} bytes; the transactions' share is max({_n(r.queue_for_p99)}, {_n(r.open_need)}) = "
        f"{_n(r.transactions_share)} bytes",
        f"  a cycle's rows take {r.expansion:.2f} bytes in memory per byte of pair "
        f"(max({_n(o.row_memory)}, {_n(o.row_buffered)}) bytes of rows in {_n(o.pair_bytes)} bytes of pairs); "
        f"the smallest cycle, the largest pair ({_n(o.largest_pair_bytes)} bytes) rounded up to "
        f"{CYCLE_STEP_MIB:g} MiB steps = {_mib(r.smallest_cycle_mib)} MiB, holds {_n(r.smallest_cycle_memory)} bytes",
        _queue_line(r, budget),
        _cycle_line(r, config),
        f"  apply.buffer_size_for_split_records = {r.buffer_size}: the p99 transaction as buffered, "
        f"{_n(t.buffered_p99)} bytes, rounded up to {_n(BUFFER_STEP)} bytes "
        f"(configured {config.apply.buffer_size_for_split_records})",
        *_strategy_lines(r, budget),
    ]
