"""The compile's aggregation per identity (applier.engine.reduce) against a plain walk over the events."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from applier.engine.events import EVENT_SCHEMA
from applier.engine.reduce import fold, net_identities


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
                "first_commit_lsn": at // 10,
                "first_lsn": at,
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


def _folded_in_parts(rng: random.Random, events: list[dict[str, Any]]) -> pa.Table:
    """The events dealt into a few parts at random, each folded, as executors fold their partitions."""
    parts: list[list[dict[str, Any]]] = [[] for _ in range(rng.randint(1, 4))]
    for event in events:
        rng.choice(parts).append(event)
    folded = [fold(pa.Table.from_pylist(part, schema=EVENT_SCHEMA)) for part in parts if part]
    return pa.concat_tables(rng.sample(folded, len(folded)))


@pytest.mark.parametrize("folded", [False, True], ids=["events", "folded-first"])
@pytest.mark.parametrize("seed", range(20))
def test_each_identity_gets_its_first_existed_its_last_state_and_its_summed_count(seed: int, folded: bool) -> None:
    rng = random.Random(seed)
    events = _events(rng, rng.randint(1, 60))
    shuffled = rng.sample(events, len(events))  # in any order
    table = _folded_in_parts(rng, shuffled) if folded else pa.Table.from_pylist(shuffled, schema=EVENT_SCHEMA)
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


def test_a_folded_event_spans_its_identitys_first_and_last_positions() -> None:
    rng = random.Random(7)
    events = _events(rng, 40)
    folded = fold(pa.Table.from_pylist(events, schema=EVENT_SCHEMA)).to_pylist()
    for row in folded:
        mine = [e for e in events if (e["table"], e["group"], e["key"]) == (row["table"], row["group"], row["key"])]
        positions = sorted((e["commit_lsn"], e["lsn"]) for e in mine)
        assert (row["first_commit_lsn"], row["first_lsn"]) == positions[0]
        assert (row["commit_lsn"], row["lsn"]) == positions[-1]
        assert row["n"] == sum(e["n"] for e in mine)


@pytest.mark.parametrize("folded", [False, True], ids=["events", "folded-first"])
def test_two_events_at_one_position_keep_their_order(folded: bool) -> None:
    """A keyless update that keeps its row value: the copy removed, then added back, in one row."""
    at = {"commit_lsn": 5, "lsn": 3, "first_commit_lsn": 5, "first_lsn": 3}
    common = {"table": "s.keyless", "key": b"[1,2]", "salt": 0, "group": 0, "image": "row"}
    removed = {**common, **at, "present": False, "existed": True, "n": -1}
    added = {**common, **at, "present": True, "existed": False, "n": 1}
    earlier = {**common, "commit_lsn": 1, "lsn": 1, "first_commit_lsn": 1, "first_lsn": 1}
    inserted = {**earlier, "present": True, "existed": False, "n": 1}
    table = pa.Table.from_pylist([inserted, removed, added], schema=EVENT_SCHEMA)
    if folded:
        table = pa.concat_tables([fold(table.slice(1)), fold(table.slice(0, 1))])
    [net] = net_identities(table).to_pylist()
    assert (net["existed"], net["present"], net["n"]) == (False, True, 1)
