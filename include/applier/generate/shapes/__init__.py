"""Workloads of real shapes the shop model cannot make.

``wide``: hundreds of tables of dozens of columns of every spec type, a tenth
of them without a key, with a skewed, concurrent transaction mix.
``many-open``: thousands of transactions open at once, their rows spread over
many pairs, ending together at the end of the stream.

Both run on the shop generator's database model (row locks, gates, keyless
multisets) and its log (``Stream``), so their streams are ones a source could
have logged; :func:`applier.generate.shapes.run.generate_shaped` is the entry
point. This package's ``__init__`` imports nothing, so the profile registry
can read :mod:`applier.generate.shapes.profiles` cheaply.
"""
