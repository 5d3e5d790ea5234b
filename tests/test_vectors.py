"""The reader against the conformance vectors of ../shared/spec/vectors (made by an independent writer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from applier.errors import IntermediateFileError
from applier.intermediate.pairs import list_pairs
from applier.intermediate.reader import read_pair
from applier.intermediate.scan import scan_directory
from conftest import spec_dir

VECTORS = spec_dir() / "vectors"


def _folders(kind: str) -> list[str]:
    return sorted(p.name for p in (VECTORS / kind).iterdir() if p.is_dir()) if (VECTORS / kind).is_dir() else []


def test_the_vectors_are_there(vectors_dir: Path) -> None:
    assert _folders("valid") and len(_folders("invalid")) >= 20


@pytest.mark.parametrize("name", _folders("valid"))
def test_every_valid_pair_is_read_intact(name: str) -> None:
    folder = VECTORS / "valid" / name
    expected = json.loads((folder / "expected.json").read_text())
    summary = scan_directory(folder)
    assert summary.last_seq == expected["applied_through_seq"]
    for ref in list_pairs(folder).pairs:
        pair = read_pair(ref)
        trn_lines = ref.trn_path.read_text().splitlines()
        assert len(pair.events) == len(trn_lines) - 1
        assert [e.lsn for e in pair.events] == [json.loads(line)["lsn"] for line in trn_lines[1:]]
        assert pair.data.num_rows == json.loads(trn_lines[0])["dat_rows"]
    described = {t for ref in list_pairs(folder).pairs for t in read_pair(ref).tables}
    assert described == set(expected["tables"])


@pytest.mark.parametrize("name", _folders("invalid"))
def test_each_invalid_folder_accepts_pair_1_and_refuses_pair_2_naming_it(name: str) -> None:
    folder = VECTORS / "invalid" / name
    expected = json.loads((folder / "expected.json").read_text())
    done: list[int] = []
    with pytest.raises(IntermediateFileError) as refused:
        scan_directory(folder, lambda n, total: done.append(n))
    assert done == list(range(1, expected["applied_through_seq"] + 1))
    assert refused.value.seq == expected["refused_seq"]
    assert "000000000002" in str(refused.value)
    assert refused.value.code == expected["what"], "each defect has its own message"
