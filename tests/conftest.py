"""Shared fixtures. One Spark session for the whole run lives here once the engine needs it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPO = Path(__file__).resolve().parents[1]


def spec_dir() -> Path:
    """The shared spec folder: ``$CDC_SPEC_DIR`` or ``../shared/spec`` beside the repository."""
    return Path(os.environ.get("CDC_SPEC_DIR", REPO.parent / "shared" / "spec"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding ``slow`` tests first, each file's tests kept together and in order.

    Under ``make test`` two workers take a file at a time in this order; with
    the long files first, the short ones fill in beside them instead of one
    long file running alone at the end.
    """
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the rest keeps its order


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    path = spec_dir() / "vectors"
    assert (path / "valid").is_dir(), f"conformance vectors not found at {path}; set CDC_SPEC_DIR"
    return path


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one Spark session of the test run: two local cores, few shuffle partitions, UTC, no UI."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("cdc-applier-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC -XX:+UseParallelGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A new, empty PostgreSQL database for one test (see tests/pg_support.py), dropped after it."""
    from pg_support import fresh_database

    with fresh_database() as url:
        yield url


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist, set ``wal_level=logical`` in the controller, before any worker connects.

    A restart from a worker's fixture would cut the other worker's PostgreSQL
    tests; here nobody is connected yet. Without workers, or when the run
    leaves PostgreSQL tests out, the ``logical_decoding`` fixture does it when
    a test first needs it.
    """
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    if "not postgres" in (config.option.markexpr or ""):
        return
    import contextlib

    import psycopg

    from pg_support import ensure_logical_decoding

    with contextlib.suppress(psycopg.OperationalError):  # no server: the PostgreSQL tests say so themselves
        ensure_logical_decoding()


@pytest.fixture(scope="session")
def logical_decoding() -> None:
    """The server runs with ``wal_level=logical`` (set and restarted once if it is not; see tests/pg_support.py)."""
    from pg_support import ensure_logical_decoding

    ensure_logical_decoding()


@pytest.fixture
def logical_source(logical_decoding: None) -> Iterator[tuple[str, str, str]]:
    """``(url, slot, publication)``: a new database and unique slot and publication names, all dropped after."""
    from pg_support import logical_source as make_source

    with make_source() as names:
        yield names


@pytest.fixture(params=["delta", pytest.param("postgres", marks=pytest.mark.postgres)])
def target_settings(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """``--set`` overrides naming a target, once per target: Delta (the default), then PostgreSQL.

    The PostgreSQL case gets a new database, dropped after the test.
    """
    if request.param == "delta":
        yield []
        return
    from pg_support import fresh_database

    with fresh_database() as url:
        yield ["target.type=postgres", f"target.url={url}"]
