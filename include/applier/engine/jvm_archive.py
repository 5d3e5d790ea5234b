"""A class-data-sharing archive of the Spark driver JVM: an Applier run's JVM starts with Spark's classes mapped.

A fresh JVM loads and verifies some 20,000 classes before Spark's first job,
and every ``applier run`` (a scheduled spark-submit included) starts one. With
an application class-data-sharing archive (JDK 13+ ``-XX:ArchiveClassesAtExit``
to make it, ``-XX:SharedArchiveFile`` to use it) they are mapped ready-made: on
2 cores the 1.2M-change benchmark ran 2.4-2.8 s sooner end to end and used about
4 fewer CPU seconds (docs/benchmarks.md).

The archive is made once per installation (``make setup`` runs this module) by
an Applier run over a small generated workload, so it holds what a run loads.
It belongs to one JDK build and one Spark: its name carries both, so an upgrade
simply makes it unused until it is made again. A JVM that cannot use the
archive starts as without it; the options silence its warning. A truncated
archive would crash the JVM instead, so an archive is checked by a JVM before
it is moved into place, atomically.

``APPLIER_JVM_ARCHIVE`` names another archive file, or ``off`` for none.

Before the driver's JVM, ``spark-submit`` starts a small one of its own
(``org.apache.spark.launcher.Main``) that only builds the driver's command
line: 0.15 s and 0.2 CPU s of every run's start here. It gets its own archive
beside the driver's, made the same way (:func:`make_launcher_archive`), and
compiles with C1 only (:func:`launcher_options`, given to it as
``SPARK_LAUNCHER_OPTS``): 0.04 s. An operator's own ``SPARK_LAUNCHER_OPTS``
is kept.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "APPLIER_JVM_ARCHIVE"
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else shutil.which("java")
    return Path(os.path.realpath(found)) if found and Path(found).exists() else None


def archive_path() -> Path | None:
    """Where this installation's archive is (whether made or not); None when switched off or without Java."""
    chosen = os.environ.get(ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off") else Path(chosen)
    java = _java()
    if java is None:
        return None
    key = hashlib.sha256(f"{importlib.metadata.version('pyspark')}|{java}".encode()).hexdigest()[:12]
    return Path(sys.prefix) / "share" / "cdc-applier" / f"spark-driver-{key}.jsa"


def launcher_archive_path() -> Path | None:
    """Where the archive of spark-submit's launcher JVM is (beside the driver's); None as :func:`archive_path`."""
    path = archive_path()
    return None if path is None else path.with_name(path.name.replace("spark-driver-", "spark-launcher-", 1))


def launcher_options() -> str:
    """The launcher JVM's options: C1 only, and its archive when there is one."""
    path = launcher_archive_path()
    archive = f" -XX:SharedArchiveFile={path} {_QUIET}" if path is not None and path.is_file() else ""
    return f"-XX:TieredStopAtLevel=1{archive}"


def launcher_env() -> dict[str, str]:
    """``SPARK_LAUNCHER_OPTS`` for a spark-submit to start with (nothing when the operator set it)."""
    return {} if "SPARK_LAUNCHER_OPTS" in os.environ else {"SPARK_LAUNCHER_OPTS": launcher_options()}


def archive_options() -> str:
    """The driver JVM's options that use the archive; empty when there is none."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {_QUIET}" if path is not None and path.is_file() else ""


def usable(path: Path) -> bool:
    """Whether a JVM starts with ``path`` as its archive (a truncated one crashes it)."""
    java = _java()
    if java is None:
        return False
    with tempfile.TemporaryDirectory(prefix="applier-jvm-check-") as scratch:  # where a crashing JVM writes its report
        command = [str(java), f"-XX:SharedArchiveFile={path}", *_QUIET.split(), "-XX:-CreateCoredumpOnCrash"]
        command.append("-version")
        started = subprocess.run(command, capture_output=True, check=False, cwd=scratch)
    return started.returncode == 0


def make_archive(path: Path, jvm_options: str) -> bool:
    """Make the archive at ``path`` by one Applier run over a small generated workload; whether it was made.

    Args:
        path: where the archive goes (its folder is created).
        jvm_options: the driver JVM's other options (those of the runs that will use it).
    """
    with tempfile.TemporaryDirectory(prefix="applier-jvm-archive-") as work:
        folder = Path(work)
        dumped = folder / "archive.jsa"
        python = [sys.executable, "-m", "applier.cli"]
        env = {**os.environ, ENV: "off", "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")}
        generate = [*python, "generate", "--out", str(folder / "pairs"), "--transactions", "3000", "--seed", "1"]
        config = folder / "config.yaml"
        config.write_text(
            "\n".join(
                [
                    "configuration_name: jvm_archive",
                    f"intermediate_dir: {folder / 'pairs'}",
                    f"output_dir: {folder / 'output'}",
                    "target:",
                    "  type: delta",
                    f"  path: {folder / 'target'}",
                    "spark:",
                    "  master: local[2]",
                    "  conf:",
                    f"    spark.driver.extraJavaOptions: {jvm_options} -XX:ArchiveClassesAtExit={dumped}",
                    "",
                ]
            ),
            encoding="utf-8",
        )
        for step in (generate, [*python, "run", "--config", str(config)]):
            done = subprocess.run(step, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                what = " ".join(step[2:4])
                log.warning("no JVM archive: %s exited %d: %s", what, done.returncode, done.stderr[-2000:])
                return False
        if not dumped.is_file() or not usable(dumped):
            log.warning("no JVM archive: the JVM did not leave a usable one")
            return False
        _put(dumped, path)
    return True


def make_launcher_archive(path: Path, spark_home: Path) -> bool:
    """Make the launcher JVM's archive at ``path`` by one ``spark-submit --version``; whether it was made."""
    with tempfile.TemporaryDirectory(prefix="applier-jvm-archive-") as work:
        dumped = Path(work) / "launcher.jsa"
        env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LAUNCHER_OPTS": f"-XX:ArchiveClassesAtExit={dumped}"}
        command = [str(spark_home / "bin" / "spark-submit"), "--version"]
        done = subprocess.run(command, env=env, capture_output=True, check=False, cwd=work)
        if done.returncode != 0 or not dumped.is_file() or not usable(dumped):
            log.warning("no launcher JVM archive: spark-submit --version exited %d", done.returncode)
            return False
        _put(dumped, path)
    return True


def _put(dumped: Path, path: Path) -> None:
    """Copy an archive into place atomically (a JVM mapping a half-written one would crash)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(path.name + ".tmp")
    shutil.copyfile(dumped, staged)
    os.replace(staged, path)


def main() -> int:
    """Make this installation's archives unless they are there (``make setup``); 0 even when they cannot be made."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from applier.engine.jvm_launch import spark_home
    from applier.engine.session import JVM_OPTIONS

    path, launcher, home = archive_path(), launcher_archive_path(), spark_home()
    if path is None or launcher is None:
        log.info("JVM archive: switched off (%s) or no java found", ENV)
        return 0
    if path.is_file():
        log.info("JVM archive: %s is there", path)
    elif make_archive(path, JVM_OPTIONS):
        log.info("JVM archive: made %s (%d MiB)", path, path.stat().st_size >> 20)
    if launcher.is_file():
        log.info("JVM archive: %s is there", launcher)
    elif home is not None and make_launcher_archive(launcher, home):
        log.info("JVM archive: made %s (%d MiB)", launcher, launcher.stat().st_size >> 20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
