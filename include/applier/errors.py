"""The Applier's exception hierarchy.

Every error the Applier raises on purpose derives from :class:`ApplierError`.
Each family carries the process exit code the CLI reports for it, so the
mapping from failure to exit code lives in one place:

- 0  success (including nothing to do)
- 2  usage or configuration error      (:class:`ConfigError`)
- 3  refused intermediate file          (:class:`IntermediateFileError`)
- 4  target or apply error              (:class:`TargetError`)
- 5  a target table failed validation   (:class:`ValidationError`)
- 6  another run holds the run lock     (:class:`RunLockedError`)
- 7  a state file of the Applier is damaged (:class:`StateFileError`)
- 8  the source cannot be extracted as it stands (:class:`ExtractError`)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# A password in a connection string: a URI's ``user:password@`` and libpq's
# (or a query string's) ``password=...``, quoted or not, whatever the case.
_URI_PASSWORD = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^\s:/@]*:)[^\s@]*(@)")
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s'&]+)", re.IGNORECASE)
MASK = "***"


def mask_secrets(text: str) -> str:
    """``text`` with the password of every connection string in it replaced by ``***``."""
    return _KEYWORD_PASSWORD.sub(rf"\g<1>{MASK}", _URI_PASSWORD.sub(rf"\g<1>{MASK}\g<2>", text))


class ApplierError(Exception):
    """Base class of every error the Applier raises deliberately.

    Its message never shows a password: connection strings in it are masked
    (:func:`mask_secrets`), whatever raised it (a misspelt key echoing its
    value, a target naming its server).
    """

    exit_code = 1

    def __str__(self) -> str:
        return mask_secrets(super().__str__())


class ConfigError(ApplierError):
    """A configuration key is missing, unknown, or has a value that is not allowed."""

    exit_code = 2

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(f"configuration key '{key}': {value!r} is not allowed; {allowed}")


class FolderError(ConfigError):
    """A folder the configuration names is missing, is not a folder, or cannot be read or written.

    Checked before anything starts (the run lock, the target, Spark), so the
    message names the key and the folder at once.
    """

    def __init__(self, key: str, path: Path, problem: str, fix: str) -> None:
        self.key = key
        self.value = str(path)
        self.allowed = fix
        ApplierError.__init__(self, f"configuration key '{key}': {path} {problem}; {fix}")


class UsageError(ApplierError):
    """A command was called with arguments that do not fit together."""

    exit_code = 2


class ExceptionNotFoundError(UsageError):
    """The exceptions store holds no exception of that id (never, or deleted): nothing to resubmit.

    A class of its own so that the Applier view can answer 404 where the
    command line exits with 2, as for any usage error.
    """


class ExceptionResubmittedError(UsageError):
    """The exception was resubmitted already: its transaction is applied once, never twice (the view answers 409)."""


class IntermediateFileError(ApplierError):
    """An intermediate file (a ``.dat``/``.trn`` pair) is refused.

    Attributes:
        path: the file (or pair name) that holds the defect.
        seq: the pair's sequence number.
        code: a short, stable name of the defect (``sha-mismatch``, ``gap``, ...),
            matching the defect names of the conformance vectors.
        detail: what is wrong, in words.
    """

    exit_code = 3

    def __init__(self, path: Path | str, seq: int, code: str, detail: str) -> None:
        self.path = Path(path)
        self.seq = seq
        self.code = code
        self.detail = detail
        super().__init__(f"{self.path}: {detail} [{code}]")

    def __reduce__(self) -> tuple[type[IntermediateFileError], tuple[Path, int, str, str]]:
        # Rebuilt from its fields when it crosses a process boundary (worker checks).
        return (type(self), (self.path, self.seq, self.code, self.detail))


class LateImageRefusal(IntermediateFileError):
    """Spark's executors found a row image that breaks the spec after the driver had read past its pair.

    The engine has the executors check images while they compile, so the
    driver reads a cycle's pairs without their images' values. A refusal found
    there is not raised to the user: the run re-reads from its checkpoint with
    the driver checking every image, which cuts the cycle at the refused pair
    exactly as a refusal at reading does. Raised only if that did not happen.
    """


class CorruptPairError(IntermediateFileError):
    """The pair does not match its header, or a file is not what the spec says it is."""


class InvalidChangeError(IntermediateFileError):
    """A row change breaks the spec: lsn order, operation, image, key or value."""


class TransactionSequenceError(IntermediateFileError):
    """Transaction events and rows do not form valid transactions (begin, rows, one end)."""


class IncompatibleSchemaChangeError(IntermediateFileError):
    """A table definition changed in a way other than adding nullable columns."""


class UnfitTableError(IntermediateFileError):
    """A table the pair defines cannot land in the target as named (a name limit, a reserved name, a collision)."""


class GapError(IntermediateFileError):
    """A sequence number is missing before a complete pair."""


# Classes of target errors, each transient (the same apply may succeed later,
# unchanged) or permanent (it fails again until the data or the target changes).
# Targets classify their errors where they arise: PostgreSQL by SQLSTATE
# (``pg_errors.error_class``), Delta by delta-rs's exception and message.
ERROR_CLASSES: Mapping[str, bool] = {
    # permanent: the row or the table
    "unique": False,  # a unique index or key refuses a value (23505)
    "foreign_key": False,  # 23503
    "check": False,  # a CHECK constraint (23514), a Delta constraint or invariant
    "not_null": False,  # 23502
    "data": False,  # a value out of range or of the wrong form (SQLSTATE class 22)
    "collision": False,  # an insert whose key exists, an update or delete that finds no row
    "schema": False,  # the table's columns do not take the rows (drift, a Delta schema mismatch)
    "other": False,
    # transient: the moment
    "serialization": True,  # serialization failure, deadlock (class 40)
    "connection": True,  # connecting, or the connection lost (class 08)
    "shutdown": True,  # the server shutting down or starting (57P01-57P03)
    "resources": True,  # insufficient resources (class 53)
    "lock": True,  # lock_timeout (55P03)
    "timeout": True,  # statement_timeout (57014)
    "conflict": True,  # a Delta commit conflicting with another writer's
}


# The line the apply job prints after a target error that is not transient, so
# that its scheduler fails the task instead of retrying it.
PERMANENT_LINE = "applier: permanent target error: a retry fails the same way until the data or the target changes"


class TargetError(ApplierError):
    """Writing to the target failed; the cycle was not committed.

    Attributes:
        error_class: one of :data:`ERROR_CLASSES`, what kind of failure it was.
        transient: the same apply may succeed later, unchanged (a lock
            timeout, a lost connection, a deadlock): the engine retries the
            cycle (``apply.transient_retries``) before it gives up. By
            default, what the class says.
        table: the table it arose at, when known.
        code: the target's own code for it (a SQLSTATE, a delta-rs exception name), when known.
        nothing_applied: a target whose tables commit one by one refused
            before committing any of them (a Delta constraint checked first),
            so the apply can be split like a rolled-back transaction.
    """

    exit_code = 4

    def __init__(
        self,
        message: str,
        *,
        transient: bool | None = None,
        error_class: str = "other",
        table: str | None = None,
        code: str | None = None,
        nothing_applied: bool = False,
    ) -> None:
        if error_class not in ERROR_CLASSES:
            raise ValueError(f"unknown target error class {error_class!r}")
        self.error_class = error_class
        self.transient = ERROR_CLASSES[error_class] if transient is None else transient
        self.table = table
        self.code = code
        self.nothing_applied = nothing_applied
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        message = self.args[0] if self.args else ""
        fields = (self.transient, self.error_class, self.table, self.code, self.nothing_applied)
        return (_target_error, (message, *fields))


def _target_error(
    message: str,
    transient: bool,
    error_class: str = "other",
    table: str | None = None,
    code: str | None = None,
    nothing_applied: bool = False,
) -> TargetError:
    return TargetError(
        message, transient=transient, error_class=error_class, table=table, code=code, nothing_applied=nothing_applied
    )


class TransactionStoppedError(TargetError):
    """A source transaction failed alone and its error action stops the run (``errors.actions.<class>: stop``).

    Every transaction before it was applied and checkpointed; the message
    names it (xid, commit lsn, pair), the table and the target's error.

    Attributes:
        xid: the failing transaction.
    """

    def __init__(self, message: str, *, xid: str, cause: TargetError) -> None:
        super().__init__(message, transient=False, error_class=cause.error_class, table=cause.table, code=cause.code)
        self.xid = xid


class ValidationError(ApplierError):
    """A target table failed its validation after a load (an expectation, or the table is missing).

    The load itself is committed; validation found it does not match the table
    definitions or the row counts the engine reported.

    Attributes:
        failures: one line per failure, naming the table and the expectation.
        json_path: the file holding the validation's full results, if written.
    """

    exit_code = 5

    def __init__(self, failures: Sequence[str], json_path: Path | None = None) -> None:
        self.failures = list(failures)
        self.json_path = json_path
        where = f" (results: {json_path})" if json_path is not None else ""
        super().__init__(f"validation failed: {'; '.join(self.failures)}{where}")

    def __reduce__(self) -> tuple[type[ValidationError], tuple[list[str], Path | None]]:
        return (type(self), (self.failures, self.json_path))


class RunLockedError(ApplierError):
    """Another run holds this configuration's run lock; this run stopped before changing anything.

    One run at a time applies a configuration (:mod:`applier.engine.runlock`).
    A second run is refused at once, before it touches the target, the
    checkpoint or the spill files, and before it starts Spark.

    Attributes:
        lock: the lock that is held (the lock file, or the PostgreSQL advisory lock).
        holder: who holds it, in words (``the run on host h, pid 12, started …``).
    """

    exit_code = 6

    def __init__(self, lock: str, holder: str, activity: str = "applying") -> None:
        self.lock = lock
        self.holder = holder
        self.activity = activity
        super().__init__(
            f"another run is {activity} this configuration: {lock} is held by {holder}; this run changed nothing"
        )

    def __reduce__(self) -> tuple[type[RunLockedError], tuple[str, str, str]]:
        return (type(self), (self.lock, self.holder, self.activity))


class StateFileError(ApplierError):
    """A file that holds the Applier's state (checkpoint, intent, run ledger) cannot be read as it was written.

    Nothing was changed: the run stopped before applying anything. A retry
    cannot mend it; the message says what to do.

    Attributes:
        path: the damaged file.
        problem: what is wrong with it.
        remedy: what the operator can do.
    """

    exit_code = 7

    def __init__(self, path: Path | str, problem: str, remedy: str) -> None:
        self.path = Path(path)
        self.problem = problem
        self.remedy = remedy
        super().__init__(f"{self.path} is damaged ({problem}); {remedy}")

    def __reduce__(self) -> tuple[type[StateFileError], tuple[Path, str, str]]:
        return (type(self), (self.path, self.problem, self.remedy))


class ExtractError(ApplierError):
    """The PostgreSQL source cannot be extracted as it stands.

    A value or type no spec type holds exactly, a keyless table changed without
    ``REPLICA IDENTITY FULL``, a definition change other than an added column,
    or a server that lacks what logical decoding needs. The message names the
    table, column and value, or what is missing, and the fix.
    """

    exit_code = 8


class SourceUnavailableError(ExtractError):
    """The source cannot be reached, or the connection to it was lost: the same run may succeed later, unchanged.

    Nothing past the last complete pair was confirmed on the slot, so a retry
    (or the next scheduled batch) continues exactly where this one stopped.
    """

    transient = True
