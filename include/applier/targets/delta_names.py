"""Which source tables can be Delta tables under the target root, as named.

A table ``schema.table`` is the folder ``<root>/<schema>/<table>``, read by
delta-rs and, through its files, by Spark. So each part of the name must be a
folder name the file system takes and that neither Delta nor Spark skips:

- at most 255 bytes (a file system's name limit), and the table's folder
  short enough for its longest file paths (``PATH_MAX``, 4,096 bytes, less
  :data:`FILE_NAME_RESERVE` for the data and log files inside it);
- not starting with ``_``: Delta keeps its log in ``_delta_log`` (and change
  data in ``_change_data``), Spark and Hadoop skip files and folders whose
  names start with ``_`` or ``.``, and the Applier keeps its own objects on a
  Delta target under names that start with ``_`` (``<root>/_applier``), where
  no source table can land. Table names of the spec never start with ``.``.

Distinct names are distinct folders, so two source tables never share one.
"""

from __future__ import annotations

import os
from pathlib import Path

# Where the Applier keeps its own objects on a Delta target (a copy of each
# configuration's checkpoint): a name no table can take.
OWN_FOLDER = "_applier"
NAME_MAX = 255
PATH_MAX = 4096
# The longest path a table folder holds below it: a data file
# (``part-00000-<uuid>-c000.snappy.parquet``) or a log checkpoint
# (``_delta_log/<20 digits>.checkpoint.parquet``), with room to spare.
FILE_NAME_RESERVE = 100


def delta_misfit(name: str, root: Path) -> str | None:
    """Why table ``name`` (``schema.table``) cannot be a Delta table under ``root``; None when it can."""
    for part in name.split("."):
        size = len(part.encode())
        if size > NAME_MAX:
            return f"its name part {part[:40]}… has {size} bytes; a folder name has at most {NAME_MAX}"
        if part.startswith("_"):
            return (
                f"its name part {part!r} starts with '_': Delta and Spark take such folders for their own "
                "(_delta_log) or skip them, and the Applier keeps its own objects there"
            )
    folder = len(os.fsencode(root)) + 1 + len(name.encode())
    if folder + FILE_NAME_RESERVE > PATH_MAX:
        return (
            f"its folder under {root} has {folder} bytes; with the {FILE_NAME_RESERVE} its files need, "
            f"over the {PATH_MAX}-byte path limit"
        )
    return None
