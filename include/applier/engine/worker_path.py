"""Spark's Python workers: import caches that each task does not read again.

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
"""

from __future__ import annotations

import sys
import zipimport


def trim_import_caches() -> None:
    """Drop ``.jar`` entries from ``sys.path`` and every cached zip importer."""
    for entry in [p for p in sys.path if p.endswith(".jar")]:
        sys.path.remove(entry)
    cached = sys.path_importer_cache
    for key in [k for k, finder in cached.items() if isinstance(finder, zipimport.zipimporter) or k.endswith(".jar")]:
        del cached[key]
