"""Spark's Python daemon, run with the installed pyspark rather than Spark's copy of it in ``pyspark.zip``.

Spark starts its Python daemon, which forks the workers, with
``<SPARK_HOME>/python/lib/pyspark.zip`` first on the path. A zip holds no
compiled bytecode, so the daemon, and each worker forked from it when it
imports a module the daemon had not (pandas and Arrow support, say), compiled
pyspark's modules from source: on the narrow benchmark workload in one cycle,
9% of the workers' CPU samples were in those imports.

When that zip is the one inside the installed pyspark package (pip's pyspark
is its own ``SPARK_HOME``: the same files, with their bytecode compiled at
install), this module takes the zip off the path and runs ``pyspark.daemon``
as Spark would have. Anywhere else (a Spark distribution whose executors have
no pyspark installed, or another version of it) the path stays as Spark made it.

Spark runs it as its ``spark.python.daemon.module`` (:mod:`applier.engine.session`).
"""

from __future__ import annotations

import importlib.machinery
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path


def without_bundled_pyspark(path: Sequence[str]) -> list[str]:
    """``path`` without the ``pyspark.zip`` entries that are the installed pyspark's own copy of itself."""
    rest = [entry for entry in path if Path(entry).name != "pyspark.zip"]
    found = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if found is None or found.origin is None:
        return list(path)
    installed = Path(found.origin).resolve().parent
    bundled = [entry for entry in path if Path(entry).name == "pyspark.zip"]
    if any(Path(entry).resolve().parents[2] != installed for entry in bundled):
        return list(path)  # a zip of another installation: keep Spark's path as it is
    return rest


if __name__ == "__main__":
    sys.path[:] = without_bundled_pyspark(sys.path)
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
