"""``applier advise``: Informix ER's queue arithmetic, the workload it measures, its advice and the memory chart.

Pairs are written by hand (pyarrow and json, :mod:`handmade`), so every
expected row size and transaction size below is worked out by hand from the
images the test writes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from applier.advise import advise
from applier.advise.arithmetic import (
    ARTICLE_4MB,
    LAYOUT_32,
    LAYOUT_64,
    column_bytes,
    decimal_bytes,
    percentile,
    rows_that_fit,
    single_row_transaction_bytes,
    strategy_budget,
    transaction_bytes,
    transactions_that_fit,
)
from applier.advise.chart import QueuePoint, queue_points, recent_reports, tail_lines, write_queue_chart
from applier.advise.observe import Observation, observe_backlog
from applier.advise.recommend import recommend
from applier.advise.transactions import TransactionFigures
from applier.cli import main
from applier.config import Config, load_config
from applier.engine.checkpoint import Checkpoint, CheckpointStore
from applier.errors import InvalidChangeError
from applier.intermediate.pairs import MIB, PairRef
from applier.summary import main as summary_main
from handmade import event, row, write_pair

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# --- the article's worked figures (32-bit layout, its "4 MB") ---------------------------------------


def test_the_article_4mb_is_4_times_1048_kib() -> None:
    assert ARTICLE_4MB == 4_292_608 == 4 * 1048 * 1024


def test_customer_table_figures_of_the_article() -> None:
    # 52-byte row header + 4-byte hash + 134-byte row + 258-byte transaction header
    assert single_row_transaction_bytes(LAYOUT_32, 134) == 448
    assert transactions_that_fit(ARTICLE_4MB, 448) == 9_581
    assert rows_that_fit(LAYOUT_32, 134, ARTICLE_4MB) == 22_591


def test_warehouses_table_figures_of_the_article() -> None:
    assert single_row_transaction_bytes(LAYOUT_32, 4_106) == 4_420
    assert transactions_that_fit(ARTICLE_4MB, 4_420) == 971
    assert rows_that_fit(LAYOUT_32, 4_106, ARTICLE_4MB) == 1_031


def _article_figures(budget: int) -> tuple[int, int, int, int]:
    return (
        transactions_that_fit(budget, single_row_transaction_bytes(LAYOUT_32, 134)),
        rows_that_fit(LAYOUT_32, 134, budget),
        transactions_that_fit(budget, single_row_transaction_bytes(LAYOUT_32, 4_106)),
        rows_that_fit(LAYOUT_32, 4_106, budget),
    )


def test_the_article_figures_hold_only_for_budgets_from_4292548_to_4292735_bytes() -> None:
    article = (9_581, 22_591, 971, 1_031)
    assert _article_figures(4_292_548) == article
    assert _article_figures(4_292_735) == article
    assert _article_figures(4_292_547) != article  # one insert fewer: 258 + 22,591 x 190 = 4,292,548
    assert _article_figures(4_292_736) != article  # 9,582 x 448 = 4,292,736
    assert _article_figures(4 * MIB) == (9_362, 22_073, 948, 1_007)  # 4 MiB does not give the article's


def test_the_64_bit_layout_on_the_article_rows() -> None:
    # 60 + 4 + 134 + 292 = 490; 490 x 8,760 = 4,292,400 <= 4,292,608 < 4,292,890
    assert single_row_transaction_bytes(LAYOUT_64, 134) == 490
    assert transactions_that_fit(ARTICLE_4MB, 490) == 8_760
    # (4,292,608 - 292) // (60 + 4 + 134) = 4,292,316 // 198 = 21,678
    assert rows_that_fit(LAYOUT_64, 134, ARTICLE_4MB) == 21_678
    # 60 + 4 + 4,106 + 292 = 4,462; 4,462 x 962 = 4,292,444
    assert single_row_transaction_bytes(LAYOUT_64, 4_106) == 4_462
    assert transactions_that_fit(ARTICLE_4MB, 4_462) == 962
    # 4,292,316 // 4,170 = 1,029
    assert rows_that_fit(LAYOUT_64, 4_106, ARTICLE_4MB) == 1_029
    assert transaction_bytes(LAYOUT_64, 134, 3) == 292 + 3 * 198 == 886


def test_decimal_storage_follows_informix_and_fixed_widths_the_spec_types() -> None:
    assert decimal_bytes(6, 3) == 5  # Informix's example: DECIMAL(6,3) takes 5 bytes
    assert decimal_bytes(5, 3) == 4  # (5 + 4) // 2
    assert decimal_bytes(12, 2) == 7  # (12 + 3) // 2
    assert decimal_bytes(38, 0) == 20
    widths = {t: column_bytes(t) for t in ("int", "bigint", "boolean", "double", "date", "timestamp", "string")}
    assert widths == {"int": 4, "bigint": 8, "boolean": 1, "double": 8, "date": 4, "timestamp": 8, "string": None}
    assert column_bytes("binary") is None and column_bytes("decimal(10,2)") == 6


def test_percentile_is_the_nearest_rank() -> None:
    assert percentile(list(range(1, 101)), 0.99) == 99
    assert percentile(list(range(200, 0, -1)), 0.99) == 198
    assert percentile([7, 3, 5], 0.99) == 7
    assert percentile([], 0.99) == 0


def test_the_article_strategy_scales_to_the_driver_memory() -> None:
    budget = strategy_budget(1024 * MIB)
    assert budget.update_anywhere == (134_217_728, 178_956_970)  # 1/8 and 1/6 of 1 GiB
    assert budget.source_to_target == (200 * MIB, 250 * MIB)
    assert strategy_budget(4096 * MIB).source_to_target == (800 * MIB, 1000 * MIB)


# --- the workload observed in hand-written pairs ---------------------------------------------------

ITEMS_DEF = {
    "columns": [
        {"name": "id", "type": "bigint", "nullable": False},  # 8
        {"name": "name", "type": "string", "nullable": True},  # observed maximum
        {"name": "price", "type": "decimal(10,2)", "nullable": True},  # (10 + 3) // 2 = 6
        {"name": "photo", "type": "binary", "nullable": True},  # observed maximum, decoded
        {"name": "added", "type": "date", "nullable": True},  # 4
        {"name": "flag", "type": "boolean", "nullable": True},  # 1
    ],
    "primary_key": ["id"],
}
LOG_DEF = {
    "columns": [
        {"name": "at", "type": "timestamp", "nullable": False},  # 8
        {"name": "msg", "type": "string", "nullable": True},
    ],
    "primary_key": [],
}
ITEMS, LOG = "shop.items", "shop.log"
A1 = '{"id": 1, "name": "hello", "price": "1.50", "photo": "AAEC", "added": "2026-01-02", "flag": true}'
A2 = '{"id": 2, "name": "ééé", "price": "2.00", "photo": "AAECAw==", "added": "2026-01-03", "flag": false}'
L1 = '{"at": "2026-01-02T10:00:00Z", "msg": "0123456789"}'
A3 = '{"id": 3, "name": "ab", "price": "3.00", "photo": null, "added": null, "flag": null}'
B4 = '{"id": 1}'


def buffered(xid: str, table: str, op: str, before: str | None, after: str | None) -> int:
    """The Applier's buffered size of a row, by its rule: 8 + the UTF-8 bytes of xid, table, op and images."""
    return 8 + sum(len(text.encode("utf-8")) for text in (xid, table, op, before or "", after or ""))


