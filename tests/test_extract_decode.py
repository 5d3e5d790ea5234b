"""The extractor's pure parts: pgoutput messages, the type mapping, the decoder (no server).

Messages are built here byte by byte as PostgreSQL's "Logical Replication
Message Formats" describes them; test_extract_pg.py decodes real ones.
"""

from __future__ import annotations

import datetime as dt
import struct
from typing import Any

import pytest

from applier.errors import ExtractError
from applier.extract import pgoutput as po
from applier.extract.decode import Decoder, Position
from applier.extract.types import UnmappableError, spec_type, value_converter
from applier.intermediate.schema import TableDef

T0 = 1_000_000  # microseconds after 2000-01-01


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def begin(final_lsn: int, xid: int) -> bytes:
    return b"B" + struct.pack("!Qqi", final_lsn, T0, xid)


def commit(commit_lsn: int, end_lsn: int) -> bytes:
    return b"C" + struct.pack("!bQQq", 0, commit_lsn, end_lsn, T0)


def relation(oid: int, name: str, identity: str, columns: list[tuple[str, int, int, bool]]) -> bytes:
    out = b"R" + struct.pack("!I", oid) + _s("public") + _s(name) + identity.encode() + struct.pack("!h", len(columns))
    for col, type_oid, typmod, key in columns:
        out += struct.pack("!b", int(key)) + _s(col) + struct.pack("!Ii", type_oid, typmod)
    return out


def tup(*values: str | None) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "<toast>":
            out += b"u"
        else:
            out += b"t" + struct.pack("!i", len(v.encode())) + v.encode()
    return out


def insert(oid: int, *values: str | None) -> bytes:
    return b"I" + struct.pack("!I", oid) + b"N" + tup(*values)


def update(oid: int, new: tuple[str | None, ...], old: tuple[str | None, ...] | None = None, kind: str = "K") -> bytes:
    head = b"U" + struct.pack("!I", oid)
    if old is not None:
        head += kind.encode() + tup(*old)
    return head + b"N" + tup(*new)


def delete(oid: int, old: tuple[str | None, ...], kind: str = "K") -> bytes:
    return b"D" + struct.pack("!I", oid) + kind.encode() + tup(*old)


