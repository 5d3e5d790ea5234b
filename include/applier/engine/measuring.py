"""Each table's longest image in a cycle, for the groups' size estimate, measured where the images are read.

The groups' estimate (:func:`~applier.engine.parts.txn_shapes`) counts a row
at its table's fixed widths plus the table's longest image in the cycle.
Measuring that means decompressing every image of every pair: the driver did
it beside its reading, about 0.33 CPU s of its 0.77 s on a cycle of a million
rows, on one core however many executors there were.

Where the groups do not shape the compile (a target whose tables commit one
by one, Delta, applies what is left of a cycle as one compiled part whatever
its groups; :class:`~applier.engine.units.CycleParts`), the compile job's read
tasks measure the pairs they read instead, every row of them before keeping
the committed ones: each task writes what its part of a pair holds to the
job's folder (:func:`record_lengths`), and the driver takes the pairs whose
parts all came back (:func:`note_measured`). The first compile job of a
cycle reads every pair that has rows (it checks their images), so the
driver measures only what no job read (:func:`measure_rest`): a cycle that
committed nothing, a resumed cycle's applied pairs. A target whose groups
shape the compile (PostgreSQL) needs the sizes before it, and the driver
measures them as it reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from applier.engine.cycle_input import CycleInput
from applier.engine.part_files import part_path, temporary, written_parts
from applier.engine.reading import longest_images_in
from applier.engine.touches import merge_longest

LENGTHS_PREFIX = "images-"
LENGTHS_SUFFIX = ".json"
"""Name the files of a compile job's folder that hold a read task's longest images (:func:`record_lengths`):
``images-<seq>-<part>-<parts>.json``."""


def record_lengths(folder: str, seq: int, part: int, parts: int, longest: Mapping[str, int]) -> None:
    """Write the longest images of part ``part`` of ``parts`` of pair ``seq`` to a compile job's ``folder``.

    Written whole or not at all (a task retried rewrites the same figures).
    """
    path = part_path(folder, LENGTHS_PREFIX, LENGTHS_SUFFIX, seq, part, parts)
    written = temporary(path)
    written.write_text(json.dumps(longest), encoding="utf-8")
    written.replace(path)


def note_measured(cycle: CycleInput, folder: Path) -> None:
    """Take into ``cycle`` the pairs of :attr:`~CycleInput.unmeasured` whose every part a job's task measured.

    The job's files are removed once read.
    """
    whole, found = written_parts(folder, LENGTHS_PREFIX, LENGTHS_SUFFIX)
    for seq, files in sorted(whole.items()):
        if seq in cycle.unmeasured:
            for path in files:
                merge_longest(cycle.longest_image, json.loads(path.read_text(encoding="utf-8")))
            cycle.unmeasured.discard(seq)
    for path in found:
        path.unlink()


def measure_rest(cycle: CycleInput) -> None:
    """Measure here the images of the pairs no compile job measured (:attr:`~CycleInput.unmeasured`)."""
    for ref in cycle.pairs:
        if ref.seq in cycle.unmeasured:
            merge_longest(cycle.longest_image, longest_images_in(ref.dat_path))
    cycle.unmeasured.clear()