R1, R2 = buffered("t1", ITEMS, "I", None, A1), buffered("t1", ITEMS, "I", None, A2)
R3, R4 = buffered("t2", LOG, "I", None, L1), buffered("t2", ITEMS, "I", None, A3)
R5 = buffered("t4", ITEMS, "D", B4, None)


def write_workload(folder: Path) -> None:
    """Pair 1: t1 inserts two items and commits; t2 begins and logs; t3 begins and rolls back empty.
    Pair 2: t2 inserts an item and commits; t4 deletes an item and commits."""
    write_pair(
        folder,
        1,
        [
            row(11, "t1", "I", after=A1, table=ITEMS),
            row(12, "t1", "I", after=A2, table=ITEMS),
            row(15, "t2", "I", after=L1, table=LOG),
        ],
        [
            event("begin", "t1", 10),
            event("commit", "t1", 13),
            event("begin", "t2", 14),
            event("begin", "t3", 16),
            event("rollback", "t3", 17),
        ],
        tables={ITEMS: ITEMS_DEF, LOG: LOG_DEF},
    )
    write_pair(
        folder,
        2,
        [row(21, "t2", "I", after=A3, table=ITEMS), row(24, "t4", "D", before=B4, table=ITEMS)],
        [event("commit", "t2", 22), event("begin", "t4", 23), event("commit", "t4", 25)],
        tables={ITEMS: ITEMS_DEF},
    )


