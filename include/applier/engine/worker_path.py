"""Spark's Python workers: the module search path without Spark's JAR.

Spark puts the JAR of its Python runner (spark-core, over 5,000 entries) on
its Python workers' ``PYTHONPATH``, and before each task a worker calls
``importlib.invalidate_caches()``, which on Python 3.11 reads the directory of
every zip file on the path again: 54 ms a task for that JAR alone. A small
cycle runs a score of Python tasks, so the JAR cost its workers over a second
of CPU per cycle. It holds no Python module: the functions Spark runs in
Python drop it from the path of the worker they run in (once per worker;
Spark does not put it back).
"""

from __future__ import annotations

import sys


def drop_jars_from_path() -> None:
    """Take every ``.jar`` entry out of ``sys.path`` and its cached importer."""
    for entry in [p for p in sys.path if p.endswith(".jar")]:
        sys.path.remove(entry)
        sys.path_importer_cache.pop(entry, None)
