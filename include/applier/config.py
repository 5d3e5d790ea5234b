"""The Applier's configuration: one YAML file plus ``--set key=value`` overrides.

Everything is validated here, once, into a frozen :class:`Config`. Key names
mirror the Informatica Data Replication runtime parameters. A bad value, an
unknown key or a missing required key raises :class:`ConfigError` naming the
key, the value and what is allowed.

Relative paths in the file are relative to the file's folder; relative paths
given with ``--set`` are relative to the current directory.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from applier import config_values as cv
from applier.config_alert import ALERT_KEYS, AlertConfig, alert_config
from applier.config_source import (
    SOURCE_KEYS,
    SOURCE_OPTIONAL_KEYS,
    ExtractConfig,
    MaterializeConfig,
    SourceConfig,
    extract_config,
    materialize_config,
    source_config,
)
from applier.errors import ERROR_CLASSES, ConfigError
from applier.intermediate.pairs import MIB
from applier.targets import dialects
from applier.targets.dialects import TARGET_TYPES

_SPARK_CONF = "spark.conf"
_SCHEMA_MAP = "target.schema_map"
_ACTIONS = "errors.actions"
_MAPPINGS = (_SPARK_CONF, _SCHEMA_MAP, _ACTIONS)
# Error actions, least to most severe (SAP Replication Server's, ``stop`` for its stop_replication).
ERROR_ACTIONS = ("ignore", "warn", "retry_log", "log", "retry_stop", "stop")
# A collision (an insert whose key exists, an update or delete that finds no
# row) is applied as an upsert and reported unless configured otherwise.
DEFAULT_ACTIONS: Mapping[str, str] = MappingProxyType({"collision": "warn"})


@dataclass(frozen=True)
class ApplyConfig:
    """``apply.*``: how much each cycle takes, how open transactions are buffered, how long pairs are kept.

    ``intermediate_retention_hours``: None keeps applied pairs forever; a number
    deletes, after each run, applied pairs that no restart needs and whose
    cycle was committed more than that many hours ago (a run-ledger replay
    needs them until then).

    ``queue_memory_mb``: the one memory budget (MiB) for everything the
    Applier holds for the configuration (open-transaction buffers, tables
    waiting for a load connection, compiled rows waiting to be applied); None
    takes :data:`QUEUE_MEMORY_SHARE` of the driver memory
    (:func:`queue_memory_bytes`).

    ``executor_write_mb``: a cycle whose tables' compiled changes weigh this
    many MiB or more together has them written by Spark executor tasks, not
    by the driver (:mod:`applier.targets.executor_tasks`: Delta's commits,
    PostgreSQL's staging loads); infinity (``off``): all by the driver; None:
    4 MiB on a cluster, the driver with a local master
    (:func:`~applier.targets.executor_tasks.executor_threshold`).

    ``executor_reads``: Spark's executors read the ``.dat`` files' stream
    columns for the driver's checks (:mod:`applier.engine.dat_facts`); None:
    when the running application's master is not local.
    """

    process_intermediate_size_per_job: float = 0.0
    buffer_size_for_split_records: int = 1_048_576
    max_cycles_per_run: int = 0
    intermediate_retention_hours: float | None = None
    threads: int = 4
    queue_memory_mb: float | None = None
    executor_write_mb: float | None = None
    executor_reads: bool | None = None
    transient_retries: int = 3
    transient_retry_delay_s: float = 5.0
    compile_retry_threshold: int = 100
    retry_split: int = 3
    compile: bool = True
    compile_max_cmds: int = 100_000
    cdb_max_size_mb: float = 1024.0
    command_convert: frozenset[str] = frozenset()

    @property
    def cycle_limit_bytes(self) -> int:
        """The per-cycle size limit in bytes; 0 means every available pair."""
        return int(self.process_intermediate_size_per_job * MIB)


# The default queue memory: a quarter of ``spark.driver.memory`` (Spark's own
# default is 1g, so 256 MiB), leaving the rest to the Spark driver itself.
QUEUE_MEMORY_SHARE = 0.25
DEFAULT_DRIVER_MEMORY = "1g"
_MEMORY_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)b?", re.IGNORECASE)


def memory_bytes(text: str) -> int:
    """A JVM memory size such as ``512m``, ``4g`` or ``1024`` (MiB when unit-less, as Spark reads it) in bytes.

    Raises:
        ValueError: ``text`` is not a size.
    """
    found = _MEMORY_SIZE.fullmatch(text.strip())
    if not found:
        raise ValueError(f"{text!r} is not a memory size such as 512m or 4g")
    unit = found.group(2).lower() or "m"
    return int(float(found.group(1)) * 1024 ** "kmgt".index(unit) * 1024)


@dataclass(frozen=True)
class TargetConfig:
    """``target.*``: where changes are applied.

    ``path``: the Delta target's folder. ``url``: the PostgreSQL target's libpq
    connection string (a password is better left to ``PGPASSWORD`` or
    ``~/.pgpass``; it is never shown). ``schema_map``: source schema -> target
    schema (PostgreSQL; unmapped schemas keep their name). ``show_row_values``:
    whether a target error may show the failing row's values besides its key
    (a debugging aid, off: they may be personal data). ``lock_timeout_s`` and
    ``statement_timeout_s`` (PostgreSQL): how long a statement waits for a lock,
    and may run, before it fails with a transient error (0: no limit).
    ``compact_min_files`` (Delta): a table holding this many files smaller than
    its target size after a cycle's commit is compacted (``OPTIMIZE``; 0: never).
    """

    type: str = dialects.DEFAULT_TYPE
    path: Path | None = None
    url: str | None = None
    schema_map: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    show_row_values: bool = False
    lock_timeout_s: float = 60.0
    statement_timeout_s: float = 0.0
    compact_min_files: int = 50


@dataclass(frozen=True)
class ErrorsConfig:
    """``errors.*``: what a source transaction the target refuses costs.

    ``actions``: error class (:data:`~applier.errors.ERROR_CLASSES`) -> action
    (:data:`ERROR_ACTIONS`); a class not named stops. Transient classes are
    retried (``apply.transient_retries``) and then stop, whatever the action.
    ``command_retry``: how often ``retry_log`` and ``retry_stop`` try the
    failing transaction again before they log it or stop.
    """

    actions: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    command_retry: int = 3

    def action(self, error_class: str) -> str:
        """The action for a failure of ``error_class`` (``stop`` unless configured; ``warn`` for collisions)."""
        return self.actions.get(error_class, DEFAULT_ACTIONS.get(error_class, "stop"))


@dataclass(frozen=True)
class ValidateConfig:
    """``validate.*``: how target tables are validated after a load.

    ``in_memory_max_rows``: a table the checkpoint expects to hold at most
    this many rows is read into Arrow and validated with Great Expectations'
    pandas engine, without Spark; a larger one through Spark. 0: always Spark.
    """

    in_memory_max_rows: int = 1_000_000


@dataclass(frozen=True)
class SparkConfig:
    """``spark.*``: the Spark application the Applier runs in."""

    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Config:
    """The whole, validated configuration of one Applier."""

    configuration_name: str
    intermediate_dir: Path
    output_dir: Path
    apply: ApplyConfig = ApplyConfig()
    target: TargetConfig = TargetConfig()
    spark: SparkConfig = SparkConfig()
    errors: ErrorsConfig = ErrorsConfig()
    source: SourceConfig = field(default_factory=SourceConfig)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    materialize: MaterializeConfig = field(default_factory=MaterializeConfig)
    validate: ValidateConfig = ValidateConfig()
    alert: AlertConfig = field(default_factory=AlertConfig)

    @property
    def work_dir(self) -> Path:
        """``<output_dir>/<configuration_name>``: checkpoint, reports and spill files."""
        return self.output_dir / self.configuration_name

    @property
    def spill_dir(self) -> Path:
        return self.work_dir / "tmp"

    @property
    def queue_memory_bytes(self) -> int:
        """The queue-memory budget in bytes: ``apply.queue_memory_mb``, else a share of the driver memory."""
        if self.apply.queue_memory_mb is not None:
            return int(self.apply.queue_memory_mb * MIB)
        driver = memory_bytes(self.spark.conf.get("spark.driver.memory", DEFAULT_DRIVER_MEMORY))
        return int(driver * QUEUE_MEMORY_SHARE)


def _prefixed(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {k[len(prefix) + 1 :]: v for k, v in values.items() if k.startswith(f"{prefix}.")}


def _driver_memory(key: str, v: str) -> str:
    try:
        memory_bytes(v)
    except ValueError:
        raise ConfigError(key, v, "use a JVM memory size such as 1g or 4096m") from None
    return v


# key -> (validator, default; None means required unless noted in _required_keys)
_KEYS: dict[str, tuple[Callable[[str, Any], Any], Any]] = {
    "configuration_name": (cv.name, None),
    "intermediate_dir": (cv.text, None),
    "output_dir": (cv.text, None),
    "apply.process_intermediate_size_per_job": (cv.non_negative_number, 0.0),
    "apply.buffer_size_for_split_records": (cv.int_at_least(1, "bytes"), 1_048_576),
    "apply.max_cycles_per_run": (cv.int_at_least(0, "0 means until caught up"), 0),
    "apply.intermediate_retention_hours": (cv.hours_or_forever, None),
    "apply.queue_memory_mb": (cv.megabytes_or_default, None),
    "apply.executor_write_mb": (cv.megabytes_off_or_auto("4 on a cluster, off with a local master"), None),
    "apply.executor_reads": (cv.boolean_or_auto("on a cluster, as the application's master says"), None),
    "target.type": (cv.choice(TARGET_TYPES), dialects.DEFAULT_TYPE),
    "target.path": (cv.text, None),
    "target.url": (cv.text, None),
    "target.show_row_values": (cv.boolean, False),
    "target.lock_timeout_s": (cv.seconds("0 waits for ever"), 60.0),
    "target.statement_timeout_s": (cv.seconds("0 means no limit"), 0.0),
    "target.compact_min_files": (cv.int_at_least(0, "small files that make a Delta table compacted, 0: never"), 50),
    "apply.transient_retries": (cv.int_at_least(0, "retries of a cycle after a transient target error"), 3),
    "apply.transient_retry_delay_s": (cv.seconds("the first wait; each retry waits twice the one before"), 5.0),
    "apply.threads": (cv.int_at_least(1, "concurrent table loads, the target's load connections"), 4),
    "apply.compile_retry_threshold": (
        cv.int_at_least(1, "commands below which a failing group goes to log order"),
        100,
    ),
    "apply.retry_split": (cv.split, 3),
    "apply.compile": (cv.boolean, True),
    "apply.compile_max_cmds": (cv.int_at_least(1, "commands of a compilable transaction or group"), 100_000),
    "apply.cdb_max_size_mb": (cv.positive_number, 1024.0),
    "apply.command_convert": (cv.conversions, frozenset()),
    "errors.command_retry": (cv.int_at_least(0, "tries again of a failing transaction"), 3),
    "spark.master": (cv.text, "local[*]"),
    "validate.in_memory_max_rows": (
        cv.int_at_least(0, "rows up to which a table is validated without Spark"),
        1_000_000,
    ),
    **SOURCE_KEYS,
    **ALERT_KEYS,
}
_PATH_KEYS = ("intermediate_dir", "output_dir", "target.path")
# None is their default, not "required".
_OPTIONAL_KEYS = (
    "apply.intermediate_retention_hours",
    "apply.queue_memory_mb",
    "apply.executor_write_mb",
    "apply.executor_reads",
    *SOURCE_OPTIONAL_KEYS,
    *ALERT_KEYS,
)
KNOWN_KEYS = (
    *_KEYS,
    f"{_SPARK_CONF}.<spark property>",
    f"{_SCHEMA_MAP}.<source schema>",
    f"{_ACTIONS}.<error class>",
)


def _action(key: str, v: Any) -> str:
    error_class = key.removeprefix(f"{_ACTIONS}.")
    if error_class not in ERROR_CLASSES:
        raise ConfigError(key, v, f"unknown error class; classes: {', '.join(ERROR_CLASSES)}")
    if ERROR_CLASSES[error_class]:
        if v not in ("retry_stop", "stop"):
            raise ConfigError(key, v, "a transient class is retried (apply.transient_retries), then stops: retry_stop")
        return str(v)
    return cv.choice(ERROR_ACTIONS)(key, v)


def _flatten(raw: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in raw.items():
        key = f"{prefix}{k}"
        if key in _MAPPINGS and isinstance(v, Mapping):
            flat.update({f"{key}.{ck}": cv for ck, cv in v.items()})
        elif isinstance(v, Mapping):
            flat.update(_flatten(v, f"{key}."))
        else:
            flat[key] = v
    return flat


def _read_file(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError("--config", str(path), f"the file cannot be read ({e.strerror})") from e
    except yaml.YAMLError as e:
        raise ConfigError("--config", str(path), f"the file is not valid YAML ({e})") from e
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("--config", str(path), "the file must hold a YAML mapping of keys")
    return _flatten(raw)


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``key=value``; the value is read as a YAML scalar (``5`` is a number)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError("--set", text, "use key=value, e.g. apply.max_cycles_per_run=3")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


def _resolve(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def _validate(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if key == f"{_SPARK_CONF}.spark.driver.memory":
            out[key] = _driver_memory(key, str(value))
        elif key.startswith(f"{_SPARK_CONF}."):
            out[key] = cv.text(key, str(value))
        elif key.startswith(f"{_SCHEMA_MAP}."):
            out[key] = cv.identifier(key, value)
        elif key.startswith(f"{_ACTIONS}."):
            out[key] = _action(key, value)
        elif key not in _KEYS:
            raise ConfigError(key, value, f"unknown key; known keys: {', '.join(KNOWN_KEYS)}")
        else:
            out[key] = _KEYS[key][0](key, value)
    for key, (_, default) in _KEYS.items():
        if key not in out:
            # A setting another target type requires is optional to this one.
            kind = out.get("target.type", dialects.DEFAULT_TYPE)
            optional = key in _OPTIONAL_KEYS or (
                key in dialects.REQUIRED_KEYS and key not in dialects.required_keys(kind)
            )
            if default is None and not optional:
                raise ConfigError(key, None, "this key is required")
            out[key] = default
    return out


def load_config(path: Path | str | None, overrides: Sequence[str] = ()) -> Config:
    """Load, override and validate the configuration.

    Args:
        path: the YAML file, or None to build from overrides alone.
        overrides: ``key=value`` strings applied over the file.

    Returns:
        The frozen configuration.

    Raises:
        ConfigError: naming the key, the value and what is allowed.
    """
    file_base = Path(path).resolve().parent if path is not None else Path.cwd()
    flat = _read_file(Path(path)) if path is not None else {}
    paths_from_cli: set[str] = set()
    for text in overrides:
        key, value = parse_override(text)
        flat[key] = value
        paths_from_cli.add(key)
    values = _validate(flat)
    for key in _PATH_KEYS:
        if values[key] is not None:
            values[key] = _resolve(values[key], Path.cwd() if key in paths_from_cli else file_base)
    spark_conf = _prefixed(values, _SPARK_CONF)
    return Config(
        configuration_name=values["configuration_name"],
        intermediate_dir=values["intermediate_dir"],
        output_dir=values["output_dir"],
        apply=ApplyConfig(
            process_intermediate_size_per_job=values["apply.process_intermediate_size_per_job"],
            buffer_size_for_split_records=values["apply.buffer_size_for_split_records"],
            max_cycles_per_run=values["apply.max_cycles_per_run"],
            intermediate_retention_hours=values["apply.intermediate_retention_hours"],
            threads=values["apply.threads"],
            queue_memory_mb=values["apply.queue_memory_mb"],
            executor_write_mb=values["apply.executor_write_mb"],
            executor_reads=values["apply.executor_reads"],
            transient_retries=values["apply.transient_retries"],
            transient_retry_delay_s=values["apply.transient_retry_delay_s"],
            compile_retry_threshold=values["apply.compile_retry_threshold"],
            retry_split=values["apply.retry_split"],
            compile=values["apply.compile"],
            compile_max_cmds=values["apply.compile_max_cmds"],
            command_convert=values["apply.command_convert"],
            cdb_max_size_mb=values["apply.cdb_max_size_mb"],
        ),
        target=TargetConfig(
            type=values["target.type"],
            path=values["target.path"],
            url=values["target.url"],
            schema_map=MappingProxyType(_prefixed(values, _SCHEMA_MAP)),
            show_row_values=values["target.show_row_values"],
            lock_timeout_s=values["target.lock_timeout_s"],
            statement_timeout_s=values["target.statement_timeout_s"],
            compact_min_files=values["target.compact_min_files"],
        ),
        spark=SparkConfig(master=values["spark.master"], conf=MappingProxyType(spark_conf)),
        validate=ValidateConfig(in_memory_max_rows=values["validate.in_memory_max_rows"]),
        errors=ErrorsConfig(
            actions=MappingProxyType(_prefixed(values, _ACTIONS)), command_retry=values["errors.command_retry"]
        ),
        source=source_config(values),
        extract=extract_config(values),
        materialize=materialize_config(values),
        alert=alert_config(values),
    )
