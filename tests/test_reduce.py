"""The compile's aggregation per identity (applier.engine.reduce) against a plain walk over the events."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from applier.engine.events import EVENT_SCHEMA
from applier.engine.reduce import net_identities


def _events(rng: random.Random, count: int) -> list[dict[str, Any]]:
    events = []
    positions = rng.sample(range(10 * count + 10), count)  # unique (commit_lsn, lsn) positions
    for at in positions:
        events.append(
            {
                "table": rng.choice(["s.a", "s.b"]),
                "key": rng.choice([b"[1]", b"[2]", b"[3]", b"[10]"]),
                "commit_lsn": at // 10,
                "lsn": at,
                "present": rng.random() < 0.6,
                "existed": rng.random() < 0.5,
                "n": rng.choice([-1, 1]),
                "image": f"image at {at}",
                "salt": 0,
                "group": rng.choice([0, 0, 1]),
            }
        )
    return events


def _walk(events: list[dict[str, Any]]) -> dict[tuple[str, int, bytes], tuple[bool, bool, str, int]]:
    """Per identity: existed of its first event, present and image of its last, the summed count."""
    found: dict[tuple[str, int, bytes], tuple[bool, bool, str, int]] = {}
    for e in sorted(events, key=lambda e: (e["commit_lsn"], e["lsn"])):
        identity = (e["table"], e["group"], e["key"])
        existed, _, _, n = found.get(identity, (e["existed"], False, "", 0))
        found[identity] = (existed, e["present"], e["image"], n + e["n"])
    return found


@pytest.mark.parametrize("seed", range(20))
def test_each_identity_gets_its_first_existed_its_last_state_and_its_summed_count(seed: int) -> None:
    rng = random.Random(seed)
    events = _events(rng, rng.randint(1, 60))
    table = pa.Table.from_pylist(rng.sample(events, len(events)), schema=EVENT_SCHEMA)  # in any order
    net = net_identities(table)
    walked = _walk(events)
    assert net.num_rows == len(walked)
    rows = net.to_pylist()
    runs = [(r["table"], r["group"]) for r in rows]
    tables = [t for i, (t, _) in enumerate(runs) if i == 0 or runs[i - 1][0] != t]
    assert len(tables) == len(set(tables))  # each table's identities together...
    for name in tables:  # ...in group order
        assert [g for t, g in runs if t == name] == sorted(g for t, g in runs if t == name)
    images = {r["image"]: r for r in rows}
    for existed, present, image, n in walked.values():
        assert (images[image]["existed"], images[image]["present"], images[image]["n"]) == (existed, present, n)


def test_no_events_give_no_identities() -> None:
    assert net_identities(EVENT_SCHEMA.empty_table()).num_rows == 0
