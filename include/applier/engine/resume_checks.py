"""What a run refuses or re-takes as it resumes: which checkpoint it starts from, a restored target, a cycle's pairs."""

from __future__ import annotations

import logging

from applier.config import Config
from applier.engine.checkpoint import Checkpoint, CheckpointStore, Intent
from applier.engine.ledger import RunLedger
from applier.engine.reading import missing_pair_error
from applier.errors import TargetError
from applier.intermediate.pairs import PairRef
from applier.targets import Target

log = logging.getLogger("applier")


def restored_target_error(behind: dict[str, tuple[int, int]], ledger: RunLedger) -> TargetError:
    """The refusal of a restored target: each table behind with what it holds and what was recorded.

    Args:
        behind: table -> (cycle it holds, cycle the checkpoint recorded for it).
        ledger: where the runs to replay are looked up.
    """
    tables = "; ".join(
        f"table {t} holds cycle {held}, the checkpoint recorded cycle {want}" for t, (held, want) in behind.items()
    )
    first = min(held for held, _ in behind.values()) + 1
    last = max(want for _, want in behind.values())
    keys = ledger.keys_holding(first, last)
    runs = (
        f"the run ledger's runs holding cycles {first}..{last}: {', '.join(keys)}"
        if keys
        else f"no run in the run ledger holds cycles {first}..{last}, so a backfill cannot replay them"
    )
    return TargetError(
        f"the target was restored to an earlier state ({tables}); replay the runs since with a backfill "
        f"({runs}); see README 'Recovery'"
    )


def pairs_of_intent(available: tuple[PairRef, ...], intent: Intent, config: Config) -> list[PairRef]:
    """Exactly the pairs an unfinished cycle took, so its re-run applies the same changes."""
    by_seq = {p.seq: p for p in available}
    missing = [s for s in intent.seqs if s not in by_seq]
    if missing:
        raise missing_pair_error(config.intermediate_dir, missing[0])
    return [by_seq[s] for s in intent.seqs]


def authoritative_checkpoint(
    store: CheckpointStore, target: Target, local: Checkpoint, held: dict[str, int]
) -> Checkpoint:
    """The checkpoint to start from: the target's copy when the local file is missing or older.

    ``held``: the cycle each table of ``local`` holds (``committed_cycles``);
    the tables of an adopted copy are added to it.

    Raises:
        TargetError: the target holds a cycle past both (and past an intent
            under way): applying from them would skip pairs.
    """
    copy = target.saved_checkpoint()
    if copy is not None:
        try:
            kept = Checkpoint.from_json(copy)
        except ValueError as e:
            raise TargetError(f"the target's copy of the checkpoint cannot be read ({e})") from e
        if kept.cycle_id > local.cycle_id:
            was = f"held cycle {local.cycle_id}" if store.checkpoint_path.exists() else "was missing"
            log.warning(
                "%s %s, the target's copy holds cycle %d (pairs through %d): starting from the copy",
                store.checkpoint_path,
                was,
                kept.cycle_id,
                kept.applied_seq,
            )
            local = store.replace(kept)
    intent = store.load_intent()
    under_way = intent is not None and intent.cycle_id == local.cycle_id + 1
    held.update(target.committed_cycles(sorted(set(local.table_cycles) - set(held))))
    highest = max(held.values()) if local.table_cycles else target.highest_cycle([])
    if highest > local.cycle_id + under_way:
        raise TargetError(
            f"the target holds cycle {highest}, but {store.checkpoint_path} holds cycle {local.cycle_id} and "
            "the target keeps no newer copy: the checkpoint was lost or went back, and applying from it would "
            "skip pairs; restore checkpoint.json from a backup (see README 'Recovery')"
        )
    return local
