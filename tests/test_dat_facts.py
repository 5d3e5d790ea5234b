"""Spark's executors reading the ``.dat`` files for the driver's checks (engine/dat_facts.py, ``apply.executor_reads``).

What the driver learns from a cycle, and the refusal that stops it, must not
depend on who read the ``.dat`` files: checked on every conformance vector,
then end to end on real Spark.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from applier.config import load_config
from applier.engine import reading
from applier.engine.cycle_input import CycleInput
from applier.engine.dat_facts import dat_reader, executors_read, read_dat_facts, reads_on_executors
from applier.engine.reading import read_cycle
from applier.engine.session import LazySession
from applier.errors import ConfigError, IntermediateFileError
from applier.intermediate import reader
from applier.intermediate.pairs import PairRef, list_pairs
from applier.intermediate.reader import read_pair
from applier.intermediate.row_facts import DatFacts, RowFacts
from applier.intermediate.stream import StreamValidator
from conftest import spec_dir
from engine_support import make_config, run
from test_engine_vectors import assert_pair_2_refused, assert_tables_as_expected

VECTORS = spec_dir() / "vectors"
FOLDERS = [(kind, p.name) for kind in ("valid", "invalid") for p in sorted((VECTORS / kind).iterdir()) if p.is_dir()]


def _here(refs: list[PairRef], measure: bool = False) -> dict[int, DatFacts | IntermediateFileError]:
    """The executors' part, run in this process (the Spark job is tested below)."""
    return {ref.seq: read_dat_facts(ref, measure) for ref in refs}


def _cycle(folder: Path, reader: Any, measure: bool = False) -> CycleInput:
    refs = list(list_pairs(folder).pairs)
    return read_cycle(refs, StreamValidator(), defer_images=True, measure=measure, dat_reader=reader)


def _learnt(cycle: CycleInput) -> dict[str, Any]:
    refused = cycle.refused
    return {
        "pairs": [ref.seq for ref in cycle.pairs],
        "commits": cycle.commits,
        "rollbacks": cycle.rollbacks,
        "rows_read": cycle.rows_read,
        "begun_at": cycle.begun_at,
        "truncates": cycle.truncates,
        "table_rows": dict(cycle.table_rows),
        "counts": cycle.all_counts().sort_by([("xid", "ascending"), ("table", "ascending")]).to_pylist(),
        "xids": {seq: sorted(xids.to_pylist()) for seq, xids in cycle.xids_by_seq.items()},
        "unchecked": sorted(cycle.unchecked),
        "digests": cycle.digests,
        "autocorrect": cycle.autocorrect,
        "longest_image": cycle.longest_image,
        "refused": None if refused is None else (type(refused), refused.code, refused.seq, str(refused)),
    }


@pytest.mark.parametrize("measure", [False, True], ids=["images-measured-later", "images-measured-now"])
@pytest.mark.parametrize(("kind", "name"), FOLDERS)
def test_a_cycle_learns_and_refuses_the_same_whoever_reads_its_dat_files(kind: str, name: str, measure: bool) -> None:
    folder = VECTORS / kind / name
    driver, elsewhere = _learnt(_cycle(folder, None, measure)), _learnt(_cycle(folder, _here, measure))
    assert elsewhere == driver
    assert bool(driver["longest_image"]) == (measure and driver["rows_read"] > 0)
    if kind == "invalid":  # a defect of the .dat or the transactions stops the cycle at pair 2; an image's, later
        expected = json.loads((folder / "expected.json").read_text())
        assert driver["pairs"] == [1] or (driver["pairs"] == [1, 2] and driver["refused"] is None), expected


def test_a_pair_read_elsewhere_has_what_the_driver_would_have_read() -> None:
    folder = VECTORS / "valid" / sorted(p.name for p in (VECTORS / "valid").iterdir() if p.is_dir())[0]
    for ref in list_pairs(folder).pairs:
        read = read_pair(ref, check_rows=False, check_digest=False)
        found = read_dat_facts(ref)
        assert isinstance(found, DatFacts)
        given = read_pair(ref, check_rows=False, check_digest=False, read_elsewhere=found)
        assert given.data is None and given.facts == read.facts and given.lsn_range() == read.lsn_range()
        assert given.tables == read.tables and given.digest_checked == read.digest_checked
        # A defect of its transactions is named from its rows, read again then.
        assert given.stream_rows().select(["lsn"]).equals(read.data.select(["lsn"]))
        assert given.header == read.header and given.events == read.events and given.tally == read.tally


