"""A seeded, realistic workload generator writing intermediate-file pairs.

``generate_workload`` simulates a small shop database (see ``tables.py``):
concurrent transactions under row locks, long transactions spanning pairs,
key moves, truncates, a keyless log with duplicates, every column type and
its special values, a mid-stream schema change and transactions left open.
The same seed gives byte-identical files. The shaped profiles ``wide`` and
``many-open`` (see ``shapes/``) make hundreds of wide tables and thousands of
transactions open at once on the same model.
"""

from __future__ import annotations

from applier.generate.profiles import PROFILES, Profile, get_profile, profile_descriptions
from applier.generate.shapes.profiles import SHAPE_PROFILES, parse_columns
from applier.generate.workload import GenerateSummary, generate_workload

__all__ = [
    "PROFILES",
    "SHAPE_PROFILES",
    "GenerateSummary",
    "Profile",
    "generate_workload",
    "get_profile",
    "parse_columns",
    "profile_descriptions",
]