def config_for(tmp_path: Path, *overrides: str) -> Config:
    paths = [f"intermediate_dir={tmp_path / 'in'}", f"output_dir={tmp_path / 'out'}", f"target.path={tmp_path / 't'}"]
    return load_config(None, ["configuration_name=adv", *paths, *overrides])


def test_row_sizes_count_fixed_widths_and_variable_columns_at_their_observed_maximum(tmp_path: Path) -> None:
    write_workload(tmp_path / "in")
    o = observe_backlog(config_for(tmp_path), LAYOUT_64)
    items, log = o.tables[ITEMS], o.tables[LOG]
    # name: "ééé" is 6 UTF-8 bytes (more than "hello"); photo: "AAECAw==" decodes to 4 bytes
    assert items.maxima == {"name": 6, "photo": 4}
    assert (items.fixed_bytes, items.variable_bytes, items.row_size) == (19, 10, 29)  # 8 + 6 + 4 + 1; 6 + 4
    assert (log.fixed_bytes, log.row_size) == (8, 18)  # msg "0123456789"
    assert (items.rows, log.rows, o.rows) == (4, 1, 5)
    assert o.entry_bytes(ITEMS) == 60 + 4 + 29 == 93 and o.entry_bytes(LOG) == 60 + 4 + 18 == 82


def test_images_pyarrow_cannot_parse_at_once_are_measured_one_by_one(tmp_path: Path) -> None:
    spread = '{"id": 7,\n "name": "abcdefg", "photo": "AAECAwQ="}'  # valid JSON over two lines: 7 and 5 bytes
    odd = '{"id": 8, "name": 123456789, "photo": null}'  # a number where a string belongs: not counted
    write_pair(
        tmp_path / "in",
        1,
        [row(11, "t1", "I", after=A1, table=ITEMS), row(12, "t1", "I", after=spread, table=ITEMS)],
        [event("begin", "t1", 10), event("commit", "t1", 13)],
        tables={ITEMS: ITEMS_DEF},
    )
    write_pair(
        tmp_path / "in",
        2,
        [row(21, "t2", "I", after=odd, table=ITEMS)],
        [event("begin", "t2", 20), event("commit", "t2", 22)],
        tables={ITEMS: ITEMS_DEF},
    )
    assert observe_backlog(config_for(tmp_path), LAYOUT_64).tables[ITEMS].maxima == {"name": 7, "photo": 5}


def test_an_image_that_is_not_json_refuses_the_pair(tmp_path: Path) -> None:
    write_pair(
        tmp_path / "in",
        1,
        [row(11, "t1", "I", after="{not json", table=ITEMS)],
        [event("begin", "t1", 10), event("commit", "t1", 13)],
        tables={ITEMS: ITEMS_DEF},
    )
    with pytest.raises(InvalidChangeError, match="image-not-object") as refused:
        observe_backlog(config_for(tmp_path), LAYOUT_64)
    assert refused.value.seq == 1 and refused.value.path.name == "000000000001.dat"