def test_the_driver_takes_the_events_the_executor_read_and_reads_the_trn_only_without_them(tmp_path: Path) -> None:
    folder = VECTORS / "valid" / sorted(p.name for p in (VECTORS / "valid").iterdir() if p.is_dir())[0]
    shutil.copytree(folder, tmp_path / "pairs")
    refs = list(list_pairs(tmp_path / "pairs").pairs)
    read = {ref.seq: read_pair(ref, check_rows=False, check_digest=False) for ref in refs}
    found = {ref.seq: read_dat_facts(ref) for ref in refs}
    for ref in refs:
        facts = found[ref.seq]
        assert isinstance(facts, DatFacts) and facts.events is not None and read[ref.seq].events
        ref.trn_path.rename(ref.trn_path.with_suffix(".gone"))
    for ref in refs:  # its .trn gone, the pair is still read, with the executor's header and events
        given = read_pair(ref, check_rows=False, check_digest=False, read_elsewhere=found[ref.seq])
        assert given.header == read[ref.seq].header and given.events == read[ref.seq].events
        without = dataclasses.replace(found[ref.seq], header=None, events=None)
        with pytest.raises(FileNotFoundError):  # without them, the driver reads the .trn
            read_pair(ref, check_rows=False, check_digest=False, read_elsewhere=without)


def test_row_facts_count_rows_per_transaction_and_keep_the_truncates() -> None:
    rows = pa.table(
        {
            "lsn": [1, 2, 3, 4],
            "xid": ["a", "a", "b", "a"],
            "table": ["s.t", "s.u", "s.t", "s.t"],
            "op": ["I", "T", "U", "D"],
        }
    )
    facts = RowFacts.of(rows)
    assert facts.count == 4 and facts.bounds == (1, 4)
    assert facts.truncates.to_pylist() == [{"lsn": 2, "xid": "a", "table": "s.u", "op": "T"}]
    got = facts.touches.sort_by([("xid", "ascending"), ("table", "ascending")]).to_pylist()
    assert got == [
        {"xid": "a", "table": "s.t", "rows": 2, "first_lsn": 1, "last_lsn": 4},
        {"xid": "a", "table": "s.u", "rows": 1, "first_lsn": 2, "last_lsn": 2},
        {"xid": "b", "table": "s.t", "rows": 1, "first_lsn": 3, "last_lsn": 3},
    ]


def test_executors_read_on_a_cluster_unless_told(tmp_path: Path) -> None:
    assert not executors_read(None, "local[*]") and executors_read(None, "spark://host:7077")
    assert not executors_read(None, "local") and executors_read(None, "local-cluster[2,1,1024]")  # own executors
    assert executors_read(True, "local[2]") and not executors_read(False, "yarn")
    # A cycle read while Spark starts is read by the driver, whatever the setting: a job would wait for Spark.
    starting = LazySession(lambda: pytest.fail("not started here"))
    assert not reads_on_executors(True, starting) and not reads_on_executors(None, starting)
    config = make_config(tmp_path, tmp_path / "in", executor_reads="true")
    assert config.apply.executor_reads is True
    assert make_config(tmp_path, tmp_path / "in").apply.executor_reads is None
    with pytest.raises(ConfigError, match=r"apply\.executor_reads"):
        load_config(None, ["configuration_name=x", f"intermediate_dir={tmp_path}", "apply.executor_reads=sometimes"])


@pytest.mark.spark
def test_the_spark_job_gives_what_each_pair_holds_and_its_refusal(spark: Any) -> None:
    folder = VECTORS / "invalid" / FOLDERS[-1][1]
    refs = list(list_pairs(folder).pairs)
    got = dat_reader(lambda: spark)(refs, True)
    want = _here(refs, True)
    assert sorted(got) == sorted(want)
    for seq, found in want.items():
        if isinstance(found, IntermediateFileError):
            assert (type(got[seq]), str(got[seq])) == (type(found), str(found))
        else:
            assert isinstance(got[seq], DatFacts) and got[seq].rows == found.rows and got[seq].tables == found.tables
            assert got[seq].longest_image == found.longest_image


def _copy(kind: str, name: str, tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    shutil.copytree(VECTORS / kind / name, folder, ignore=shutil.ignore_patterns("expected.json"))
    return folder


@pytest.mark.spark
@pytest.mark.parametrize(("kind", "name"), FOLDERS)
def test_a_run_whose_executors_read_the_dat_files_applies_and_refuses_as_the_vectors_say(
    tmp_path: Path, spark: Any, kind: str, name: str, monkeypatch: pytest.MonkeyPatch, target_settings: list[str]
) -> None:
    expected = json.loads((VECTORS / kind / name / "expected.json").read_text())
    config = make_config(tmp_path, _copy(kind, name, tmp_path), target_settings, executor_reads="true")
    read_here: list[bool] = []  # the driver's reads of a .dat, images or not (Spark's workers are other processes)
    real = reader._read_dat
    monkeypatch.setattr(reader, "_read_dat", lambda ref, header, *, images: [
        read_here.append(images), real(ref, header, images=images)][1])  # fmt: skip
    measured_here: list[Path] = []  # the driver's measuring of images (PostgreSQL's groups need their sizes)
    real_measure = reading.longest_images_in
    monkeypatch.setattr(reading, "longest_images_in", lambda path: [measured_here.append(path), real_measure(path)][1])
    if kind == "valid":
        assert run(config, spark).checkpoint.applied_seq == expected["applied_through_seq"]
        assert_tables_as_expected(config, expected)
    else:
        assert_pair_2_refused(config, spark, expected)
    assert False not in read_here, "the driver read a .dat's stream columns itself"
    assert not measured_here, "the driver measured a .dat's images itself"
