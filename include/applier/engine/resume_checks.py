"""What a run refuses or re-takes as it resumes: a target restored behind the checkpoint, a cycle's pairs."""

from __future__ import annotations

from applier.config import Config
from applier.engine.checkpoint import Intent
from applier.engine.ledger import RunLedger
from applier.engine.reading import missing_pair_error
from applier.errors import TargetError
from applier.intermediate.pairs import PairRef


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
