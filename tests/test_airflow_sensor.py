"""The deferrable new-pairs sensor and its trigger, on real files and Airflow's real deferral."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from airflow_support import airflow_home  # noqa: F401  (airflow_home: session fixture)
from applier.generate import generate_workload

pytestmark = pytest.mark.airflow

PARAMS = {"process_intermediate_size_per_job": None, "buffer_size_for_split_records": None}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("pairs")
    generate_workload(folder, seed=9, transactions=30, file_size_mb=0.02, profile="demo")
    return sorted(folder.glob("*.dat"))


def configured(tmp_path: Path) -> tuple[Path, Path]:
    intermediate = tmp_path / "in"
    intermediate.mkdir()
    config = tmp_path / "applier.yaml"
    config.write_text(
        f"configuration_name: s\nintermediate_dir: {intermediate}\noutput_dir: {tmp_path / 'out'}\n"
        f"target:\n  path: {tmp_path / 'target'}\n"
    )
    return config, intermediate


def deliver(dat: Path, folder: Path, complete: bool = True) -> None:
    """Write a pair the way the extractor does: the ``.dat`` first, the ``.trn`` (completing it) last."""
    shutil.copy(dat, folder)
    if complete:
        shutil.copy(dat.with_suffix(".trn"), folder)


def sensor(config: Path) -> Any:
    """The sensor on ``config``; import it only once the airflow_home fixture has configured Airflow."""
    from applier_airflow.sensors import NewPairsSensor

    return NewPairsSensor(task_id="wait", config_path=str(config), poke_interval=0.05, timeout=60)


def test_pairs_already_there_end_the_wait_at_once(
    tmp_path: Path,
    pairs: list[Path],
    airflow_home: Path,  # noqa: F811
) -> None:
    config, intermediate = configured(tmp_path)
    deliver(pairs[0], intermediate)
    deliver(pairs[1], intermediate)
    assert sensor(config).execute({"params": PARAMS}) == {
        "directory": str(intermediate),
        "applied_seq": 0,
        "first_seq": 1,
        "last_seq": 2,
        "pairs": 2,
    }


def test_without_new_pairs_the_sensor_defers_to_the_trigger_which_fires_on_a_complete_pair(
    tmp_path: Path,
    pairs: list[Path],
    airflow_home: Path,  # noqa: F811
) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    from applier_airflow.triggers import NewPairsTrigger

    config, intermediate = configured(tmp_path)
    waiting = sensor(config)
    with pytest.raises(TaskDeferred) as deferred:
        waiting.execute({"params": PARAMS})
    trigger = deferred.value.trigger
    assert deferred.value.method_name == "execute_complete"
    classpath, kwargs = trigger.serialize()
    assert (classpath, kwargs) == (
        "applier_airflow.triggers.NewPairsTrigger",
        {"directory": str(intermediate), "applied_seq": 0, "poke_interval": 0.05},
    )

    async def wait_then_deliver() -> Any:
        # The triggerer rebuilds the trigger from its serialized form.
        events = NewPairsTrigger(**kwargs).run()
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.3)
        assert not first.done(), "nothing is complete yet"
        deliver(pairs[0], intermediate, complete=False)
        await asyncio.sleep(0.3)
        assert not first.done(), "a .dat without its .trn is not complete"
        deliver(pairs[0], intermediate)
        return await asyncio.wait_for(first, timeout=10)

    event = asyncio.run(wait_then_deliver())
    expected = {"directory": str(intermediate), "applied_seq": 0, "first_seq": 1, "last_seq": 1, "pairs": 1}
    assert event.payload == expected
    assert waiting.execute_complete({"params": PARAMS}, event.payload) == expected
