"""The reader against pairs written by hand (pyarrow + json), one defect at a time."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from applier.engine.reading import read_cycle
from applier.errors import IntermediateFileError
from applier.intermediate.pairs import list_pairs
from applier.intermediate.reader import read_pair
from applier.intermediate.scan import scan_directory
from applier.intermediate.schema import tables_metadata_of
from applier.intermediate.stream import StreamValidator
from handmade import ACCOUNTS, event, good_first_pair, row, write_pair

ROWS_T3 = [row(21, "t3", "I", after={"id": 3, "owner": "cy", "balance": "3.00"})]
EVENTS_T3 = [event("begin", "t3", 20), event("commit", "t3", 22)]


def _dat_without(column: str | None, metadata: bool = True) -> bytes:
    names = ["lsn", "xid", "table", "op", "before", "after"]
    data = {n: [] for n in names if n != column}
    meta = {"cdc.tables": json.dumps({"bank.accounts": ACCOUNTS})} if metadata else None
    sink = pa.BufferOutputStream()
    pq.write_table(
        pa.table(data, schema=pa.schema([(n, pa.int64() if n == "lsn" else pa.string()) for n in data], metadata=meta)),
        sink,
    )
    return sink.getvalue().to_pybytes()


def _pair2(rows=ROWS_T3, events=EVENTS_T3, **kw) -> Callable[[Path], None]:
    return lambda d: write_pair(d, 2, rows, events, **kw) and None


def _insert(after: object, xid: str = "t3") -> Callable[[Path], None]:
    return _pair2([row(21, xid, "I", after=after)])


_TS = "2026-11-21T10:00:00.000000Z"
_ARABIC_INDIC_TWO = "\u0662"  # a digit to the \\d of Python's re, not to the spec
_LSNS = {"header_changes": {"first_lsn": 20, "last_lsn": 22}}  # the header right, so the events are what is wrong


def _blank_line_after_header(trn: Path) -> None:
    header, *events = trn.read_text().splitlines()
    trn.write_text("\n".join([header, "", *events]) + "\n")


def _join_event_lines(trn: Path) -> None:
    header, *events = trn.read_text().splitlines()
    trn.write_text("\n".join([header, ",".join(events)]) + "\n")


ACCOUNTS_RETYPED = {
    "bank.accounts": {
        **ACCOUNTS,
        "columns": [*ACCOUNTS["columns"][:2], {"name": "balance", "type": "string", "nullable": True}],
    }
}
ACCOUNTS_PLUS_NOT_NULL = {
    "bank.accounts": {**ACCOUNTS, "columns": [*ACCOUNTS["columns"], {"name": "x", "type": "int", "nullable": False}]}
}

DEFECTS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "header-missing": ("header-missing", _pair2(header_changes={"record": "begin"})),
    "header-format": ("header-format", _pair2(header_changes={"format": "other"})),
    "header-version": ("header-version", _pair2(header_changes={"version": 2})),
    "header-seq": ("header-invalid", _pair2(header_changes={"seq": 7})),
    "rows-mismatch": ("rows-mismatch", _pair2(header_changes={"dat_rows": 5})),
    "bytes-mismatch": ("bytes-mismatch", _pair2(header_changes={"dat_bytes": 1})),
    "sha-mismatch": ("sha-mismatch", _pair2(header_changes={"dat_sha256": "0" * 64})),
    "header-lsn-range": ("header-lsn-mismatch", _pair2(header_changes={"last_lsn": 99})),
    "dat-not-parquet": ("dat-not-parquet", _pair2([], [], dat_bytes=b"this is not parquet")),
    "dat-missing-column": ("dat-missing-column", _pair2([], [], dat_bytes=_dat_without("after"))),
    "dat-no-table-metadata": ("dat-no-table-metadata", _pair2([], [], dat_bytes=_dat_without(None, metadata=False))),
    "dat-unknown-type": (
        "dat-table-metadata-invalid",
        _pair2(tables={"bank.accounts": {**ACCOUNTS, "columns": [{"name": "id", "type": "uuid", "nullable": False}]}}),
    ),
    "dat-missing": ("dat-missing", lambda d: (_pair2()(d), (d / "000000000002.dat").unlink())),
    "event-bad-ts": ("event-invalid", _pair2(events=[{**EVENTS_T3[0], "ts": "yesterday"}, EVENTS_T3[1]])),
    # A file's events are first decoded at once; each of these must still be refused, line by line.
    "event-ts-other-digits": ("event-invalid", _pair2(events=[{**EVENTS_T3[0], "ts": _ARABIC_INDIC_TWO + _TS[1:]}])),
    "event-lsn-boolean": ("event-invalid", _pair2(events=[EVENTS_T3[0], {**EVENTS_T3[1], "lsn": True}], **_LSNS)),
    "event-lsn-float": ("event-invalid", _pair2(events=[EVENTS_T3[0], {**EVENTS_T3[1], "lsn": 22.0}], **_LSNS)),
    "event-xid-empty": ("event-invalid", _pair2(events=[{**EVENTS_T3[0], "xid": ""}, EVENTS_T3[1]])),
    "event-record-unknown": ("event-invalid", _pair2(events=[EVENTS_T3[0], {**EVENTS_T3[1], "record": "prepare"}])),
    "event-two-on-a-line": ("event-invalid", lambda d: (_pair2()(d), _join_event_lines(d / "000000000002.trn"))),
    "event-blank-line": ("event-invalid", lambda d: (_pair2()(d), _blank_line_after_header(d / "000000000002.trn"))),
    "event-lsn-order": (
        "lsn-out-of-order",
        _pair2(events=[event("begin", "t3", 20), event("begin", "t4", 19), event("commit", "t3", 22)]),
    ),
    "row-lsn-order": ("lsn-out-of-order", _pair2([ROWS_T3[0], row(21, "t3", "D", before={"id": 3})])),
    "op-invalid": ("op-invalid", _pair2([row(21, "t3", "X", after={"id": 3, "owner": "cy", "balance": "3.00"})])),
    "table-undescribed": ("table-undescribed", _pair2([row(21, "t3", "T", table="bank.other")])),
    "table-name-unsafe": ("table-name-unsafe", _pair2([row(21, "t3", "T", table="../etc.passwd")])),
    "table-name-unsafe-metadata": ("table-name-unsafe", _pair2(tables={"bank.acc ounts": ACCOUNTS})),
    "image-not-json": ("image-not-object", _insert("{not json")),
    "image-not-object": ("image-not-object", _insert("[1, 2]")),
    "image-unexpected": (
        "image-unexpected",
        _pair2([row(21, "t3", "I", before={"id": 3}, after={"id": 3, "owner": None, "balance": None})]),
    ),
    "column-missing": ("column-missing", _insert({"id": 3, "owner": "cy"})),
    "column-unknown": ("column-unknown", _insert({"id": 3, "owner": "cy", "balance": "3.00", "colour": "red"})),
    "key-column-missing": ("key-column-missing", _pair2([row(21, "t3", "D", before={"owner": "ann"})])),
    "value-string-for-bigint": ("value-wrong-type", _insert({"id": "three", "owner": "cy", "balance": "3.00"})),
    "value-bool-for-bigint": ("value-wrong-type", _insert({"id": True, "owner": "cy", "balance": "3.00"})),
    "value-bigint-overflow": ("value-wrong-type", _insert({"id": 2**63, "owner": "cy", "balance": "3.00"})),
    "value-decimal-scale": ("value-wrong-type", _insert({"id": 3, "owner": "cy", "balance": "3.001"})),
    "value-decimal-precision": ("value-wrong-type", _insert({"id": 3, "owner": "cy", "balance": "123456789.00"})),
    "value-decimal-number": ("value-wrong-type", _insert({"id": 3, "owner": "cy", "balance": 3.5})),
    "value-null-in-key": ("value-wrong-type", _insert({"id": None, "owner": "cy", "balance": "3.00"})),
    "row-without-begin": ("row-without-begin", _insert({"id": 3, "owner": "cy", "balance": "3.00"}, xid="zz")),
    "end-without-begin": ("end-without-begin", _pair2([], [event("commit", "zz", 20)])),
    "second-begin": ("second-begin", _pair2([], [event("begin", "t1", 20)])),
    "second-begin-of-open": ("second-begin", _pair2([], [event("begin", "t2", 20)])),
    "second-begin-after-its-end": (
        "second-begin",
        _pair2([], [event("begin", "t3", 20), event("commit", "t3", 21), event("begin", "t3", 22)], **_LSNS),
    ),
    "second-end": ("second-end", _pair2([], [event("rollback", "t1", 20)])),
    "row-after-end-earlier-pair": ("row-after-end", _insert({"id": 3, "owner": "cy", "balance": "3.00"}, xid="t1")),
    "row-after-end-same-pair": ("row-after-end", _pair2([row(23, "t3", "D", before={"id": 1})])),
    "lsn-below-previous-pair": (
        "lsn-below-previous-pair",
        _pair2(
            [row(9, "t3", "I", after={"id": 3, "owner": "c", "balance": "1.00"})],
            [event("begin", "t3", 8), event("commit", "t3", 22)],
        ),
    ),
    "schema-retyped": ("schema-change-incompatible", _pair2(ROWS_T3[:0], EVENTS_T3, tables=ACCOUNTS_RETYPED)),
    "schema-not-null-added": (
        "schema-change-incompatible",
        _pair2(ROWS_T3[:0], EVENTS_T3, tables=ACCOUNTS_PLUS_NOT_NULL),
    ),
    "schema-key-changed": (
        "schema-change-incompatible",
        _pair2(ROWS_T3[:0], EVENTS_T3, tables={"bank.accounts": {**ACCOUNTS, "primary_key": ["owner"]}}),
    ),
    "schema-column-dropped": (
        "schema-change-incompatible",
        _pair2(ROWS_T3[:0], EVENTS_T3, tables={"bank.accounts": {**ACCOUNTS, "columns": ACCOUNTS["columns"][:2]}}),
    ),
}


@pytest.mark.parametrize("case", sorted(DEFECTS))
def test_each_defect_is_refused_with_its_own_message_and_nothing_after_it_is_read(tmp_path: Path, case: str) -> None:
    code, write_defect = DEFECTS[case]
    good_first_pair(tmp_path)
    write_defect(tmp_path)
    # Pair 3 is itself broken in another way: reaching it would change the error.
    write_pair(tmp_path, 3, [], [], header_changes={"format": "pair-three"})
    done: list[int] = []
    with pytest.raises(IntermediateFileError) as refused:
        scan_directory(tmp_path, lambda n, total: done.append(n))
    assert refused.value.code == code
    assert refused.value.seq == 2
    assert "000000000002" in str(refused.value)
    assert done == [1], "pair 1 is accepted and nothing after pair 2 is read"


def test_a_gap_stops_the_stream_before_the_missing_pair(tmp_path: Path) -> None:
    good_first_pair(tmp_path)
    write_pair(tmp_path, 3, [], [])
    listing = list_pairs(tmp_path)
    assert [p.seq for p in listing.pairs] == [1]
    with pytest.raises(IntermediateFileError) as refused:
        scan_directory(tmp_path)
    assert refused.value.code == "gap"
    assert "000000000002" in str(refused.value) and "000000000003" in str(refused.value)


def test_temporary_names_and_a_dat_without_its_trn_are_ignored(tmp_path: Path) -> None:
    good_first_pair(tmp_path)
    shutil.copy(tmp_path / "000000000001.dat", tmp_path / "000000000002.dat")
    (tmp_path / ".000000000003.trn.tmp").write_text("junk")
    (tmp_path / "000000000003.trn.tmp").write_text("junk")
    listing = list_pairs(tmp_path)
    assert [p.seq for p in listing.pairs] == [1] and listing.gap_seq is None


def test_a_good_handmade_pair_reads_back_intact(tmp_path: Path) -> None:
    good_first_pair(tmp_path)
    (ref,) = list_pairs(tmp_path).pairs
    pair = read_pair(ref)
    assert pair.header.dat_rows == 3 and pair.header.first_lsn == 10 and pair.header.last_lsn == 15
    assert [(e.record, e.xid, e.lsn) for e in pair.events] == [
        ("begin", "t1", 10),
        ("commit", "t1", 13),
        ("begin", "t2", 14),
    ]
    assert pair.data["lsn"].to_pylist() == [11, 12, 15]
    assert pair.data["op"].to_pylist() == ["I", "I", "U"]
    assert json.loads(pair.data["after"][2].as_py()) == {"id": 1, "owner": "ann", "balance": "9.99"}
    assert pair.tables["bank.accounts"].primary_key == ("id",)
    assert [c.type for c in pair.tables["bank.accounts"].columns] == ["bigint", "string", "decimal(10,2)"]
    assert ref.size == (tmp_path / "000000000001.dat").stat().st_size + (tmp_path / "000000000001.trn").stat().st_size


def test_a_pairs_tally_and_touches_say_per_transaction_what_its_events_and_rows_say(tmp_path: Path) -> None:
    events = [
        event("begin", "t1", 20),
        event("begin", "t2", 21),
        event("commit", "t1", 25),
        event("begin", "t3", 26),
        event("rollback", "t2", 27),
        event("begin", "t4", 28),
    ]
    rows = [
        row(22, "t1", "I", after={"id": 1, "owner": "a", "balance": "1.00"}),
        row(23, "t2", "I", after={"id": 2, "owner": "b", "balance": "2.00"}),
        row(24, "t1", "U", before={"id": 1}, after={"id": 1, "owner": "a", "balance": "1.50"}),
        row(29, "t4", "D", before={"id": 1}),
        row(30, "t4", "I", after={"id": 5, "owner": None, "balance": None}),
    ]
    write_pair(tmp_path, 1, rows, events)
    (ref,) = list_pairs(tmp_path).pairs
    pair = read_pair(ref)
    tally = pair.tally
    # Worked out by hand from the events above.
    assert tally.begun == {"t1": 20, "t2": 21, "t3": 26, "t4": 28}
    assert tally.ended == {"t1": 25, "t2": 27}
    assert tally.committed == {"t1": 25} and tally.rolled_back == ["t2"]
    assert tally.still_open == ["t3", "t4"] and not tally.irregular
    spans = {
        (x, t): (n, first, last)
        for x, t, n, first, last in zip(*(pair.touches[c].to_pylist() for c in pair.touches.column_names), strict=True)
    }
    assert spans == {
        ("t1", "bank.accounts"): (2, 22, 24),
        ("t2", "bank.accounts"): (1, 23, 23),
        ("t4", "bank.accounts"): (2, 29, 30),
    }
    cycle = read_cycle([ref], StreamValidator())
    assert cycle.commits == {"t1": 25} and cycle.rollbacks == {"t2"}
    assert cycle.begun_at == {"t3": events[3]["ts"], "t4": events[5]["ts"]}


def test_a_re_read_without_image_checks_reads_only_the_stream_columns(tmp_path: Path) -> None:
    good_first_pair(tmp_path)
    (ref,) = list_pairs(tmp_path).pairs
    pair = read_pair(ref, check_rows=False)
    assert pair.data.column_names == ["lsn", "xid", "table", "op"]
    assert pair.data["lsn"].to_pylist() == [11, 12, 15]
    assert pair.data["xid"].to_pylist() == ["t1", "t1", "t2"]


def test_a_re_read_without_image_checks_still_refuses_an_image_column_of_the_wrong_type(tmp_path: Path) -> None:
    schema = pa.schema(
        [(n, pa.int64() if n in ("lsn", "after") else pa.string()) for n in ("lsn", "xid", "table", "op", "before")]
        + [("after", pa.int64())],
        metadata={"cdc.tables": json.dumps({"bank.accounts": ACCOUNTS})},
    )
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pydict({n: [] for n in schema.names}, schema=schema), sink)
    write_pair(tmp_path, 1, [], [], dat_bytes=sink.getvalue().to_pybytes())
    (ref,) = list_pairs(tmp_path).pairs
    with pytest.raises(IntermediateFileError) as refused:
        read_pair(ref, check_rows=False)
    assert refused.value.code == "dat-column-type" and "'after'" in str(refused.value)


EVERY_TYPE = {
    "public.every": {
        "columns": [
            {"name": "k", "type": "int", "nullable": False},
            {"name": "b", "type": "boolean", "nullable": True},
            {"name": "big", "type": "bigint", "nullable": True},
            {"name": "d", "type": "double", "nullable": True},
            {"name": "m", "type": "decimal(5,2)", "nullable": True},
            {"name": "s", "type": "string", "nullable": True},
            {"name": "day", "type": "date", "nullable": True},
            {"name": "at", "type": "timestamp", "nullable": True},
            {"name": "raw", "type": "binary", "nullable": True},
        ],
        "primary_key": ["k"],
    }
}


@pytest.mark.parametrize(
    "values",
    [
        {
            "k": 2**31 - 1,
            "b": True,
            "big": -(2**63),
            "d": "NaN",
            "m": "-999.99",
            "s": "ünï 字 🚀",
            "day": "2024-02-29",
            "at": "2026-11-21T10:00:00.123456Z",
            "raw": "AP8=",
        },
        {
            "k": -(2**31),
            "b": False,
            "big": 2**63 - 1,
            "d": "-Infinity",
            "m": "0.5",
            "s": "",
            "day": "1970-01-01",
            "at": "1999-12-31T23:59:59Z",
            "raw": "",
        },
        {"k": 0, "b": None, "big": None, "d": 1e308, "m": None, "s": None, "day": None, "at": None, "raw": None},
        {"k": 1, "b": None, "big": None, "d": 3, "m": "12", "s": None, "day": None, "at": None, "raw": None},
    ],
)
def test_every_spec_type_accepts_its_encoding(tmp_path: Path, values: dict) -> None:
    write_pair(
        tmp_path,
        1,
        [row(2, "x", "I", after=values, table="public.every")],
        [event("begin", "x", 1), event("commit", "x", 3)],
        tables=EVERY_TYPE,
    )
    scan_directory(tmp_path)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("k", 2**31),
        ("d", "nan"),
        ("d", True),
        ("m", "1e2"),
        ("day", "2023-02-29"),
        ("day", "2023-2-1"),
        ("at", "2026-11-21T10:00:00.1234567Z"),
        ("at", "2026-11-21T10:00:00+00:00"),
        ("at", "2026-13-21T10:00:00Z"),
        ("raw", "not base64!"),
        ("s", 5),
        ("b", 1),
    ],
)
def test_a_value_that_does_not_fit_its_type_is_refused(tmp_path: Path, column: str, value: object) -> None:
    after = {c["name"]: None for c in EVERY_TYPE["public.every"]["columns"]} | {"k": 1, column: value}
    write_pair(
        tmp_path,
        1,
        [row(2, "x", "I", after=after, table="public.every")],
        [event("begin", "x", 1), event("commit", "x", 3)],
        tables=EVERY_TYPE,
    )
    with pytest.raises(IntermediateFileError) as refused:
        scan_directory(tmp_path)
    assert refused.value.code == "value-wrong-type" and f"column {column}" in str(refused.value)


def _commit_t2_with_an_added_column(directory: Path) -> None:
    """Pair 2: bank.accounts gains a nullable column ``note``; t2 (open since pair 1) inserts and commits."""
    evolved = {
        "bank.accounts": {
            **ACCOUNTS,
            "columns": [*ACCOUNTS["columns"], {"name": "note", "type": "string", "nullable": True}],
        }
    }
    write_pair(
        directory,
        2,
        [row(21, "t2", "I", after={"id": 5, "owner": "e", "balance": None, "note": "new"})],
        [event("commit", "t2", 22)],
        tables=evolved,
    )


def test_adding_a_nullable_column_is_accepted_and_an_open_transaction_may_end_later(tmp_path: Path) -> None:
    good_first_pair(tmp_path)
    _commit_t2_with_an_added_column(tmp_path)
    summary = scan_directory(tmp_path)
    assert summary.pairs == 2 and summary.committed == 2 and summary.open_xids == []


def test_restart_position_is_the_pair_where_the_oldest_open_transaction_began(tmp_path: Path) -> None:
    good_first_pair(tmp_path)  # t2 begins in pair 1 and stays open
    write_pair(tmp_path, 2, ROWS_T3, EVENTS_T3)
    validator = StreamValidator()
    for ref in list_pairs(tmp_path).pairs:
        validator.check(read_pair(ref))
    assert validator.restart_seq(applied_seq=2) == 1
    write_pair(tmp_path, 3, [], [event("rollback", "t2", 30)])
    validator.check(read_pair(list_pairs(tmp_path, 3).pairs[0]))
    assert validator.restart_seq(applied_seq=3) == 4


def test_resuming_inside_the_stream_trusts_only_the_pairs_checked_before(tmp_path: Path) -> None:
    good_first_pair(tmp_path)
    write_pair(
        tmp_path, 2, [row(21, "t1x", "D", before={"id": 2})], [event("commit", "t2", 20), event("commit", "t1x", 22)]
    )
    pair2 = read_pair(list_pairs(tmp_path, 2).pairs[0])
    StreamValidator(last_lsn=15, trusted_through_seq=2).check(pair2)  # t2 and t1x began before pair 2
    with pytest.raises(IntermediateFileError) as refused:
        StreamValidator(last_lsn=15, trusted_through_seq=1).check(pair2)
    assert refused.value.code == "end-without-begin"


def test_pairs_checked_before_keep_their_older_definitions_when_re_read(tmp_path: Path) -> None:
    good_first_pair(tmp_path)
    _commit_t2_with_an_added_column(tmp_path)
    newest = read_pair(list_pairs(tmp_path, 2).pairs[0]).tables
    validator = StreamValidator(tables=newest, trusted_through_seq=2)
    for ref in list_pairs(tmp_path).pairs:
        validator.check(read_pair(ref))
    assert validator.state.tables == newest
    with pytest.raises(IntermediateFileError) as refused:
        StreamValidator(tables=newest).check(read_pair(list_pairs(tmp_path).pairs[0]))
    assert refused.value.code == "schema-change-incompatible"


def test_pairs_carrying_different_tables_share_one_object_per_equal_definition() -> None:
    """Each pair carries the tables it touches: an unchanged table is parsed into the object parsed before."""

    def column(name: str, kind: str) -> dict[str, object]:
        return {"name": name, "type": kind, "nullable": name != "id"}

    a = {"columns": [column("id", "bigint"), column("v", "string")], "primary_key": ["id"]}
    b = {"columns": [column("id", "int"), column("d", "date")], "primary_key": []}
    b_evolved = {"columns": [*b["columns"], column("added", "double")], "primary_key": []}  # type: ignore[list-item]
    first = tables_metadata_of(json.dumps({"s.a": a, "s.b": b}).encode())
    second = tables_metadata_of(json.dumps({"s.b": b, "s.c": a}).encode())
    third = tables_metadata_of(json.dumps({"s.b": b_evolved}).encode())
    assert second["s.b"] is first["s.b"]
    assert second["s.c"] is not first["s.a"] and second["s.c"].name == "s.c"
    assert third["s.b"] != first["s.b"] and [c.name for c in third["s.b"].columns] == ["id", "d", "added"]


def _wrong_digest(write: Callable[[Path], None]) -> Callable[[Path], None]:
    """Pair 2 as ``write`` writes it, its header's ``dat_sha256`` then made wrong."""

    def both(directory: Path) -> None:
        write(directory)
        trn = directory / "000000000002.trn"
        header, *events = trn.read_text().splitlines()
        trn.write_text("\n".join([json.dumps({**json.loads(header), "dat_sha256": "0" * 64}), *events]) + "\n")

    return both


