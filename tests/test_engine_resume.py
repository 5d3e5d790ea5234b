"""Resuming needs the pairs from restart_seq on: their absence is refused, naming the pair."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from applier.engine.checkpoint import Checkpoint, CheckpointStore
from applier.engine.run import Applier
from applier.errors import GapError
from applier.targets import open_target
from engine_support import make_config
from handmade import event, good_first_pair, row, write_pair


def test_a_pair_removed_before_the_restart_position_allows_is_refused(tmp_path: Path) -> None:
    good_first_pair(tmp_path / "in")  # t2 begins in pair 1 and is still open after pair 2
    write_pair(tmp_path / "in", 2, [row(21, "t3", "T")], [event("begin", "t3", 20), event("commit", "t3", 22)])
    config = make_config(tmp_path, tmp_path / "in")
    CheckpointStore(config.work_dir).save(Checkpoint(cycle_id=1, applied_seq=2, applied_commit_lsn=22, restart_seq=1))
    shutil.move(tmp_path / "in" / "000000000001.trn", tmp_path / "retention-removed.trn")
    (tmp_path / "in" / "000000000001.dat").unlink()
    with pytest.raises(GapError) as refused:
        Applier(config, spark=None, target=open_target(config)).run()
    assert refused.value.seq == 1 and "000000000001" in str(refused.value)
    assert refused.value.exit_code == 3
