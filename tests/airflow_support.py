"""Airflow for tests: one temporary ``AIRFLOW_HOME`` per test session, on SQLite, migrated once.

Airflow reads its configuration when ``airflow`` is first imported, so a test
module must not import ``airflow`` (or the project's DAG or ``applier_airflow``
operators) at module level: it requests the ``airflow_home`` fixture and
imports inside the test or fixture. Pure modules (``applier_airflow.builders``)
may be imported anywhere.

Use from a test module::

    from airflow_support import airflow_home  # noqa: F401  (the session fixture)

    def test_something(airflow_home: Path) -> None:
        from airflow.dag_processing.dagbag import DagBag
        ...

:func:`airflow_env` gives the same environment for an Airflow started as a
subprocess (``airflow standalone``, ``airflow backfill create``), with
:func:`airflow_command` to run its CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DAGS_FOLDER = REPO / "dags"
PLUGINS_FOLDER = REPO / "plugins"
AIRFLOW_BIN = Path(sys.executable).parent / "airflow"
# The Spark connection of the tests: local mode, two cores.
SPARK_CONN = '{"conn_type": "spark", "host": "local[2]"}'


def airflow_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of an Airflow instance for tests.

    Args:
        home: its ``AIRFLOW_HOME`` (the SQLite database, ``airflow.cfg`` and logs go there).
        **extra: more variables, e.g. ``APPLIER_CONFIG``; they win over the defaults.

    Returns:
        Variables to add to ``os.environ``: the project's DAGs and plugins,
        no examples, SQLite in ``home``, low parallelism, ``spark_default``
        on local Spark, and the Spark variables the apply job needs.
    """
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW_CONN_SPARK_DEFAULT": SPARK_CONN,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **extra,
    }


def airflow_command(
    args: list[str],
    env: Mapping[str, str],
    timeout: float = 600,
    took_effect: Callable[[], bool] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``airflow ARGS`` with ``env`` over this process's environment; fails the test on a non-zero exit.

    A command that found SQLite locked (Airflow on SQLite, with a scheduler,
    an API server and a DAG processor writing to it, on a busy machine) is
    run again, up to three times. A command that is not idempotent may have
    committed its change before it met the lock (``backfill create``: the
    next attempt is then refused, "Another backfill is running"):
    ``took_effect`` says whether it did, and then it is not run again.
    """
    for attempt in range(3):
        done = subprocess.run(
            [str(AIRFLOW_BIN), *args],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode == 0 or "sqlite3.OperationalError: database is locked" not in done.stderr:
            break
        time.sleep(2 * (attempt + 1))
        if took_effect is not None and took_effect():
            return done  # the attempt that met the lock had made its change
    assert done.returncode == 0, f"airflow {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


_home: Path | None = None


def _prepare(home: Path) -> Path:
    env = airflow_env(home)
    if "airflow" in sys.modules:
        raise RuntimeError("airflow was imported before the airflow_home fixture; import it inside tests")
    os.environ.update(env)
    airflow_command(["db", "migrate"], env)
    return home


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated Airflow home for this test session, its environment set in this process.

    Every test module imports this fixture, so pytest calls it once per module:
    the first call prepares the home, the others return it. The environment
    stays set for the rest of the session (Airflow read it once, on import).

    Raises:
        RuntimeError: ``airflow`` was imported before the fixture first ran, so
            it already read another configuration.
    """
    global _home
    if _home is None:
        _home = _prepare(tmp_path_factory.mktemp("airflow_home"))
    return _home
