"""Resubmitting a transaction from the exceptions store, once the operator fixed what refused it.

The stored changes (images as the pairs held them) are compiled in the driver
(:mod:`applier.engine.compile_local`) against the table definitions of the
checkpoint, and the target applies their net change and marks the record
resubmitted in one transaction: a second resubmission finds the mark and
applies nothing. The change lands as of now: later transactions the Applier
applied to the same keys are not replayed after it.

A target whose tables commit one by one (``atomic_cycles`` False: Delta)
cannot make the apply and the mark one transaction; it makes them a sequence
that is safe to repeat (:mod:`applier.targets.delta_resubmit`). For that it
must be the tables' only writer, so the resubmission holds the
configuration's run lock (:mod:`applier.engine.runlock`) from reading the
record to marking it: a run or another resubmission under way refuses it
(exit 6), and it refuses them. PostgreSQL's single transaction needs no lock.
"""

from __future__ import annotations

import tempfile
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import pyarrow as pa

from applier.config import Config
from applier.engine.checkpoint import CheckpointStore
from applier.engine.compile_local import compile_locally
from applier.engine.compiled import CompiledCycle
from applier.engine.queue import MemoryQueue
from applier.engine.runlock import RunLock
from applier.errors import ExceptionNotFoundError, ExceptionResubmittedError, TargetError
from applier.targets import Target


def resubmit(config: Config, target: Target, ident: int) -> str:
    """Apply exception ``ident`` once; what happened, in words.

    Raises:
        ExceptionNotFoundError: no such exception (a usage error, exit code 2).
        ExceptionResubmittedError: it was resubmitted already (a usage error, exit code 2).
        TargetError: the target refused it again (nothing changed).
        RunLockedError: a target committing table by table, and a run or
            resubmission of the configuration holds its run lock.
    """
    lock: AbstractContextManager[object] = (
        nullcontext() if target.atomic_cycles else RunLock(config.work_dir, config.configuration_name)
    )
    with lock:
        return _resubmit(config, target, ident)


def _resubmit(config: Config, target: Target, ident: int) -> str:
    found = target.exceptions(ident)
    if not found:
        raise ExceptionNotFoundError(f"no exception {ident} in configuration {config.configuration_name}")
    record = found[0]
    if record["resubmitted_at"] is not None:
        raise ExceptionResubmittedError(f"exception {ident} was resubmitted at {record['resubmitted_at'].isoformat()}")
    definitions = CheckpointStore(config.work_dir).load().tables
    changes = record["changes_list"]
    missing = sorted({c["table_name"] for c in changes} - set(definitions))
    if missing:
        raise TargetError(f"exception {ident}: the checkpoint has no definition of table {missing[0]}")
    rows = pa.table(
        {
            "lsn": pa.array([c["lsn"] for c in changes], pa.int64()),
            "xid": pa.array([record["xid"]] * len(changes), pa.string()),
            "table": pa.array([c["table_name"] for c in changes], pa.string()),
            "op": pa.array([c["op"] for c in changes], pa.string()),
            "before": pa.array([c["before"] for c in changes], pa.string()),
            "after": pa.array([c["after"] for c in changes], pa.string()),
            "commit_lsn": pa.array([record["commit_lsn"]] * len(changes), pa.int64()),
        }
    )
    touched = {c["table_name"] for c in changes if c["op"] != "T"}
    truncates = {
        c["table_name"]: (record["commit_lsn"], c["lsn"])
        for c in sorted(changes, key=lambda c: c["lsn"])
        if c["op"] == "T"
    }
    names = sorted(touched | set(truncates))
    with tempfile.TemporaryDirectory(prefix="applier-resubmit-") as folder:
        compiled = CompiledCycle(
            {n: definitions[n] for n in names},
            frozenset(truncates),
            MemoryQueue(config.queue_memory_bytes),
            Path(folder),
            config.configuration_name,
        )
        try:
            compile_locally(rows, definitions, truncates, touched, compiled)
            applied = target.resubmit(ident, compiled)
        finally:
            compiled.close()
    if not applied:
        return f"exception {ident} was resubmitted meanwhile by another command; nothing applied"
    return f"exception {ident}: transaction {record['xid']} applied ({len(changes)} changes to {', '.join(names)})"