def test_transactions_are_followed_across_pairs_and_measured_by_the_arithmetic(tmp_path: Path) -> None:
    write_workload(tmp_path / "in")
    o = observe_backlog(config_for(tmp_path), LAYOUT_64)
    # t1: 292 + 2 x 93 = 478; t2: 292 + 82 + 93 = 467; t3 (no row): 292; t4: 292 + 93 = 385
    # open at once: t2 and t3 after lsn 16, holding 292 + 82 + 292 = 666 before t3's rollback
    assert o.transactions == TransactionFigures(
        seen=4,
        ended=4,
        open_at_end=0,
        began_before=0,
        rows_p99=2,
        rows_max=2,
        memory_p99=478,
        memory_max=478,
        buffered_p99=max(R1 + R2, R3 + R4, R5),
        buffered_max=max(R1 + R2, R3 + R4, R5),
        most_open=2,
        peak_open_memory=666,
        peak_open_buffered=max(R1 + R2, R3 + R4, R5),
        largest_by_table={ITEMS: 2, LOG: 1},
    )
    assert o.row_memory == 4 * 93 + 82 and o.row_buffered == R1 + R2 + R3 + R4 + R5


def test_the_backlog_starts_after_the_checkpoint_and_counts_transactions_begun_before_it(tmp_path: Path) -> None:
    write_workload(tmp_path / "in")
    config = config_for(tmp_path)
    CheckpointStore(config.work_dir).save(Checkpoint(cycle_id=1, applied_seq=1))
    o = observe_backlog(config, LAYOUT_64)
    items = o.tables[ITEMS]
    # only pair 2: name "ab" is the longest, photo never has a value (counted 0): 19 + 2 + 0
    assert (items.maxima, items.unseen_columns, items.row_size) == ({"name": 2}, ("photo",), 21)
    t = o.transactions
    assert (t.seen, t.ended, t.began_before, t.most_open) == (2, 2, 1, 1)
    assert (t.memory_max, t.peak_open_memory) == (292 + 85, 292 + 85)  # one row of 60 + 4 + 21 each


def test_a_sample_reads_the_first_pairs_and_counts_open_transactions_so_far(tmp_path: Path) -> None:
    write_workload(tmp_path / "in")
    o = observe_backlog(config_for(tmp_path), LAYOUT_32, sample_pairs=1)
    assert (o.backlog_pairs, [r.seq for r in o.read]) == (2, [1])
    t = o.transactions
    # 32-bit: t1 258 + 2 x (52 + 4 + 29) = 428; t2 so far 258 + (56 + 18) = 332; t3 258
    assert (t.seen, t.ended, t.open_at_end) == (3, 2, 1)
    assert (t.memory_max, t.peak_open_memory) == (428, 332 + 258)


def test_recommendations_follow_the_p99_transaction_and_the_open_peak() -> None:
    o = Observation(
        layout=LAYOUT_64,
        applied_seq=0,
        backlog_pairs=1,
        read=(PairRef(1, Path("1.dat"), Path("1.trn"), 2 * MIB),),
        pair_bytes=2 * MIB,
        largest_pair_bytes=300_000,
        rows=1000,
        row_memory=4 * MIB,
        row_buffered=6 * MIB,
        transactions=TransactionFigures(
            memory_p99=100_000, buffered_p99=150_000, peak_open_memory=200_000, peak_open_buffered=400_000
        ),
    )
    r = recommend(o, budget=1 * MIB, driver_memory=1024 * MIB)
    assert (r.p99_need, r.queue_for_p99, r.open_need, r.transactions_share) == (150_000, 300_000, 400_000, 400_000)
    assert r.expansion == 3.0  # 6 MiB of rows in 2 MiB of pairs
    # the largest pair, 0.29 MiB, rounded up to 0.5 MiB, holds 0.5 x 1,048,576 x 3 bytes
    assert (r.smallest_cycle_mib, r.smallest_cycle_memory, r.minimum_queue) == (0.5, 1_572_864, 1_972_864)
    assert (r.queue_memory_mb, r.keeps_configured) == (2.0, False)  # 1,972,864 rounded up to whole MiB
    assert r.cycle_mib == 0.5  # (2,097,152 - 400,000) / 3 = 0.54 MiB, rounded down to 0.25
    assert r.buffer_size == 196_608  # 150,000 rounded up to 3 x 65,536
    assert r.driver_memory_needed is None

    kept = recommend(o, budget=256 * MIB, driver_memory=1024 * MIB)
    assert (kept.queue_memory_mb, kept.keeps_configured) == (256.0, True)
    assert kept.cycle_mib == 85.0  # (268,435,456 - 400,000) / 3 = 85.2 MiB, rounded down

    big = Observation(**{**o.__dict__, "transactions": TransactionFigures(peak_open_buffered=300 * MIB)})
    # 300 MiB + 1,572,864 = 316,145,664 -> 302 MiB; x 1024 / 250 = 1.21 GiB -> 2 GiB of driver memory
    assert recommend(big, budget=256 * MIB, driver_memory=1024 * MIB).driver_memory_needed == 2048 * MIB


