"""Column values in the spec's JSON encoding, and the shop rows built from them.

Values are produced directly as JSON-ready text or numbers (decimals as exact
strings, timestamps with microseconds, base64 binaries, double specials as
strings) so no conversion is needed per row. Names deliberately mix accents,
non-Latin scripts, CJK and emoji.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import random
from typing import Any

from applier.generate.clock import EPOCH, SimClock

Row = dict[str, Any]

FIRST_NAMES = (
    "Zoë", "José", "François", "Søren", "Łukasz", "İlkay", "Ngọc Anh", "Hana", "Olivia", "Noah",
    "Chloé", "Jürgen", "Ana", "Мария", "Αλέξης", "María", "Björk", "Aiko", "Liam", "明",
)  # fmt: skip
LAST_NAMES = (
    "Müller", "García", "Dvořák", "Nguyễn", "O'Brien", "Kowalski", "Åberg", "Ferreira", "山田", "김",
    "Иванова", "Παπαδόπουλος", "Smith", "Núñez", "Sørensen", "李", "Brown 🌸", "Ólafsdóttir",
)  # fmt: skip
PRODUCT_NAMES = (
    "Crème brûlée kit", "Tasse 茶碗", "Kaffee ☕ Bohnen", "Headphones 🎧", "Ñandú plush", "Smørrebrød board",
    "Чайник", "Café au lait mug", "Brezel 🥨", "Umbrella ☂", "抹茶 Matcha", "Plain notebook", "USB cable",
    "Łódź map", "Jalapeño sauce 🌶", "Ελιές olives",
)  # fmt: skip
# Names the unicode scenario inserts, so every stream holds each kind of script.
UNICODE_NAMES = ("Zoë Ångström", "王小明", "Łukasz Żółć", "Ελένη 😀", "Иван Петров 🚀", "Nguyễn Thị Ánh")
NOTES = (None, None, "leave at door", "gift wrap 🎁", "Lieferung bis 18 Uhr", "配達前に電話してください", "¡Gracias!")
ORDER_FLOW = {"new": "paid", "paid": "shipped", "shipped": "delivered", "delivered": "returned", "returned": "returned"}
EVENT_KINDS = ("page_view", "add_to_cart", "checkout", "login", "sensor")
DOUBLE_SPECIALS = ("NaN", "Infinity", "-Infinity")
_DAY_US = 86_400_000_000


def _between(rng: random.Random, lo: int, hi: int) -> int:
    """A random integer in ``[lo, hi]``; ``randint`` costs several times more per call."""
    return lo + int(rng.random() * (hi - lo + 1))


def decimal_text(units: int, scale: int = 2) -> str:
    """The exact decimal ``units / 10**scale`` as spec text (``-12.05``)."""
    sign = "-" if units < 0 else ""
    whole, frac = divmod(abs(units), 10**scale)
    return f"{sign}{whole}.{frac:0{scale}d}" if scale else f"{sign}{whole}"


@functools.lru_cache(maxsize=4096)
def _second_text(seconds: int) -> str:
    return f"{EPOCH + dt.timedelta(seconds=seconds):%Y-%m-%dT%H:%M:%S}"


def timestamp_text(micros: int) -> str:
    """Microseconds since the epoch as spec text (``2026-01-05T08:00:00.123457Z``)."""
    seconds, fraction = divmod(micros, 1_000_000)
    return f"{_second_text(seconds)}.{fraction:06d}Z"


@functools.lru_cache(maxsize=4096)
def _day_text(days: int) -> str:
    return (EPOCH + dt.timedelta(days=days)).date().isoformat()


def date_text(micros: int) -> str:
    """The UTC calendar day of ``micros`` since the epoch as ``YYYY-MM-DD``."""
    return _day_text(micros // _DAY_US)


class RowFactory:
    """Builds new rows and changed rows of the shop tables.

    Args:
        rng: the generator's single random source.
        clock: simulated time, for ``created_at``-like columns.
    """

    def __init__(self, rng: random.Random, clock: SimClock) -> None:
        self.rng = rng
        self.clock = clock
        self.customer_phone = False  # set once shop.customers gains its phone column

    def double(self, lo: float, hi: float, special_rate: float = 0.002) -> float | str:
        """A double in ``[lo, hi)`` rounded to 4 places, now and then NaN or an infinity."""
        if self.rng.random() < special_rate:
            return self.rng.choice(DOUBLE_SPECIALS)
        return round(self.rng.uniform(lo, hi), 4)

    def binary(self, size: int) -> str:
        """``size`` random bytes as standard base64."""
        return base64.b64encode(self.rng.randbytes(size)).decode("ascii")

    def ago(self, max_days: int) -> int:
        """A moment up to ``max_days`` before now, in microseconds since the epoch."""
        return self.clock.now_us - self.rng.randrange(max_days * _DAY_US)

    def customer(self, cid: int, name: str | None = None) -> Row:
        """A new customer row with id ``cid``."""
        rng = self.rng
        row: Row = {
            "id": cid,
            "name": name or f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}",
            "email": None if rng.random() < 0.1 else f"c{cid}@example.com",
            "birth_date": None if rng.random() < 0.2 else date_text(self.ago(30_000) - 18 * 365 * _DAY_US),
            "vip": rng.random() < 0.1,
            "balance": decimal_text(_between(rng, -50_000, 500_000)),
            "loyalty_points": _between(rng, 0, 5_000),
            "avatar": None if rng.random() < 0.5 else self.binary(_between(rng, 4, 24)),
            "created_at": timestamp_text(self.ago(900)),
        }
        if self.customer_phone:
            row["phone"] = None if rng.random() < 0.3 else f"+49 30 {_between(rng, 1_000_000, 9_999_999)}"
        return row

    def customer_change(self, row: Row) -> Row:
        """``row`` after a typical customer update (balance, points, flags, contact)."""
        rng = self.rng
        new = {**row, "balance": decimal_text(_between(rng, -50_000, 500_000))}
        pick = rng.random()
        if pick < 0.4:
            new["loyalty_points"] = min(row["loyalty_points"] + _between(rng, 1, 100), 2**31 - 1)
        elif pick < 0.6:
            new["vip"] = not row["vip"]
        elif pick < 0.8:
            new["email"] = f"c{row['id']}.{_between(rng, 1, 99)}@example.org"
        elif self.customer_phone:
            new["phone"] = f"+33 1 {_between(rng, 10_000_000, 99_999_999)}"
        return new

    def product(self, pid: int, name: str | None = None) -> Row:
        """A new product row with id ``pid``."""
        rng = self.rng
        stock = _between(rng, 0, 500)
        return {
            "id": pid,
            "sku": f"SKU-{pid:06d}",
            "name": name or f"{rng.choice(PRODUCT_NAMES)} #{pid}",
            "price": decimal_text(_between(rng, 99, 99_999)),
            "rating": None if rng.random() < 0.2 else self.double(1.0, 5.0),
            "in_stock": stock > 0,
            "stock": stock,
            "thumbnail": None if rng.random() < 0.3 else self.binary(_between(rng, 8, 32)),
            "updated_at": timestamp_text(self.clock.now_us),
        }

    def product_change(self, row: Row) -> Row:
        """``row`` after a price, stock or rating change."""
        rng = self.rng
        new = {**row, "updated_at": timestamp_text(self.clock.now_us)}
        pick = rng.random()
        if pick < 0.4:
            new["price"] = decimal_text(_between(rng, 99, 99_999))
        elif pick < 0.8:
            new["stock"] = stock = max(0, row["stock"] + _between(rng, -20, 30))
            new["in_stock"] = stock > 0
        else:
            new["rating"] = self.double(1.0, 5.0, special_rate=0.01)
        return new

    def order(self, oid: int, customer_id: int) -> Row:
        """A new order of ``customer_id`` with id ``oid``."""
        rng = self.rng
        return {
            "id": oid,
            "customer_id": customer_id,
            "status": "new",
            "total": decimal_text(_between(rng, 100, 2_000_000)),
            "ordered_at": timestamp_text(self.clock.now_us),
            "ship_date": None,
            "note": rng.choice(NOTES),
        }

    def order_change(self, row: Row) -> Row:
        """``row`` moved one step along new -> paid -> shipped -> delivered -> returned."""
        status = ORDER_FLOW[row["status"]]
        new = {**row, "status": status}
        if status == "shipped":
            new["ship_date"] = date_text(self.clock.now_us)
        elif status == "returned":
            new["note"] = self.rng.choice(NOTES[2:])
        return new

    def line(self, oid: int, line_no: int, product_id: int) -> Row:
        """A new order line ``(oid, line_no)`` of ``product_id``."""
        rng = self.rng
        return {
            "order_id": oid,
            "line_no": line_no,
            "product_id": product_id,
            "qty": _between(rng, 1, 12),
            "unit_price": decimal_text(_between(rng, 99, 99_999)),
            "discount": 0.0 if rng.random() < 0.6 else self.double(0.0, 0.5),
        }

    def line_change(self, row: Row) -> Row:
        """``row`` with a new quantity and discount."""
        return {**row, "qty": _between(self.rng, 1, 12), "discount": self.double(0.0, 0.5)}

    def cart_item(self, session_id: str, product_id: int) -> Row:
        """A new cart item of ``product_id`` in ``session_id``."""
        return {
            "session_id": session_id,
            "product_id": product_id,
            "qty": _between(self.rng, 1, 5),
            "added_at": timestamp_text(self.clock.now_us),
        }

    def event(self, kind: str, entity_id: int, score: float | str | None = None) -> Row:
        """An event-log row; ``score`` defaults to a random double (or null)."""
        rng = self.rng
        payload = f'{{"ua": "{rng.choice(FIRST_NAMES)}", "v": {_between(rng, 1, 9)}}}' if rng.random() < 0.5 else None
        if score is None and rng.random() < 0.8:
            score = self.double(-100.0, 100.0, special_rate=0.003)
        return {
            "at": timestamp_text(self.clock.now_us - rng.randrange(5_000_000)),
            "kind": kind,
            "entity_id": entity_id,
            "score": score,
            "payload": payload,
        }
