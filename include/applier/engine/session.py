"""The Spark application an Applier run executes its cycles in."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from functools import cached_property
from typing import Any, TypeVar

from applier.config import Config
from applier.engine import daemon_ahead
from applier.engine.jvm_archive import archive_options, launcher_env
from applier.engine.jvm_launch import LaunchedJvm

T = TypeVar("T")

# The JVMs' options: UTC, and the parallel (throughput) collector. A cycle is a
# batch job; on 2 cores the parallel collector compiled a 1.2M-change cycle in
# 10.7 s against 12.8-14.3 s with the default G1 (6.1 against 7.1 s once the
# JVM was warm). Setting ``spark.driver.extraJavaOptions`` or
# ``spark.executor.extraJavaOptions`` in ``spark.conf`` replaces these.
JVM_OPTIONS = "-Duser.timezone=UTC -XX:+UseParallelGC"

# The driver's JVM compiles with C1 only. Since the executors read the pairs
# themselves (engine/sources.py), the JVM's part of a cycle is small, and its
# optimizing compiler (C2) spent more CPU compiling than its code saved, on
# two cores shared with the Python workers: the narrow benchmark workload in
# one cycle took 25.5-27.1 s with C1 only against 28.7-30.8 s (JVM CPU 13-14
# against 22-24 s); in six cycles 40.4 against 44.6 s; the 1,000-table
# workload 72.1 against 75.5 s. Executors on a cluster keep both compilers.
DRIVER_JVM_OPTIONS = f"{JVM_OPTIONS} -XX:TieredStopAtLevel=1"

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
    "spark.executor.extraJavaOptions": JVM_OPTIONS,  # the driver's: driver_java_options(), read at each start
    # The Python workers import the installed pyspark, with its bytecode, not Spark's zip of its sources.
    "spark.python.daemon.module": daemon_ahead.DAEMON_MODULE,
}


# A driver whose executors are elsewhere (a cluster) only schedules, and its
# young generation need not follow the machine: sized from the default initial
# heap (1/64 of the memory), it reached 370-390 MiB of resident memory at 1.2M
# and at 4.6M changes alike, give or take 50-80 MiB from one run to the next.
# Its scheduling code runs a few dozen times a cycle, so with the default
# thresholds C1 kept compiling it cycle after cycle (2,020 methods after a
# run's first cycle, about a quarter of the JVM's CPU in later cycles) and
# interpreted it meanwhile. Compiled at a tenth of the thresholds, the driver
# JVM took 1.18-1.51 CPU s over cycles 2-5 of the scale-out benchmark's 4x
# workload against 1.63-1.85 s, five runs each, alternating; whole runs alike.
CLUSTER_DRIVER_JVM_OPTIONS = "-Xmn64m -XX:CompileThresholdScaling=0.1"


def local_master(master: str) -> bool:
    """Whether ``master`` runs the executors inside the driver's JVM (``local``, ``local[n]``), on its machine.

    ``local-cluster[...]`` starts executor processes of their own, as a cluster does.
    """
    return master == "local" or master.startswith("local[")


def task_per_number(context: Any, count: int, function: Callable[[Iterable[int]], Iterable[T]]) -> list[T]:
    """What ``function`` yields in a Spark job of ``count`` tasks, task ``i`` given the numbers ``[i]``, collected.

    The engine's jobs are RDD jobs over task numbers: their rows never cross
    into the JVM, and they need no SQL planning (the first job of an
    application took 0.6 s against 1.2 s for a ``mapInArrow``). ``function``
    yields small picklable values (where its output went, or what it found).
    """
    return list(context.parallelize(range(count), count).mapPartitions(function).collect())


def driver_java_options(master: str = "local[*]") -> str:
    """The driver JVM's options: :data:`DRIVER_JVM_OPTIONS`, and the installation's class archive when there is one.

    (:mod:`applier.engine.jvm_archive`: Spark's classes mapped ready-made, a start about 2 s sooner.) With
    executors elsewhere (``master`` not ``local``), also :data:`CLUSTER_DRIVER_JVM_OPTIONS`.
    """
    cluster = "" if master.startswith("local") else CLUSTER_DRIVER_JVM_OPTIONS
    return " ".join(option for option in (DRIVER_JVM_OPTIONS, cluster, archive_options()) if option)


def spark_conf(config: Config) -> dict[str, str]:
    """The Spark properties of the run: the defaults, then ``spark.conf.*`` from the configuration."""
    driver = driver_java_options(config.spark.master)
    return {**DEFAULTS, "spark.driver.extraJavaOptions": driver, **dict(config.spark.conf)}


def application_conf(config: Config, *, set_master: bool = True) -> dict[str, str]:
    """The Spark properties the run's application starts with: its name, its master (unless not ours), the rest."""
    master = {"spark.master": config.spark.master} if set_master else {}
    return {"spark.app.name": f"applier-{config.configuration_name}", **master, **spark_conf(config)}


def start_spark(config: Config, *, set_master: bool = True, jvm: LaunchedJvm | None = None) -> SparkApp:
    """Start (or join) the Spark application for ``config``; its SQL session starts when first used.

    Args:
        config: the configuration (``spark.master``, ``spark.conf.*``).
        set_master: False under spark-submit, whose ``--master`` decides.
        jvm: the driver's JVM launched ahead for this configuration (:mod:`applier.engine.jvm_launch`),
            joined when this process has no JVM yet; None: PySpark launches one.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.update(launcher_env())  # were PySpark to launch the JVM itself (its launcher's options)
    # PySpark imports its testing utilities at its first call into the JVM with arguments, inside the
    # context's start (0.06-0.1 s): imported here, they load while the JVM starts.
    import pyspark.testing.utils  # noqa: F401
    from pyspark import SparkConf, SparkContext

    settings = application_conf(config, set_master=set_master)
    conf = SparkConf().setAll(list(settings.items()))
    if jvm is not None and SparkContext._gateway is None:  # no JVM in this process yet (PySpark reuses one)
        with jvm.joined(settings) as joined:
            context = SparkContext.getOrCreate(conf)
        if joined and SparkContext._gateway is not None:
            SparkContext._gateway.proc = jvm.process  # where PySpark keeps the JVM it launched: alive as long
    else:
        if jvm is not None:
            jvm.drop()  # this process has its JVM already
        if SparkContext._gateway is None:
            daemon_ahead.start(settings)  # before the JVM, which inherits where it waits
        context = SparkContext.getOrCreate(conf)
    context.setLogLevel("WARN")
    return SparkApp(context)


class SparkApp:
    """A Spark application whose SQL session is created on first use.

    An apply cycle's jobs are RDD jobs over task numbers (the rows never
    cross into the JVM): they need the application's ``sparkContext`` and
    its ``conf`` only. Creating the SQL session, which nothing of a cycle
    uses, took 0.7-1.0 s of a run's start, while the cycle waited for Spark.
    Anything else asked of it (``range``, ``createDataFrame``, ``read``...)
    is the SQL session's, created then with the application's settings.

    Args:
        context: the application's ``SparkContext``.
    """

    def __init__(self, context: Any) -> None:
        self.sparkContext = context
        self._session: Any = None
        self._lock = threading.Lock()

    @cached_property
    def conf(self) -> Any:
        """The application's settings (``get(key, default)``), without starting the SQL session.

        Copied once: a context's settings are fixed once it runs, and each copy
        (``getConf``) made a Py4J call per setting, three times a cycle (0.05 s
        of the driver's CPU a cycle on a cluster, its JVM's share aside).
        """
        return self.sparkContext.getConf()

    @property
    def session(self) -> Any:
        """The SQL session (``SparkSession``), created on first use."""
        with self._lock:
            if self._session is None:
                from pyspark.sql import SparkSession

                self._session = SparkSession.builder.getOrCreate()  # this application's context and settings
            return self._session

    def stop(self) -> None:
        """Stop the application (its SQL session with it, if one was created)."""
        self.sparkContext.stop()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not the session's: an attribute this object lacks (copying, pickling)
            raise AttributeError(name)
        return getattr(self.session, name)


class LazySession:
    """A Spark session started on first use: a run with nothing to do, or refused before reading, starts no Spark.

    Everything a run checks before it reads (the configuration, folders, the
    target's reachability and state, the next pair's header) takes about a
    second; starting Spark takes five to twenty. Once a run knows it has work,
    :meth:`prefetch` starts the session in a background thread, so the JVM
    starts while the driver reads the first cycle's pairs; :meth:`get` waits
    for it. Started there, PySpark sets no SIGINT handler of its own (it only
    does on the main thread): Ctrl-C stops the run as any Python program.
    (``applier run`` launches the JVM itself sooner, and the session joins it:
    :mod:`applier.engine.jvm_launch`.)

    Args:
        start: starts (or joins) the session; called at most once.
        session: a session already there (a caller's own): nothing to start.
    """

    def __init__(self, start: Callable[[], Any], session: Any = None) -> None:
        self._start = start
        self._session: Any = session
        self._starting: threading.Thread | None = None
        self._failed: BaseException | None = None

    @property
    def started(self) -> bool:
        """Whether the session has been started, or is starting."""
        return self._session is not None or self._starting is not None

    @property
    def ready(self) -> bool:
        """Whether the session is there to use, without waiting (started, and done starting)."""
        return self._session is not None

    def prefetch(self) -> None:
        """Start the session in the background, if it is not started yet."""
        if not self.started:
            self._starting = threading.Thread(target=self._start_in_background, name="spark-start", daemon=True)
            self._starting.start()

    def _start_in_background(self) -> None:
        try:
            self._session = self._start()
        except BaseException as e:  # raised to the caller of get()
            self._failed = e

    def settle(self) -> None:
        """Wait for a background start to end, whatever its outcome (a run failing before its first apply).

        The JVM prints as it starts: waiting keeps those lines before the
        run's own last line (its error), which the JVM would otherwise follow.
        """
        if self._starting is not None:
            self._starting.join()

    def get(self) -> Any:
        """The session, started now if it was not yet (waiting for a background start)."""
        if self._starting is not None:
            self._starting.join()
            if self._failed is not None:
                failed, self._failed, self._starting = self._failed, None, None
                raise failed
        if self._session is None:
            self._session = self._start()
        return self._session


def prefetch(spark: Any) -> None:
    """Have a :class:`LazySession` start in the background (a session already there: nothing to do)."""
    if isinstance(spark, LazySession):
        spark.prefetch()


def is_ready(spark: Any) -> bool:
    """Whether ``spark`` can run a job now: a session, or a :class:`LazySession` done starting."""
    return spark.ready if isinstance(spark, LazySession) else spark is not None


def session_of(spark: Any) -> Any:
    """The session ``spark`` stands for: a :class:`LazySession`'s (started now if need be), or ``spark`` itself."""
    return spark.get() if isinstance(spark, LazySession) else spark
