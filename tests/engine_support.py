"""Helpers for engine tests: configs, running the Applier in-process, comparing with the reference."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from applier.config import Config, load_config
from applier.engine.api import run_applier
from applier.engine.run import RunSummary
from applier.targets import open_target
from reference.applier import RefTable, canonical_rows, reference_apply

SPEC_TO_ARROW = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "double": pa.float64(),
    "string": pa.string(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "binary": pa.binary(),
}


def expected_arrow_type(spec_type: str) -> pa.DataType:
    """The Arrow type a spec type must land as (written here, independent of the engine)."""
    if spec_type.startswith("decimal("):
        precision, scale = spec_type[len("decimal(") : -1].split(",")
        return pa.decimal128(int(precision), int(scale))
    return SPEC_TO_ARROW[spec_type]


def make_config(tmp_path: Path, intermediate: Path, target: Sequence[str] = (), **apply: Any) -> Config:
    """A configuration over ``intermediate`` with its output (and a Delta target) under ``tmp_path``.

    ``target`` holds overrides for another target (the ``target_settings`` fixture).
    """
    overrides = [f"apply.{k}={v}" for k, v in apply.items()] + list(target)
    return load_config(
        None,
        [
            "configuration_name=test_cfg",
            f"intermediate_dir={intermediate}",
            f"output_dir={tmp_path / 'out'}",
            f"target.path={tmp_path / 'target'}",
            *overrides,
        ],
    )


def run(config: Config, spark: Any, max_cycles: int | None = None) -> RunSummary:
    return run_applier(config, spark=spark, max_cycles=max_cycles)


def target_tables(config: Config, names: list[str]) -> dict[str, list[list[Any]]]:
    """Each table's rows in the reference's canonical form (missing table: no rows)."""
    target = open_target(config)
    out: dict[str, list[list[Any]]] = {}
    for name in names:
        table = target.read_arrow(name)
        out[name] = [] if table is None else [list(r.values()) for r in table.to_pylist()]
    return out


def assert_target_equals_reference(
    config: Config, intermediate: Path, through_seq: int | None = None
) -> dict[str, RefTable]:
    """Compare every table row for row and type for type with the independent reference applier."""
    expected = reference_apply(intermediate, through_seq)
    target = open_target(config)
    for name, ref in expected.items():
        table = target.read_arrow(name)
        if table is None:
            assert ref.rows == [], f"{name}: table missing but the reference has {len(ref.rows)} rows"
            continue
        assert table.column_names == ref.columns, f"{name}: columns {table.column_names} != {ref.columns}"
        types = [expected_arrow_type(t) for t in ref.types]
        assert table.schema.types == types, f"{name}: types {table.schema.types} != {types}"
        got = canonical_rows(
            list(zip(ref.columns, ref.types, strict=True)), [list(r.values()) for r in table.to_pylist()]
        )
        assert len(got) == len(ref.rows), f"{name}: {len(got)} rows, reference has {len(ref.rows)}"
        assert got == ref.rows, f"{name}: rows differ from the reference"
    return expected
