"""Ordinary shop transactions, written as generators that yield after each change.

The runner interleaves many scripts, advancing one at a time, so their rows
mix in the log as concurrent sessions' rows do. A script picks its targets
when it gets to run, from what its transaction may see and lock at that
moment; when a target is not available it simply does less, as an
application would retry elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from applier.generate.session import Session
from applier.generate.tables import CART, CUSTOMERS, EVENTS, ORDER_LINES, ORDERS, PRODUCTS
from applier.generate.values import EVENT_KINDS

Script = Callable[[Session, int], Iterator[None]]


def new_order(s: Session, n: int) -> Iterator[None]:
    """Place an order with lines, credit the customer, log a checkout event."""
    if not (s.may_touch(ORDERS) and s.may_touch(ORDER_LINES)):
        return
    customer_id = s.sample_id(CUSTOMERS) or 1
    oid = s.db.next_id(ORDERS)
    s.insert(ORDERS, s.rows.order(oid, customer_id))
    yield
    for _ in range(max(1, n - 2)):
        s.insert(ORDER_LINES, s.rows.line(oid, s.db.next_line_no(oid), s.sample_id(PRODUCTS) or 1))
        yield
    picked = s.pick(CUSTOMERS) if s.rng.random() < 0.5 else None
    if picked:
        s.update(CUSTOMERS, picked[0], s.rows.customer_change(picked[1]))
        yield
    if s.insert_value(EVENTS, s.rows.event("checkout", oid)):
        yield


def order_update(s: Session, n: int) -> Iterator[None]:
    """Move orders along their status flow, sometimes twice in one transaction."""
    for _ in range(n):
        picked = s.pick(ORDERS)
        if picked is None:
            continue
        key, row = picked
        s.update(ORDERS, key, s.rows.order_change(row))
        yield
        if s.rng.random() < 0.2:
            again = s.get(ORDERS, key)
            if again is not None:
                s.update(ORDERS, key, s.rows.order_change(again))
                yield
        line_key = (key[0], 1)
        line = s.get(ORDER_LINES, line_key) if s.may_touch(ORDER_LINES) else None
        if line is not None and s.db.free_for(s.txn, ORDER_LINES, line_key) and s.rng.random() < 0.3:
            s.update(ORDER_LINES, line_key, s.rows.line_change(line))
            yield


def price_update(s: Session, n: int) -> Iterator[None]:
    """Reprice, restock or re-rate products."""
    for _ in range(n):
        picked = s.pick(PRODUCTS)
        if picked is not None:
            s.update(PRODUCTS, picked[0], s.rows.product_change(picked[1]))
            yield


def customer_update(s: Session, n: int) -> Iterator[None]:
    """Change customers' balances and details; now and then renumber one (a key move)."""
    for _ in range(n):
        picked = s.pick(CUSTOMERS)
        if picked is None:
            continue
        key, row = picked
        after = s.rows.customer_change(row)
        if s.rng.random() < 0.01:
            after["id"] = s.db.next_id(CUSTOMERS)
        s.update(CUSTOMERS, key, after)
        yield


def cart(s: Session, n: int) -> Iterator[None]:
    """Fill a new shopping cart and change it, or clean up an abandoned cart item."""
    if not s.may_touch(CART):
        return
    abandoned = s.pick(CART) if s.rng.random() < 0.3 else None
    if abandoned is not None:
        s.delete(CART, abandoned[0])
        yield
    session_id = f"s-{s.rng.getrandbits(40):010x}"
    keys = []
    for _ in range(max(1, n - 1)):
        row = s.rows.cart_item(session_id, s.sample_id(PRODUCTS) or 1)
        if s.insert(CART, row):
            keys.append((session_id, row["product_id"]))
            yield
    if len(keys) > 1:
        key = keys[s.rng.randrange(len(keys))]
        current = s.get(CART, key)
        if current is not None:
            s.update(CART, key, {**current, "qty": current["qty"] + 1})
            yield
        s.delete(CART, keys[0])
        yield


def event_log(s: Session, n: int) -> Iterator[None]:
    """Append events; sometimes deliver one twice, purge a copy or correct a score."""
    if not s.may_touch(EVENTS):
        return
    for _ in range(max(1, n - 1)):
        entity = s.sample_id(CUSTOMERS) or 1
        s.insert_value(EVENTS, s.rows.event(s.rng.choice(EVENT_KINDS), entity))
        yield
    value = s.pick_value(EVENTS)
    if value is None:
        return
    choice = s.rng.random()
    if choice < 0.4:
        s.insert_value(EVENTS, s.sample_row(EVENTS, value))  # the same event delivered again
    elif choice < 0.8:
        s.delete_value(EVENTS, value)
    else:
        s.update_value(EVENTS, value, {**s.sample_row(EVENTS, value), "score": s.rows.double(-100.0, 100.0)})
    yield


def cancel_order(s: Session, n: int) -> Iterator[None]:
    """Delete an order with all its lines, or mark it returned when a line is busy."""
    del n
    picked = s.pick(ORDERS)
    if picked is None or not s.may_touch(ORDER_LINES):
        return
    key, row = picked
    oid = key[0]
    line_keys = [(oid, no) for no in range(1, s.db.lines_used(oid) + 1)]
    if not all(s.db.free_for(s.txn, ORDER_LINES, k) for k in line_keys):
        s.update(ORDERS, key, {**row, "status": "returned"})
        yield
        return
    s.delete(ORDERS, key)  # first, so the order is locked while its lines go
    yield
    for line_key in line_keys:
        # A line can have been locked by another transaction since the check above.
        if s.get(ORDER_LINES, line_key) is not None and s.db.free_for(s.txn, ORDER_LINES, line_key):
            s.delete(ORDER_LINES, line_key)
            yield


SCRIPTS: Mapping[str, Script] = {
    "new_order": new_order,
    "order_update": order_update,
    "price_update": price_update,
    "customer_update": customer_update,
    "cart": cart,
    "event_log": event_log,
    "cancel_order": cancel_order,
}
