"""What a command checks before it starts Spark, each in about a second: folders and the backlog's pair headers.

A run checks, in this order and before Spark starts: the configuration
(:func:`applier.config.load_config`), its folders (:func:`check_folders`), the
run lock, the state files, the target (a PostgreSQL target connects for its
run lock; a Delta target reads its tables' logs), the first cycle's pairs, and
whether there is anything to do at all (:mod:`applier.engine.run` starts Spark
lazily, at its first apply). ``applier plan`` and ``applier status`` check
the folders and every backlog pair's header and ``.dat`` size
(:func:`refused_pairs`), so a pair cut short is flagged, not listed as fine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from applier.config import Config
from applier.engine.checkpoint import Checkpoint, CheckpointStore
from applier.errors import FolderError, IntermediateFileError, UsageError
from applier.intermediate.pairs import PairRef
from applier.intermediate.reader import check_header_and_size


def check_folders(config: Config, *, writing: bool) -> None:
    """Refuse a configuration whose folders cannot serve: exit code 2, naming the key and the folder.

    Args:
        config: the configuration.
        writing: the command writes (a run): the work folder and a Delta
            target's root must be folders that exist or can be made, writable.

    Raises:
        FolderError: ``intermediate_dir`` is missing, not a folder or not
            readable; with ``writing``, ``output_dir`` or ``target.path``
            cannot be written.
    """
    _readable_folder("intermediate_dir", config.intermediate_dir)
    if not writing:
        return
    _writable_folder("output_dir", config.work_dir)
    if config.target.type == "delta" and config.target.path is not None:
        _writable_folder("target.path", config.target.path)


def _readable_folder(key: str, path: Path) -> None:
    if not path.exists():
        raise FolderError(key, path, "does not exist", "create it, or set it to the folder the extractor writes into")
    if not path.is_dir():
        raise FolderError(key, path, "is not a folder", "set it to the folder the extractor writes pairs into")
    if not os.access(path, os.R_OK | os.X_OK):
        raise FolderError(key, path, "cannot be read by this user", "grant read access, or run as its owner")


def _writable_folder(key: str, path: Path) -> None:
    """``path`` is a writable folder, or the nearest folder above it that exists is (it is made on first use)."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise FolderError(key, path, f"cannot be made: {existing} is not a folder", "point it at a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        shown = "" if existing == path else f" ({existing}, where it would be made)"
        raise FolderError(key, path, f"cannot be written{shown}", "grant write access, or point it elsewhere")


def tables_to_validate(
    config: Config, tables: Sequence[str] | None = None, checkpoint: Checkpoint | None = None
) -> list[str]:
    """The tables validation takes: ``tables`` (each once), or every table of the checkpoint; checked without Spark.

    Raises:
        UsageError: a table is not in the checkpoint (naming the tables it has).
        StateFileError: the checkpoint is damaged.
    """
    checkpoint = checkpoint or CheckpointStore(config.work_dir).load()
    if tables is None:
        return sorted(checkpoint.tables)
    unknown = [t for t in tables if t not in checkpoint.tables]
    if unknown:
        known = ", ".join(sorted(checkpoint.tables)) or "none yet"
        raise UsageError(
            f"table {unknown[0]} is not in the checkpoint of configuration {config.configuration_name} "
            f"(its tables: {known})"
        )
    return list(dict.fromkeys(tables))


def refused_pairs(pairs: Iterable[PairRef]) -> Iterator[IntermediateFileError]:
    """The pairs among ``pairs`` whose ``.trn`` header or ``.dat`` size is refused, each as its error, in order.

    Only the header line and the file size are read (not the rows or the
    checksum): cheap enough for a whole backlog.
    """
    for ref in pairs:
        try:
            check_header_and_size(ref)
        except IntermediateFileError as e:
            yield e
