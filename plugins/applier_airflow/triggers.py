"""The trigger behind :class:`NewPairsSensor`: waits, in the triggerer, for new complete pairs.

A pair is complete once its ``.trn`` exists (spec section 1); the library's
``list_pairs`` decides that, so the trigger sees exactly what a cycle would take.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from applier.intermediate.pairs import list_pairs
from applier_airflow.builders import new_pairs_event


class NewPairsTrigger(BaseTrigger):
    """Fires once a complete pair after ``applied_seq`` is in ``directory``.

    Args:
        directory: the intermediate folder.
        applied_seq: the last pair already applied.
        poke_interval: seconds between listings.
    """

    def __init__(self, directory: str, applied_seq: int, poke_interval: float = 60.0) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow leaves it unannotated
        self.directory = directory
        self.applied_seq = applied_seq
        self.poke_interval = poke_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"directory": self.directory, "applied_seq": self.applied_seq, "poke_interval": self.poke_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            # Listing is a directory scan: off the triggerer's event loop.
            listing = await asyncio.to_thread(list_pairs, self.directory, self.applied_seq + 1)
            if listing.pairs:
                event = new_pairs_event(self.directory, self.applied_seq, [p.seq for p in listing.pairs])
                yield TriggerEvent(event)  # type: ignore[no-untyped-call]
                return
            await asyncio.sleep(self.poke_interval)
