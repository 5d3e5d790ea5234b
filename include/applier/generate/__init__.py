"""A seeded, realistic workload generator writing intermediate-file pairs.

``generate_workload`` simulates a small shop database (see ``tables.py``):
concurrent transactions under row locks, long transactions spanning pairs,
key moves, truncates, a keyless log with duplicates, every column type and
its special values, a mid-stream schema change and transactions left open.
The same seed gives byte-identical files.
"""

from __future__ import annotations

from applier.generate.profiles import PROFILES, Profile, get_profile
from applier.generate.workload import GenerateSummary, generate_workload

__all__ = ["PROFILES", "GenerateSummary", "Profile", "generate_workload", "get_profile"]
