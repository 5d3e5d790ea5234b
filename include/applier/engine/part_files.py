"""Files a compile job's read tasks write, one per part of a pair, and how the driver knows a pair is whole.

A task reading part ``part`` of ``parts`` of pair ``seq`` writes
``<prefix><seq>-<part>-<parts><suffix>`` to the job's folder, whole or not at
all (a task retried writes it again). The driver takes a pair's files once
every part of it is there (:func:`written_parts`): the images' lengths
(:mod:`~applier.engine.measuring`) and the still-open rows
(:mod:`~applier.engine.open_rows`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def part_path(folder: str | Path, prefix: str, suffix: str, seq: int, part: int, parts: int) -> Path:
    """The file of part ``part`` of ``parts`` of pair ``seq``."""
    return Path(folder, f"{prefix}{seq}-{part}-{parts}{suffix}")


def temporary(path: Path) -> Path:
    """Where a task writes ``path`` before moving it into place whole (hidden from :func:`written_parts`).

    Its own name: two attempts of one task (a speculative one, on another
    machine of the cluster, whose process may have the same pid) never write
    one file.
    """
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}")


def written_parts(folder: Path, prefix: str, suffix: str) -> tuple[dict[int, list[Path]], list[Path]]:
    """Per pair all of whose parts are in ``folder``, their files in part order; and every such file found."""
    parts: dict[int, dict[int, Path]] = {}
    expected: dict[int, int] = {}
    found = sorted(folder.glob(f"{prefix}*{suffix}"))
    for path in found:
        seq, part, of = map(int, path.name.removeprefix(prefix).removesuffix(suffix).split("-"))
        parts.setdefault(seq, {})[part] = path
        expected[seq] = of
    whole = {seq: [files[p] for p in sorted(files)] for seq, files in parts.items() if len(files) == expected[seq]}
    return whole, found