@pytest.mark.parametrize(
    ("defect", "code"),
    [
        (None, None),  # nothing else wrong: the caller checks the digest (the engine's executors)
        (_insert({"id": "three", "owner": "cy", "balance": "3.00"}), "sha-mismatch"),  # an image
        (_pair2(header_changes={"dat_rows": 5}), "sha-mismatch"),  # the header against the rows
        (_pair2([], EVENTS_T3), "sha-mismatch"),  # no rows: checked at once, the file being small
        (_pair2(events=[{**EVENTS_T3[0], "ts": "yesterday"}, EVENTS_T3[1]]), "event-invalid"),  # the .trn, read first
    ],
)
def test_a_pair_read_without_its_digest_is_refused_in_the_words_of_a_pair_read_with_it(
    tmp_path: Path, defect: Callable[[Path], None] | None, code: str | None
) -> None:
    good_first_pair(tmp_path)
    _wrong_digest(defect or _pair2())(tmp_path)
    _, second = list_pairs(tmp_path).pairs
    with pytest.raises(IntermediateFileError) as checked:
        read_pair(second)
    assert checked.value.code == (code or "sha-mismatch")
    if code is None:
        deferred = read_pair(second, check_digest=False)
        assert deferred.data.num_rows == len(ROWS_T3) and not deferred.digest_checked  # the caller's to check
        return
    with pytest.raises(IntermediateFileError) as deferred:
        read_pair(second, check_digest=False)
    assert (deferred.value.code, str(deferred.value)) == (checked.value.code, str(checked.value))


def test_a_pair_the_stream_refuses_is_refused_for_its_wrong_digest_first(tmp_path: Path) -> None:
    good_first_pair(tmp_path)
    _wrong_digest(_insert({"id": 3, "owner": "cy", "balance": "3.00"}, xid="zz"))(tmp_path)  # a row without begin
    refs = list(list_pairs(tmp_path).pairs)
    for defer in (False, True):
        cycle = read_cycle(refs, StreamValidator(), defer_images=defer)
        assert [p.seq for p in cycle.pairs] == [1]
        assert cycle.refused is not None and cycle.refused.code == "sha-mismatch"
    assert read_cycle(refs[:1], StreamValidator(), defer_images=True).digests == {1: _header(tmp_path, 1)}


def _header(directory: Path, seq: int) -> str:
    return str(json.loads((directory / f"{seq:012d}.trn").read_text().splitlines()[0])["dat_sha256"])
