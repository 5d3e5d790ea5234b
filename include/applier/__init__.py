"""cdc-applier: applies change-data-capture intermediate files to a target in apply cycles."""

__version__ = "0.1.0"
