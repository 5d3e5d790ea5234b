"""The Spark session an Applier run executes its cycles in."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from applier.config import Config

# The JVMs' options: UTC, and the parallel (throughput) collector. A cycle is a
# batch job; on 2 cores the parallel collector compiled a 1.2M-change cycle in
# 10.7 s against 12.8-14.3 s with the default G1 (6.1 against 7.1 s once the
# JVM was warm). Setting ``spark.driver.extraJavaOptions`` or
# ``spark.executor.extraJavaOptions`` in ``spark.conf`` replaces these.
JVM_OPTIONS = "-Duser.timezone=UTC -XX:+UseParallelGC"

# Defaults suited to apply cycles: UTC everywhere (the spec's times are UTC),
# few shuffle partitions (a cycle's data is modest), Arrow for driver transfers,
# bounded records of past jobs (nothing may grow with the length of a run).
DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Spark keeps records of its last 1,000 jobs and queries even without the UI:
    # a run of thousands of cycles need not hold them.
    "spark.ui.retainedJobs": "100",
    "spark.ui.retainedStages": "100",
    "spark.sql.ui.retainedExecutions": "50",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.extraJavaOptions": JVM_OPTIONS,
    "spark.executor.extraJavaOptions": JVM_OPTIONS,
}


def spark_conf(config: Config) -> dict[str, str]:
    """The Spark properties of the run: the defaults, then ``spark.conf.*`` from the configuration."""
    return {**DEFAULTS, **dict(config.spark.conf)}


def start_spark(config: Config, *, set_master: bool = True) -> Any:
    """Start (or join) the Spark session for ``config``.

    Args:
        config: the configuration (``spark.master``, ``spark.conf.*``).
        set_master: False under spark-submit, whose ``--master`` decides.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"applier-{config.configuration_name}")
    if set_master:
        builder = builder.master(config.spark.master)
    for key, value in spark_conf(config).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


class LazySession:
    """A Spark session started on first use: a run with nothing to do, or refused before its first apply, starts no JVM.

    Everything a run checks before it applies (the configuration, folders,
    the target's reachability and state, the first cycle's pairs) takes about
    a second; starting Spark takes ten to twenty. So the session is started
    only when a cycle is about to be applied.

    Args:
        start: starts (or joins) the session; called at most once.
    """

    def __init__(self, start: Callable[[], Any]) -> None:
        self._start = start
        self._session: Any = None

    @property
    def started(self) -> bool:
        """Whether the session has been started."""
        return self._session is not None

    def get(self) -> Any:
        """The session, started now if it was not yet."""
        if self._session is None:
            self._session = self._start()
        return self._session


def session_of(spark: Any) -> Any:
    """The session ``spark`` stands for: a :class:`LazySession`'s (started now if need be), or ``spark`` itself."""
    return spark.get() if isinstance(spark, LazySession) else spark
