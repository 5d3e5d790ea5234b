"""Great Expectations, imported quietly and offline.

Every module of :mod:`applier.validate` imports GX through here, so the
settings below are in force before GX is first imported: no usage
statistics (``GX_ANALYTICS_ENABLED``), and only warnings from its loggers (it
logs every renderer it registers at import). Progress bars are switched off in
the context's configuration (:mod:`applier.validate.gxrun`). Nothing here, nor
anything the Applier asks of GX, needs the network: the context is ephemeral,
the data source is a Spark DataFrame and Data Docs are written to a folder.
"""

from __future__ import annotations

import logging
import os
from typing import Any

os.environ["GX_ANALYTICS_ENABLED"] = "False"
logging.getLogger("great_expectations").setLevel(logging.WARNING)

import great_expectations as _great_expectations  # noqa: E402
from great_expectations.expectations.core.expect_column_values_to_be_of_type import (  # noqa: E402
    ExpectColumnValuesToBeOfType,
)

# Typed loosely: GX's annotations are partial, and its package does not
# re-export most names it documents (mypy --strict refuses them).
gx: Any = _great_expectations

__all__ = ["ExpectColumnValuesToBeOfType", "gx"]
