"""The PostgreSQL log extractor: a logical replication slot to intermediate-file pairs.

``pgoutput`` parses the plugin's messages, ``types`` maps column types and
values to the spec's, ``decode`` turns messages into rows, events and table
definitions, ``source`` is every statement sent to the server, ``run`` the
durable, exactly-once batch loop and ``setup`` the ``--setup`` checks.
Flow control: ``flow`` holds extraction back while the Applier's backlog is
too large, ``status_file`` is what it records of itself, and ``monitor`` what
``applier status`` shows of the source and the extractor.
"""

from __future__ import annotations

from applier.extract.run import ExtractSummary, extract, resume_point
from applier.extract.setup import SetupReport, setup_source

__all__ = ["ExtractSummary", "SetupReport", "extract", "resume_point", "setup_source"]
