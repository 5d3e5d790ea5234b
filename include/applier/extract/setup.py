"""``applier extract --setup``: check the source server and create the publication and slot.

The publication comes first: pgoutput reads it while decoding, so the slot
must not start before it exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from applier.config import Config
from applier.errors import ConfigError, ExtractError
from applier.extract import source


@dataclass
class SetupReport:
    """What ``--setup`` created and what it warns about."""

    publication_created: bool = False
    slot_created: bool = False
    warnings: list[str] = field(default_factory=list)


def setup_source(config: Config) -> SetupReport:
    """Check ``wal_level``, free slots and the REPLICATION right, then create what is missing.

    Raises:
        ExtractError: listing everything the server or role lacks, each with its fix.
        ConfigError: a ``source.*`` key is missing.
    """
    src = config.source
    for key, value in (("source.url", src.url), ("source.slot", src.slot), ("source.publication", src.publication)):
        if not value:
            raise ConfigError(key, value, "this key is required for applier extract")
    assert src.url and src.slot and src.publication
    report = SetupReport()
    conn = source.connect(src.url, autocommit=True)
    try:
        problems = source.readiness_problems(conn, src.slot)
        if problems:
            raise ExtractError("the source is not ready for logical decoding: " + "; ".join(problems))
        report.publication_created = source.create_publication(conn, src.publication, sorted(src.include))
        report.slot_created = source.create_slot(conn, src.slot)
        for table in source.keyless_without_full(conn, src.publication):
            if table not in src.exclude:
                report.warnings.append(
                    f"table {table} has no primary key: PostgreSQL refuses its updates and deletes while it is "
                    f"published, and they cannot be extracted; run ALTER TABLE {table} REPLICA IDENTITY FULL"
                )
    finally:
        conn.close()
    return report
