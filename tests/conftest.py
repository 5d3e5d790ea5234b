"""Shared fixtures. One Spark session for the whole run lives here once the engine needs it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def spec_dir() -> Path:
    """The shared spec folder: ``$CDC_SPEC_DIR`` or ``../shared/spec`` beside the repository."""
    return Path(os.environ.get("CDC_SPEC_DIR", REPO.parent / "shared" / "spec"))


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    path = spec_dir() / "vectors"
    assert (path / "valid").is_dir(), f"conformance vectors not found at {path}; set CDC_SPEC_DIR"
    return path
