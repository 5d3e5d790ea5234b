"""Benchmarks of the Applier (results in docs/benchmarks.md)."""
