"""The driver's Arrow memory: freed pages go back to the system, so its resident size follows what it holds.

The queue-memory budget counts what the driver holds in Arrow buffers; the
process's resident memory is what an operator (or a container's limit) sees.
pyarrow's default pool, mimalloc, keeps freed pages for reuse, and glibc's
heap keeps freed blocks until it is trimmed. With 4,000 open transactions
buffered under a 16 MiB queue, the driver's resident peak rose 55 MiB over
its early cycles with mimalloc, and 45 MiB with the system allocator
untrimmed; returning freed memory after each cycle's buffering and at each
cycle's end brought it to about 30 MiB (queue included).

The driver's Arrow work is a few large buffers per pair, where the allocator's
speed does not show. Executors keep pyarrow's default.

pyarrow picks its C++ default pool when it loads, from
``ARROW_DEFAULT_MEMORY_POOL``, and ``pyarrow.set_memory_pool`` changes only the
pool of pyarrow's Python calls: Parquet's batch reader and Acero's group-by
(the driver's reading of the pairs) still allocated from mimalloc, which kept
their pages. The entry points of a run therefore choose the system pool
before pyarrow loads (:func:`choose_system_pool`). On the 4x benchmark
workload (392,000 transactions in one cycle, local), the driver's resident
size after its compile went from 416 to 371 MiB, and its peak, in the
Delta writes, from 546 to 444.

glibc also gives threads heaps of their own (arenas, up to eight per core),
each keeping what it freed: the threads that measure images while the pairs
are read, and the Delta writes of four tables at once, left a wide cycle's
driver (1,000 tables, 90,000 transactions) at 461 MiB through its compile and
712 MiB at its peak; with one heap, trimmed, 352 and 655 MiB, in the same time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

_M_ARENA_MAX = -8  # glibc's mallopt parameter
_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def choose_system_pool() -> bool:
    """Load pyarrow with the system allocator as its C++ default pool; False when pyarrow was loaded already.

    Call it first in a driver's entry point. The environment is left as it
    was (Spark's executors, started later, inherit it and keep pyarrow's
    default); an operator's own ``ARROW_DEFAULT_MEMORY_POOL`` is kept.
    """
    if "pyarrow" in sys.modules:
        return False
    if _POOL_VARIABLE in os.environ:
        return True
    os.environ[_POOL_VARIABLE] = "system"
    try:
        import pyarrow  # noqa: F401  # it reads the variable as it loads
    finally:
        del os.environ[_POOL_VARIABLE]
    return True


def use_system_allocator() -> None:
    """Allocate the driver's Arrow memory with the C library's allocator, on one heap (for the whole process)."""
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        if libc.mallopt(_M_ARENA_MAX, 1) != 1:
            raise OSError("mallopt refused M_ARENA_MAX")
    except (OSError, AttributeError) as e:  # not glibc: its own allocator's heaps stay as they are
        logging.getLogger("applier").debug("heaps per thread left as they are: %s", e)


def return_freed_memory() -> None:
    """Give the allocator's freed pages back to the system (glibc: ``malloc_trim``; a few ms)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
