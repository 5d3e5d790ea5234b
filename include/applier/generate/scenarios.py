"""Special scenarios every generated stream contains, placed at fixed points of the run.

Random ordinary transactions alone would leave rare cases (a key move, a
truncate, a rollback after thousands of rows) to chance. Each scenario here is
scheduled at a fixed fraction of the run, so a stream of any seed and any size
holds all of them; the runner retries a scenario that found no target.

A scenario script records its ``kind`` in ``session.features`` once it has
done what it is for; that is how the runner knows it happened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

from applier.generate.model import Key
from applier.generate.profiles import Profile
from applier.generate.session import COMMIT, LEAVE_OPEN, ROLLBACK, Session
from applier.generate.tables import CART, CUSTOMERS, EVENTS, ORDER_LINES, ORDERS, PRODUCTS
from applier.generate.values import DOUBLE_SPECIALS, EVENT_KINDS, UNICODE_NAMES

ScenarioScript = Callable[[Session], Iterator[None]]
SCHEMA_CHANGE = "schema_change"


@dataclass(frozen=True)
class Scenario:
    """One special transaction (or schema change) and when it is due.

    Attributes:
        kind: what it exercises; also the feature name it records.
        at: the fraction of the run's transactions after which it is due.
        script: the transaction; None for the schema change, which is DDL.
        outcome: ``commit``, ``rollback`` or ``open`` (never ends).
        long: whether it is a long transaction (scheduled apart from short ones).
        final: whether it waits until every other scenario is done.
        gate: a table it must own alone (truncate, DDL).
        tables: tables it changes, which must not be gated when it starts.
        needs_rows: tables that must hold committed rows for it to find a target.
        after: a scenario kind that must be done first.
    """

    kind: str
    at: float
    script: ScenarioScript | None
    outcome: str = COMMIT
    long: bool = False
    final: bool = False
    gate: str | None = None
    tables: tuple[str, ...] = ()
    needs_rows: tuple[str, ...] = ()
    after: str | None = None


def load(s: Session, table: str, count: int) -> Iterator[None]:
    """Insert ``count`` fresh rows into ``table`` (the initial load)."""
    rows, db = s.rows, s.db
    for _ in range(count):
        if table == EVENTS:
            s.insert_value(EVENTS, rows.event(s.rng.choice(EVENT_KINDS), s.sample_id(CUSTOMERS) or 1))
        elif table == ORDERS:
            oid = db.next_id(ORDERS)
            s.insert(ORDERS, rows.order(oid, s.sample_id(CUSTOMERS) or 1))
            for _ in range(s.rng.randint(2, 3)):
                yield
                s.insert(ORDER_LINES, rows.line(oid, db.next_line_no(oid), s.sample_id(PRODUCTS) or 1))
        elif table == CUSTOMERS:
            s.insert(CUSTOMERS, rows.customer(db.next_id(CUSTOMERS)))
        else:
            s.insert(PRODUCTS, rows.product(db.next_id(PRODUCTS)))
        yield
    s.features.append("initial_load")


def long_batch(s: Session, min_rows: int, kind: str, shared: dict[str, Key]) -> Iterator[None]:
    """A batch import: thousands of orders, lines and events, revisiting its own orders.

    It runs until it has at least ``min_rows`` rows spread over at least three
    pairs, so it is long relative to the pair size whatever that is.
    """
    own_orders: list[int] = []
    oid, products = 0, 0
    while s.txn.rows < min_rows or len(s.txn.pairs) < 3:
        r = s.rng.random()
        if r < 0.06 or not own_orders:
            oid = s.db.next_id(ORDERS)
            s.insert(ORDERS, s.rows.order(oid, s.sample_id(CUSTOMERS) or 1))
            own_orders.append(oid)
        elif r < 0.75:
            s.insert(ORDER_LINES, s.rows.line(oid, s.db.next_line_no(oid), s.sample_id(PRODUCTS) or 1))
        elif r < 0.9:
            s.insert_value(EVENTS, s.rows.event("import", oid))
        elif r < 0.98 or products >= 10:
            key = (own_orders[s.rng.randrange(len(own_orders))],)
            s.update(ORDERS, key, s.rows.order_change(s.own(ORDERS, key)))
        else:
            picked = s.pick(PRODUCTS)
            if picked is None or picked[0] == shared.get("hot"):
                continue  # the hot row stays free for its own scenario
            s.update(PRODUCTS, picked[0], s.rows.product_change(picked[1]))
            products += 1
        yield
    s.features.append(kind)


def key_move(s: Session) -> Iterator[None]:
    """Renumber a customer: the after-image carries a new key."""
    picked = s.pick(CUSTOMERS)
    if picked is not None:
        after = {**s.rows.customer_change(picked[1]), "id": s.db.next_id(CUSTOMERS)}
        s.update(CUSTOMERS, picked[0], after)
        yield
        s.features.append("key_move")


def key_move_composite(s: Session) -> Iterator[None]:
    """Renumber an order line: one column of a composite key changes."""
    picked = s.pick(ORDER_LINES)
    if picked is not None:
        order_id = picked[0][0]
        s.update(ORDER_LINES, picked[0], {**picked[1], "line_no": s.db.next_line_no(order_id)})
        yield
        s.features.append("key_move_composite")


def insert_then_delete(s: Session) -> Iterator[None]:
    """Insert an order and a line, change the line, then delete both in the same transaction."""
    oid = s.db.next_id(ORDERS)
    s.insert(ORDERS, s.rows.order(oid, s.sample_id(CUSTOMERS) or 1))
    yield
    line = s.rows.line(oid, s.db.next_line_no(oid), s.sample_id(PRODUCTS) or 1)
    s.insert(ORDER_LINES, line)
    yield
    line_key = (oid, line["line_no"])
    s.update(ORDER_LINES, line_key, s.rows.line_change(line))
    yield
    s.delete(ORDER_LINES, line_key)
    yield
    s.delete(ORDERS, (oid,))
    yield
    s.features.append("insert_then_delete")


def delete_then_reinsert(s: Session) -> Iterator[None]:
    """Delete a product and a customer, each followed by a new row under the same key."""
    product = s.pick(PRODUCTS)
    if product is None:
        return
    s.delete(PRODUCTS, product[0])
    yield
    s.insert(PRODUCTS, s.rows.product(product[0][0]))
    yield
    customer = s.pick(CUSTOMERS)  # picked only now: the table may have been gated meanwhile
    if customer is None:
        return
    s.delete(CUSTOMERS, customer[0])
    yield
    s.insert(CUSTOMERS, s.rows.customer(customer[0][0]))
    yield
    s.features.append("delete_then_reinsert")


def repeated_update(s: Session) -> Iterator[None]:
    """Update one order three times in one transaction."""
    picked = s.pick(ORDERS)
    if picked is None:
        return
    s.update(ORDERS, picked[0], s.rows.order_change(picked[1]))
    yield
    for _ in range(2):
        s.update(ORDERS, picked[0], s.rows.order_change(s.own(ORDERS, picked[0])))
        yield
    s.features.append("repeated_update")


def hot_row(s: Session, shared: dict[str, Key]) -> Iterator[None]:
    """Update the same product as the other hot-row transactions (repeated updates across transactions)."""
    key = shared.get("hot")
    if key is None:
        picked = s.pick(PRODUCTS)
        if picked is None:
            return
        key = shared["hot"] = picked[0]
    row = s.get(PRODUCTS, key)
    if row is None or not s.db.free_for(s.txn, PRODUCTS, key) or not s.may_touch(PRODUCTS):
        return
    s.update(PRODUCTS, key, s.rows.product_change(row))
    yield
    s.features.append("repeated_update_across_txns")


def truncate_refill(s: Session) -> Iterator[None]:
    """Empty the cart table and insert new cart items in the same transaction."""
    s.truncate(CART)
    yield
    session_id = f"s-{s.rng.getrandbits(40):010x}"
    for product_id in range(1, 4):
        s.insert(CART, s.rows.cart_item(session_id, product_id))
        yield
    s.features.append("truncate")


def duplicates(s: Session) -> Iterator[None]:
    """Insert exact copies of an existing event, and one new event twice."""
    value = s.pick_value(EVENTS)
    if value is None:
        return
    copy = s.sample_row(EVENTS, value)
    fresh = s.rows.event("page_view", s.sample_id(CUSTOMERS) or 1)
    for row in (copy, copy, fresh, fresh):
        s.insert_value(EVENTS, row)
        yield
    s.features.append("nopk_duplicates")


def delete_one_duplicate(s: Session) -> Iterator[None]:
    """Delete one copy of an event that exists at least twice; the other copies stay.

    When no event has two copies left, the transaction first inserts a second
    copy itself, so the delete still meets a duplicate.
    """
    value = s.pick_value(EVENTS, copies=2)
    if value is None:
        value = s.pick_value(EVENTS)
        if value is None:
            return
        s.insert_value(EVENTS, s.sample_row(EVENTS, value))
        yield
    s.delete_value(EVENTS, value)
    yield
    s.features.append("nopk_delete_one_copy")


def double_specials(s: Session) -> Iterator[None]:
    """Log NaN, Infinity and -Infinity sensor scores and give a product a NaN rating."""
    for special in DOUBLE_SPECIALS:
        s.insert_value(EVENTS, s.rows.event("sensor", 0, score=special))
        yield
    picked = s.pick(PRODUCTS)
    if picked is not None:
        s.update(PRODUCTS, picked[0], {**picked[1], "rating": "NaN"})
        yield
    s.features.append("double_specials")


def unicode_names(s: Session) -> Iterator[None]:
    """Insert customers whose names use accents, Cyrillic, Greek, CJK and emoji."""
    inserted = 0
    for name in UNICODE_NAMES:
        if s.insert(CUSTOMERS, s.rows.customer(s.db.next_id(CUSTOMERS), name=name)):
            inserted += 1
            yield
    if inserted == len(UNICODE_NAMES):
        s.features.append("unicode")


def empty(s: Session) -> Iterator[None]:
    """A transaction without rows (begin and end only)."""
    s.features.append("empty_txn")
    yield from ()


def new_column_values(s: Session) -> Iterator[None]:
    """After the schema change: set the new column on an old customer and insert a new one."""
    picked = s.pick(CUSTOMERS)
    if picked is None:
        return
    s.update(CUSTOMERS, picked[0], {**picked[1], "phone": "+81 3-1234-5678"})
    yield
    s.insert(CUSTOMERS, s.rows.customer(s.db.next_id(CUSTOMERS)))
    yield
    s.features.append("new_column_values")


def open_at_end(s: Session) -> Iterator[None]:
    """Place an order and touch a customer, then never end (still open when the stream stops)."""
    oid = s.db.next_id(ORDERS)
    s.insert(ORDERS, s.rows.order(oid, s.sample_id(CUSTOMERS) or 1))
    yield
    for _ in range(2):
        s.insert(ORDER_LINES, s.rows.line(oid, s.db.next_line_no(oid), s.sample_id(PRODUCTS) or 1))
        yield
    picked = s.pick(CUSTOMERS)
    if picked is not None:
        s.update(CUSTOMERS, picked[0], s.rows.customer_change(picked[1]))
        yield
    s.features.append("open_at_end")


def _loads(profile: Profile) -> list[Scenario]:
    chunk = profile.load_chunk
    return [
        Scenario("initial_load", 0.0, partial(load, table=table, count=min(chunk, total - start)), tables=(table,))
        for table, total in (
            (CUSTOMERS, profile.initial_customers),
            (PRODUCTS, profile.initial_products),
            (EVENTS, profile.initial_events),
            (ORDERS, profile.initial_orders),
        )
        for start in range(0, total, chunk)
    ]


def _longs(profile: Profile, shared: dict[str, Key]) -> list[Scenario]:
    return [
        Scenario(
            kind,
            at + 0.1 * i,
            partial(long_batch, min_rows=profile.long_rows_min, kind=kind, shared=shared),
            outcome=outcome,
            long=True,
            tables=(ORDERS, ORDER_LINES, EVENTS, PRODUCTS),
        )
        for kind, at, outcome, count in (
            ("long_commit", 0.04, COMMIT, profile.long_commits),
            ("long_rollback", 0.25, ROLLBACK, profile.long_rollbacks),
            ("long_open", 0.45, LEAVE_OPEN, profile.long_open),
        )
        for i in range(count)
    ]


def _specials(profile: Profile, shared: dict[str, Key]) -> list[Scenario]:
    specials = [
        Scenario("key_move", 0.08, key_move, tables=(CUSTOMERS,), needs_rows=(CUSTOMERS,)),
        Scenario("key_move_composite", 0.09, key_move_composite, tables=(ORDER_LINES,), needs_rows=(ORDER_LINES,)),
        Scenario("insert_then_delete", 0.10, insert_then_delete, tables=(ORDERS, ORDER_LINES)),
        Scenario(
            "delete_then_reinsert", 0.11, delete_then_reinsert, tables=(PRODUCTS, CUSTOMERS), needs_rows=(PRODUCTS,)
        ),
        Scenario("repeated_update", 0.12, repeated_update, tables=(ORDERS,), needs_rows=(ORDERS,)),
        *(
            Scenario("repeated_update_across_txns", at, partial(hot_row, shared=shared), needs_rows=(PRODUCTS,))
            for at in (0.13, 0.15, 0.17)
        ),
        Scenario("truncate", 0.20, truncate_refill, gate=CART),
        Scenario("nopk_duplicates", 0.22, duplicates, tables=(EVENTS,), needs_rows=(EVENTS,)),
        Scenario(
            "nopk_delete_one_copy",
            0.24,
            delete_one_duplicate,
            tables=(EVENTS,),
            needs_rows=(EVENTS,),
            after="nopk_duplicates",
        ),
        Scenario("double_specials", 0.27, double_specials, tables=(EVENTS, PRODUCTS), needs_rows=(PRODUCTS,)),
        Scenario("unicode", 0.28, unicode_names, tables=(CUSTOMERS,)),
        Scenario("empty_txn", 0.30, empty),
        Scenario("truncate", 0.60, truncate_refill, gate=CART),
        Scenario("empty_txn", 0.65, empty),
        *(
            Scenario("open_at_end", 0.97, open_at_end, outcome=LEAVE_OPEN, final=True)
            for _ in range(profile.open_at_end)
        ),
    ]
    if profile.evolve_schema:
        specials += [
            Scenario(SCHEMA_CHANGE, 0.50, None, gate=CUSTOMERS),
            Scenario(
                "new_column_values",
                0.55,
                new_column_values,
                tables=(CUSTOMERS,),
                needs_rows=(CUSTOMERS,),
                after=SCHEMA_CHANGE,
            ),
        ]
    return specials


def plan(profile: Profile, shared: dict[str, Key]) -> list[Scenario]:
    """The scenarios of a run of ``profile``, in the order they fall due.

    Args:
        profile: sizes the initial load and the long transactions.
        shared: state the hot-row scenarios and long transactions share.

    Returns:
        Scenarios sorted by ``at`` (the sort is stable, so equal times keep this order).
    """
    return sorted([*_loads(profile), *_longs(profile, shared), *_specials(profile, shared)], key=lambda sc: sc.at)
