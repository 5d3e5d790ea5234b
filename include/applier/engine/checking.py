"""Checking row images of large cycles in worker processes.

Checking every image is the driver's costliest step of a large cycle, and
Spark is idle meanwhile. Pairs are independent for that check, so worker
processes check them side by side while the driver reads the pairs in order
for the stream checks, which need the pairs one after the other.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor

from applier.intermediate.pairs import PairRef
from applier.intermediate.reader import read_pair

# Below this, a cycle is checked in the driver: starting workers costs more.
PARALLEL_FROM_BYTES = 16 * 1024 * 1024


def _check(ref: PairRef) -> None:
    read_pair(ref, check_rows=True)


class PairChecker:
    """A pool of worker processes checking whole pairs, started on first use.

    Args:
        workers: worker processes (the machine's cores, usually).
        parallel_from_bytes: the cycle size from which workers are used.
    """

    def __init__(self, workers: int = 2, parallel_from_bytes: int = PARALLEL_FROM_BYTES) -> None:
        self.workers = workers
        self.parallel_from_bytes = parallel_from_bytes
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, refs: list[PairRef]) -> dict[int, Future[None]]:
        """Start checking ``refs``; empty when the cycle is too small to be worth it.

        Returns:
            seq -> a future that raises the pair's IntermediateFileError, if any.
        """
        if sum(r.size for r in refs) < self.parallel_from_bytes:
            return {}
        if self._pool is None:
            # spawn, not fork: the driver runs a JVM gateway and threads.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return {ref.seq: self._pool.submit(_check, ref) for ref in refs}

    def close(self) -> None:
        """Stop the workers, dropping checks not yet started."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
