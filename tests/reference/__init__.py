"""An independent, pure-Python reference applier used by end-to-end tests (shares no code with ``applier``)."""

from __future__ import annotations

from .applier import ReferenceApplyError, RefTable, canonical_rows, canonical_value, reference_apply

__all__ = ["RefTable", "ReferenceApplyError", "canonical_rows", "canonical_value", "reference_apply"]
