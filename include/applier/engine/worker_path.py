"""Spark's Python workers: import caches that each task does not read again, a collector that runs less often.

Before each task a Spark Python worker calls ``importlib.invalidate_caches()``.
On Python 3.11 that reads again the directory of the archive behind every
cached zip importer: one per package imported from ``pyspark.zip`` (a dozen),
one for the JAR of Spark's Python runner (spark-core, over 5,000 entries,
which Spark puts on the workers' ``PYTHONPATH``) and for a folder inside it.
That came to 150-300 ms before every task, several seconds of worker CPU in a
small cycle of a score of tasks, and it grew as more packages were imported.

The functions Spark runs in Python therefore call :func:`trim_import_caches`
first: the JAR (which holds no Python module) leaves ``sys.path``, and cached
zip importers are forgotten. Python makes a new one, from the directory it
keeps in memory, when an import next needs it.

A worker decodes every row image into a short-lived object, with the
definitions, rules and decoders of a cycle's tables alive beside them, and
Python's cyclic collector, at its default thresholds, traversed all of them
again and again: 15-20% of the events step's CPU on the wide workload (1,000
tables). :func:`prepare_worker` raises its thresholds (:data:`COLLECTOR_THRESHOLDS`)
and, once per worker, moves what is alive after the imports (some 250,000
objects: pyspark, pyarrow, the applier) out of the collector's sight
(``gc.freeze``), so its full collections traverse only what the tasks made;
reference counting still frees every image as soon as it is done with.
"""

from __future__ import annotations

import gc
import sys
import zipimport

COLLECTOR_THRESHOLDS = (50_000, 20, 100)
"""``gc.set_threshold`` of a Spark Python worker (Python's default: 700, 10, 10).

On the events step of the wide workload (40 batches of 10,000 rows): 8.1-8.4 CPU
seconds with the default, 6.8-7.0 with these, 6.8-7.5 with the collector off.
Then one wide pair's events (25 batches) in three rounds: 4.3-4.6 s with the
default, 3.7-3.8 with these thresholds, 3.5-3.6 with them and the imports frozen.
"""


def prepare_worker() -> None:
    """What each function Spark runs in Python does first: :func:`trim_import_caches`, then the collector's settings.

    The first call in a worker collects, then freezes what is left (the
    imported modules and what they hold) and raises the thresholds; a worker
    serves many tasks (``spark.python.worker.reuse``).
    """
    trim_import_caches()
    if gc.get_threshold() != COLLECTOR_THRESHOLDS:
        gc.collect()
        gc.freeze()
        gc.set_threshold(*COLLECTOR_THRESHOLDS)


def trim_import_caches() -> None:
    """Drop ``.jar`` entries from ``sys.path`` and every cached zip importer."""
    for entry in [p for p in sys.path if p.endswith(".jar")]:
        sys.path.remove(entry)
    cached = sys.path_importer_cache
    for key in [k for k, finder in cached.items() if isinstance(finder, zipimport.zipimporter) or k.endswith(".jar")]:
        del cached[key]
