"""Spark's Python daemon, run with the installed pyspark rather than Spark's copy of it in ``pyspark.zip``.

Spark starts its Python daemon, which forks the workers, with
``<SPARK_HOME>/python/lib/pyspark.zip`` first on the path. A zip holds no
compiled bytecode, so the daemon, and each worker forked from it when it
imports a module the daemon had not (pandas and Arrow support, say), compiled
pyspark's modules from source: on the narrow benchmark workload in one cycle,
9% of the workers' CPU samples were in those imports.

When that zip is the one inside the installed pyspark package (pip's pyspark
is its own ``SPARK_HOME``: the same files, with their bytecode compiled at
install), this module takes the zip off the path (and the py4j zip beside it
when the installed py4j is the same version) and runs ``pyspark.daemon`` as
Spark would have. Anywhere else (a Spark distribution whose executors have
no pyspark installed, or another version of it) those zips stay. Spark's JAR
leaves the path too, before any worker is forked
(:func:`~applier.engine.worker_path.trim_import_caches`; it holds no Python).

Before it forks any worker, it also imports what every worker's first task
would import (:data:`PRELOADED`): the modules of the engine's Spark tasks,
pyarrow's compute functions, and pandas, which pyarrow imports as it makes
its first array. A forked worker starts with them, so they are imported
once per daemon rather than once per worker: on the narrow benchmark
workload in one cycle (``local[2]``), 0.3 CPU s less a worker and the run
0.15 s sooner end to end (eight runs each, alternating); on an executor of
more cores, that much less for every worker but one. A module that cannot
be imported there (an executor without it) is left to the worker, as before.

Spark runs it as its ``spark.python.daemon.module`` (:mod:`applier.engine.session`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.machinery
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

from applier.engine import daemon_ahead
from applier.engine.worker_path import trim_import_caches

PRELOADED = ("pandas", "pyarrow.compute", "applier.engine.sources", "applier.engine.netting")
"""What the daemon imports before forking workers: each cycle's compile runs tasks of the last two."""


def without_bundled_pyspark(path: Sequence[str]) -> list[str]:
    """``path`` without the zips that are the installed pyspark's own copies: of itself, and of its py4j.

    ``py4j-<version>-src.zip`` goes only when the installed py4j is that version.
    """
    rest = [entry for entry in path if not _bundled(entry)]
    found = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if found is None or found.origin is None:
        return list(path)
    lib = Path(found.origin).resolve().parent / "python" / "lib"
    kept = [entry for entry in path if _bundled(entry) and not _installed_copy(Path(entry), lib, rest)]
    return [entry for entry in path if entry in kept or not _bundled(entry)]


def preload(modules: Sequence[str] = PRELOADED) -> None:
    """Import ``modules``, those that can be: the workers forked afterwards start with them.

    What they made is then frozen out of the collector's sight (as Python
    advises before a fork): a worker's collections never write to those
    objects, so their memory pages stay shared with the daemon.
    """
    for name in modules:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    gc.freeze()


def _bundled(entry: str) -> bool:
    name = Path(entry).name
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith("-src.zip"))


def _installed_copy(zipped: Path, lib: Path, rest: Sequence[str]) -> bool:
    """Whether ``zipped`` is the installed pyspark's copy of a package installed beside it, same version."""
    if zipped.resolve().parent != lib:
        return False
    if zipped.name == "pyspark.zip":
        return True
    if importlib.machinery.PathFinder.find_spec("py4j", rest) is None:
        return False
    from importlib import metadata  # here: the shim of applier.engine.daemon_ahead does without it

    try:
        return zipped.name == f"py4j-{metadata.version('py4j')}-src.zip"
    except metadata.PackageNotFoundError:
        return False


def prepare(path: Sequence[str], *, preload_modules: bool = True) -> None:
    """This process made ready to fork workers: ``sys.path`` set from ``path``, then :func:`preload`."""
    sys.path[:] = without_bundled_pyspark(path)
    trim_import_caches()  # and Spark's JAR: each worker forked would read its directory before its first task
    if preload_modules:
        preload()


if __name__ == "__main__":
    daemon_ahead.hand_over()  # a zygote, when one waits, is the daemon in this process's place: it then only waits
    prepare(sys.path)
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