class Sink:
    """Records what the decoder passes on."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.defs: list[TableDef] = []

    def define_table(self, table: TableDef) -> None:
        self.defs.append(table)

    def row(self, lsn: int, xid: str, table: str, op: str, before: Any, after: Any) -> None:
        self.calls.append(("row", lsn, xid, table, op, before, after))

    def begin(self, xid: str, lsn: int, ts: dt.datetime) -> None:
        self.calls.append(("begin", lsn, xid))

    def commit(self, xid: str, lsn: int, ts: dt.datetime) -> None:
        self.calls.append(("commit", lsn, xid))

    def rollback(self, xid: str, lsn: int, ts: dt.datetime) -> None:
        self.calls.append(("rollback", lsn, xid))


ORDERS = relation(10, "orders", "d", [("id", 23, -1, True), ("note", 25, -1, False)])


def _decode(*messages: bytes, **kwargs: Any) -> Sink:
    sink = Sink()
    decoder = Decoder(sink, lambda schema, table: (), **kwargs)
    for m in messages:
        decoder.handle(m)
    return sink


def test_lsns_count_on_and_each_item_has_its_source_position() -> None:
    sink = Sink()
    decoder = Decoder(sink, lambda schema, table: (), next_lsn=41)
    positions = []
    for m in (
        begin(0x500, 7), ORDERS, insert(10, "1", "a"), insert(10, "2", None), commit(0x500, 0x530),
        begin(0x600, 8), update(10, ("1", "b")), commit(0x600, 0x630),
    ):  # fmt: skip
        decoder.handle(m)
        positions.append(decoder.done)
    assert sink.calls == [
        ("begin", 41, "7"),
        ("row", 42, "7", "public.orders", "I", None, {"id": 1, "note": "a"}),
        ("row", 43, "7", "public.orders", "I", None, {"id": 2, "note": None}),
        ("commit", 44, "7"),
        ("begin", 45, "8"),
        ("row", 46, "8", "public.orders", "U", {"id": 1}, {"id": 1, "note": "b"}),
        ("commit", 47, "8"),
    ]
    assert positions[2:5] == [Position(0x500, 2), Position(0x500, 3), Position(0x500)]  # begin and a row, two; whole
    assert positions[-2:] == [Position(0x600, 2), Position(0x600)]
    assert sink.defs[0].primary_key == ("id",)
    assert [c.nullable for c in sink.defs[0].columns] == [False, True]


def test_restart_skips_everything_at_or_before_the_last_written_position() -> None:
    first = (begin(0x400, 6), ORDERS, insert(10, "9", "z"), commit(0x400, 0x430))
    messages = (*first, begin(0x500, 7), insert(10, "1", "a"), insert(10, "2", "b"), commit(0x500, 0x530))
    sink = _decode(*messages, resume=Position(0x500, 2), next_lsn=100)  # its begin and first row are written
    assert sink.calls == [
        ("row", 100, "7", "public.orders", "I", None, {"id": 2, "note": "b"}),
        ("commit", 101, "7"),
    ]
    assert _decode(*messages, resume=Position(0x500)).calls == []  # whole


def test_a_transaction_of_more_than_a_million_rows_is_numbered_on() -> None:
    class Counting(Sink):
        def row(self, lsn: int, xid: str, table: str, op: str, before: Any, after: Any) -> None:
            self.calls.append(lsn)  # type: ignore[arg-type]

    sink = Counting()
    decoder = Decoder(sink, lambda schema, table: ())
    row = insert(10, "1", "a")
    for m in (begin(0x500, 7), ORDERS, *([row] * 1_100_000), commit(0x500, 0x530)):
        decoder.handle(m)
    assert sink.calls[0] == ("begin", 1, "7") and sink.calls[-1] == ("commit", 1_100_002, "7")
    assert sink.calls[-2] == 1_100_001


def test_key_move_keeps_old_key_in_before() -> None:
    sink = _decode(begin(0x500, 7), ORDERS, update(10, ("2", "x"), old=("1", None)), commit(0x500, 0x530))
    assert sink.calls[1][4:] == ("U", {"id": 1}, {"id": 2, "note": "x"})


def test_delete_by_key_and_by_full_row() -> None:
    full = relation(11, "logs", "f", [("msg", 25, -1, True)])
    sink = _decode(
        begin(0x500, 7), ORDERS, delete(10, ("1", None)), full, delete(11, ("m",), kind="O"), commit(0x500, 0x530)
    )
    assert sink.calls[1][4:] == ("D", {"id": 1}, None)
    assert sink.calls[2][3:] == ("public.logs", "D", {"msg": "m"}, None)


def test_keyless_update_without_full_identity_names_table_and_fix() -> None:
    keyless = relation(11, "logs", "d", [("msg", 25, -1, False)])
    with pytest.raises(ExtractError, match=r"public\.logs .*ALTER TABLE public\.logs REPLICA IDENTITY FULL"):
        _decode(begin(0x500, 7), keyless, update(11, ("m",)), commit(0x500, 0x530))


def test_unchanged_toast_comes_from_the_full_old_row() -> None:
    full = relation(11, "docs", "f", [("id", 23, -1, True), ("body", 25, -1, False)])
    sink = Sink()
    decoder = Decoder(sink, lambda schema, table: ("id",))
    for m in (begin(0x500, 7), full, update(11, ("1", "<toast>"), old=("1", "long"), kind="O"), commit(0x500, 0x530)):
        decoder.handle(m)
    assert sink.calls[1][5:] == ({"id": 1, "body": "long"}, {"id": 1, "body": "long"})


def test_added_nullable_column_is_a_new_definition() -> None:
    wider = relation(10, "orders", "d", [("id", 23, -1, True), ("note", 25, -1, False), ("qty", 20, -1, False)])
    changes = (insert(10, "1", "a"), wider, insert(10, "2", "b", "3"))
    sink = _decode(begin(0x500, 7), ORDERS, *changes, commit(0x500, 0x530))
    assert [d.column_names for d in sink.defs] == [("id", "note"), ("id", "note", "qty")]


def test_column_type_change_stops_naming_the_table() -> None:
    changed = relation(10, "orders", "d", [("id", 20, -1, True), ("note", 25, -1, False)])
    with pytest.raises(ExtractError, match=r"table public\.orders: column id changed from int to bigint"):
        _decode(begin(0x500, 7), ORDERS, insert(10, "1", "a"), changed, insert(10, "2", "b"))


def test_truncate_of_two_tables_is_one_row_each() -> None:
    other = relation(11, "items", "d", [("id", 23, -1, True)])
    trunc = b"T" + struct.pack("!ib", 2, 0) + struct.pack("!II", 10, 11)
    sink = _decode(begin(0x500, 7), ORDERS, other, trunc, commit(0x500, 0x530))
    assert [(c[3], c[4]) for c in sink.calls if c[0] == "row"] == [("public.orders", "T"), ("public.items", "T")]


def test_excluded_table_and_empty_transaction_write_nothing() -> None:
    sink = _decode(begin(0x500, 7), ORDERS, insert(10, "1", "a"), commit(0x500, 0x530), exclude={"public.orders"})
    assert sink.calls == []


def test_unknown_type_is_refused_naming_table_column_and_type() -> None:
    with pytest.raises(ExtractError, match=r"table public\.t, column at: type oid 1083 has no spec type"):
        _decode(begin(0x500, 7), relation(12, "t", "d", [("at", 1083, -1, False)]), insert(12, "10:00"))


def test_table_left_out_is_not_refused_for_its_types() -> None:
    rel = relation(12, "t", "d", [("at", 1083, -1, False)])
    sink = _decode(begin(0x500, 7), rel, insert(12, "10:00"), commit(0x500, 0x530), include={"public.orders"})
    assert sink.calls == [] and sink.defs == []


def test_unmappable_value_names_table_column_and_value() -> None:
    rel = relation(12, "t", "d", [("id", 23, -1, True), ("d", 1082, -1, False)])
    with pytest.raises(ExtractError, match=r"table public\.t, column d: value 'infinity'"):
        _decode(begin(0x500, 7), rel, insert(12, "1", "infinity"), commit(0x500, 0x530))


NUMERIC_12_2 = ((12 << 16) | 2) + 4


@pytest.mark.parametrize(
    ("oid", "typmod", "expected"),
    [
        (16, -1, "boolean"), (21, -1, "int"), (23, -1, "int"), (20, -1, "bigint"), (700, -1, "double"),
        (701, -1, "double"), (1700, NUMERIC_12_2, "decimal(12,2)"), (1700, -1, "decimal(38,18)"),
        (25, -1, "string"), (1043, 14, "string"), (1042, 9, "string"), (2950, -1, "string"), (114, -1, "string"),
        (3802, -1, "string"), (1082, -1, "date"), (1114, -1, "timestamp"), (1184, -1, "timestamp"),
        (17, -1, "binary"),
    ],
)  # fmt: skip
def test_type_mapping(oid: int, typmod: int, expected: str) -> None:
    assert spec_type(oid, typmod) == expected


@pytest.mark.parametrize(("oid", "typmod"), [(1083, -1), (1186, -1), (1007, -1), (1700, ((40 << 16) | 2) + 4)])
def test_types_without_spec_type_are_refused(oid: int, typmod: int) -> None:
    with pytest.raises(UnmappableError):
        spec_type(oid, typmod)


@pytest.mark.parametrize(
    ("oid", "type_name", "text", "expected"),
    [
        (16, "boolean", "t", True), (16, "boolean", "f", False), (23, "int", "-2147483648", -2147483648),
        (20, "bigint", "9223372036854775807", 9223372036854775807), (701, "double", "1.5e+300", 1.5e300),
        (701, "double", "NaN", "NaN"), (701, "double", "-Infinity", "-Infinity"),
        (700, "double", "1.1", 1.100000023841858), (1700, "decimal(12,2)", "-12.50", "-12.50"),
        (1700, "decimal(38,18)", "3.141592653589793238", "3.141592653589793238"),
        (1082, "date", "2026-02-28", "2026-02-28"),
        (1114, "timestamp", "2026-11-21 10:00:00.12", "2026-11-21T10:00:00.120000Z"),
        (1184, "timestamp", "2026-11-21 10:00:00+00", "2026-11-21T10:00:00.000000Z"),
        (17, "binary", "\\x00ff41", "AP9B"), (25, "string", "é ☃", "é ☃"),
    ],
)  # fmt: skip
def test_value_conversion(oid: int, type_name: str, text: str, expected: object) -> None:
    assert value_converter(oid, type_name)(text) == expected


@pytest.mark.parametrize(
    ("oid", "type_name", "text"),
    [
        (1700, "decimal(12,2)", "NaN"), (1700, "decimal(38,18)", "Infinity"),
        (1700, "decimal(38,18)", "1.1234567890123456789"), (1700, "decimal(38,18)", "123456789012345678901"),
        (1082, "date", "infinity"), (1082, "date", "0044-03-15 BC"), (1082, "date", "10000-01-01"),
        (1114, "timestamp", "-infinity"), (1114, "timestamp", "10000-01-01 00:00:00"),
        (1184, "timestamp", "0001-01-01 00:00:00+00 BC"),
    ],
)  # fmt: skip
def test_values_without_exact_spec_value_are_refused(oid: int, type_name: str, text: str) -> None:
    with pytest.raises(UnmappableError):
        value_converter(oid, type_name)(text)


def test_begin_message_times_are_utc_after_2000() -> None:
    message = po.parse(begin(0x500, 7))
    assert message == po.Begin(0x500, dt.datetime(2000, 1, 1, 0, 0, 1, tzinfo=dt.UTC), 7)


def test_source_and_extract_keys_are_validated() -> None:
    from applier.config import load_config
    from applier.errors import ConfigError

    base = ["configuration_name=c", "intermediate_dir=i", "output_dir=o", "target.path=t"]
    config = load_config(None, [*base, "source.slot=s1", "source.include=public.a, public.b", "extract.max_pair_mb=8"])
    assert config.source.include == frozenset({"public.a", "public.b"}) and config.extract.max_pair_mb == 8.0
    assert config.extract.max_pair_seconds == 60.0 and config.source.url is None
    with pytest.raises(ConfigError, match=r"'source\.slot': 'Bad-Slot'"):
        load_config(None, [*base, "source.slot=Bad-Slot"])
    with pytest.raises(ConfigError, match=r"'source\.exclude': 'orders'.*not schema\.table"):
        load_config(None, [*base, "source.exclude=orders"])
    with pytest.raises(ConfigError, match=r"'extract\.max_pair_mb': 0"):
        load_config(None, [*base, "extract.max_pair_mb=0"])


def test_materialize_keys_are_validated() -> None:
    from applier.config import load_config
    from applier.errors import ConfigError

    base = ["configuration_name=c", "intermediate_dir=i", "output_dir=o", "target.path=t"]
    config = load_config(None, [*base, "materialize.chunk_rows=5000"])
    assert (config.materialize.chunk_rows, config.materialize.lock_timeout_s) == (5000, 30.0)
    with pytest.raises(ConfigError, match=r"'materialize\.chunk_rows': 2000000.*from 1 to 1,000,000"):
        load_config(None, [*base, "materialize.chunk_rows=2000000"])
    with pytest.raises(ConfigError, match=r"'materialize\.lock_timeout_s': -1"):
        load_config(None, [*base, "materialize.lock_timeout_s=-1"])


def test_logical_message_is_parsed() -> None:
    content = b'{"t": "public.t", "a": "x", "k": "start"}'
    data = b"M" + struct.pack("!bQ", 1, 0x700) + _s("cdc-applier") + struct.pack("!i", len(content)) + content
    assert po.parse(data) == po.LogicalMessage(True, "cdc-applier", content)