# --- the command, end to end -----------------------------------------------------------------------


def write_config(tmp_path: Path) -> Path:
    config = tmp_path / "c.yaml"
    config.write_text("configuration_name: demo\nintermediate_dir: in\noutput_dir: out\ntarget: {path: t}\n")
    return config


def test_advise_on_a_generated_demo_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--out", str(tmp_path / "in"), "--seed", "1"]) == 0
    capsys.readouterr()
    assert main(["advise", "--config", str(write_config(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert out.startswith("advice for configuration demo, 64-bit layout: per row a 60-byte row header")
    assert re.search(r"backlog: \d+ pairs after pair 0; read all of them", out)
    assert "queue memory budget: 268,435,456 bytes (apply.queue_memory_mb unset: 0.25 of spark.driver.memory" in out
    # order_lines: bigint 8, int 4, int 4, int 4, decimal(10,2) 6, double 8 = 34 bytes, no variable column
    assert re.search(r"shop\.order_lines \([\d,]+ rows\): row 34 bytes = 34 fixed \(6 columns\) \+ 0 variable", out)
    assert "    single-row transaction: 60 + 4 + 34 + 292 = 390 bytes; 688,296 fit in the budget" in out
    for key in ("apply.queue_memory_mb = ", "apply.process_intermediate_size_per_job = "):
        assert f"\n  {key}" in out
    assert "\n  apply.buffer_size_for_split_records = 65536: the p99 transaction as buffered" in out
    assert "source to target (the Applier's case) 200 to 250 MB of each GB = 209,715,200 to 262,144,000" in out
    cycles = tmp_path / "out" / "demo" / "cycles.jsonl"
    assert out.rstrip().endswith(f"queue memory chart: none yet (no cycle reports in {cycles})")

    assert main(["advise", "--config", str(write_config(tmp_path)), "--layout", "32", "--sample-pairs", "1"]) == 0
    out = capsys.readouterr().out
    assert "read a sample of the first 1 (pairs 1..1," in out
    assert "    single-row transaction: 52 + 4 + 34 + 258 = 348 bytes" in out


def test_advise_without_a_backlog_says_so_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", "--config", str(write_config(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert f"no backlog: no complete pair after pair 0 in {tmp_path / 'in'} (the folder does not exist)" in out
    (tmp_path / "in").mkdir()
    assert main(["advise", "--config", str(write_config(tmp_path))]) == 0
    assert f"no backlog: no complete pair after pair 0 in {tmp_path / 'in'}; nothing to size" in capsys.readouterr().out


def test_advise_errors_are_one_line_with_the_documented_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(write_config(tmp_path))
    assert main(["advise", "--config", config, "--sample-pairs", "0"]) == 2
    assert capsys.readouterr().err == "applier: error: --sample-pairs 0 must be at least 1\n"
    assert main(["advise", "--config", config, "--set", "apply.queue_memory_mb=-1"]) == 2
    assert "apply.queue_memory_mb" in capsys.readouterr().err
    write_pair(tmp_path / "in", 1, [], [], header_changes={"dat_sha256": "0" * 64})
    assert main(["advise", "--config", config]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "000000000001.dat" in err and "sha-mismatch" in err


# --- the chart -------------------------------------------------------------------------------------


def queue(budget: int, peak: int, spooled: dict[str, int]) -> dict[str, object]:
    return {
        "budget_bytes": budget,
        "peak_bytes": peak,
        "memory_bytes": {"transactions": 0, "tables": 0, "compiled": 0},
        "spooled_bytes": spooled,
        "spooled": [{"kind": "transaction", "name": "t9", "file": "adv_t9.spill", "bytes": spooled["transactions"]}],
    }


def write_cycles(work_dir: Path) -> None:
    work_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        {"cycle_id": 1, "committed": 3},  # written before the budget existed: no "queue"
        {"cycle_id": 2, "queue": queue(16 * MIB, 5 * MIB, {"transactions": MIB, "tables": MIB // 2, "compiled": 0})},
        {"cycle_id": 3, "queue": queue(16 * MIB, 8 * MIB, {"transactions": 0, "tables": 0, "compiled": 0})},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (work_dir / "cycles.jsonl").write_text(text + '{"cycle_id": 4, "que')  # a line cut short by a crash


def test_queue_points_draw_cycles_without_queue_figures_as_zero(tmp_path: Path) -> None:
    write_cycles(tmp_path)
    reports = [*recent_reports(tmp_path / "cycles.jsonl"), {"cycle_id": 4, "queue": {}}]
    assert queue_points(reports, default_budget=256 * MIB) == [
        QueuePoint(1, 0, 0, None),
        QueuePoint(2, 5 * MIB, MIB + MIB // 2, 16 * MIB),
        QueuePoint(3, 8 * MIB, 0, 16 * MIB),
        QueuePoint(4, 0, 0, None),
    ]


def test_the_chart_is_a_png_beside_the_cycle_reports(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    write_cycles(config.work_dir)
    chart = write_queue_chart(config)
    assert chart is not None
    assert (chart.path, chart.cycles, chart.reported) == (config.work_dir / "queue-memory.png", 3, 2)
    data = chart.path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    assert write_queue_chart(config_for(tmp_path, "configuration_name=other")) is None  # no cycles.jsonl


def test_the_chart_reads_only_the_last_lines_of_a_long_cycle_file(tmp_path: Path) -> None:
    path = tmp_path / "cycles.jsonl"
    path.write_text("".join(f"{i:0100d}\n" for i in range(2000)))  # 202,000 bytes: several blocks from the end
    assert tail_lines(path, 1500) == [f"{i:0100d}" for i in range(500, 2000)]
    assert tail_lines(path, 1) == [f"{1999:0100d}"]
    assert len(tail_lines(path, 5000)) == 2000
    assert tail_lines(tmp_path / "missing.jsonl", 10) == []
    path.write_text("1\n2\n3")  # "3" is still being written
    assert tail_lines(path, 2) == ["1", "2"]


def test_advise_and_the_summary_name_the_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config_file = write_config(tmp_path)
    write_cycles(tmp_path / "out" / "demo")
    png = tmp_path / "out" / "demo" / "queue-memory.png"
    assert main(["advise", "--config", str(config_file), "--chart-cycles", "2"]) == 0
    assert f"queue memory chart: {png} (2 recent cycles, 2 with queue figures)" in capsys.readouterr().out
    png.unlink()
    assert summary_main(["--config", str(config_file)]) == 0
    assert f"queue memory chart: {png} (3 recent cycles, 2 with queue figures)" in capsys.readouterr().out
    assert png.read_bytes().startswith(PNG_SIGNATURE)


def test_advise_returns_its_figures(tmp_path: Path) -> None:
    write_workload(tmp_path / "in")
    advice = advise(config_for(tmp_path, "apply.queue_memory_mb=1"), LAYOUT_64)
    assert advice.recommendation is not None and advice.chart is None
    assert "  shop.items (4 rows): row 29 bytes = 19 fixed (4 columns) + 10 variable (name 6, photo 4)" in advice.lines
    assert (
        "    largest observed transaction: 2 rows = 292 + 2 x (60 + 4 + 29) = 478 bytes; 2,193 fit in the budget"
        in advice.lines
    )  # 1,048,576 // 478
