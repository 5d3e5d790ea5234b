"""Validation of a PostgreSQL target load: the same suites, the tables read through the target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from applier.generate import generate_workload
from applier.validate import validate_target
from engine_support import make_config, run

pytestmark = [pytest.mark.spark, pytest.mark.postgres, pytest.mark.slow]


def test_a_postgres_load_validates_and_a_deleted_row_fails_naming_the_table(
    tmp_path: Path, spark: Any, pg_url: str
) -> None:
    generate_workload(tmp_path / "in", seed=8, transactions=120, file_size_mb=0.05, profile="demo")
    config = make_config(tmp_path, tmp_path / "in", ["target.type=postgres", f"target.url={pg_url}"])
    run(config, spark)

    clean = validate_target(config, spark, results_name="clean")
    assert clean.success, clean.failures()
    assert "shop.orders" in clean.tables and clean.json_path.exists()

    with psycopg.connect(pg_url) as conn:
        conn.execute("DELETE FROM shop.orders WHERE ctid = (SELECT min(ctid) FROM shop.orders)")
    damaged = validate_target(config, spark, ["shop.orders"], results_name="damaged")
    assert not damaged.success
    failures = damaged.failures()
    assert failures and all(f.startswith("shop.orders: expect_table_row_count_to_equal") for f in failures)
