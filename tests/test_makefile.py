"""The Makefile's `make airflow`: one setting moves Airflow's port, and the tasks' execution API follows it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _standalone(*args: str) -> dict[str, str]:
    """The environment `make airflow` starts `airflow standalone` with (a dry run: nothing starts)."""
    done = subprocess.run(["make", "-n", "airflow", *args], cwd=REPO, capture_output=True, text=True, check=True)
    command = done.stdout.replace("\\\n", " ")
    line = next(line for line in command.splitlines() if "airflow standalone" in line)
    return dict(re.findall(r"(AIRFLOW__API__[A-Z_]+)=(\S+)", line))


def test_the_port_and_the_base_url_move_together() -> None:
    assert _standalone() == {"AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": "8080",
                             "AIRFLOW__API__BASE_URL": "http://localhost:8080"}  # fmt: skip
    moved = _standalone("AIRFLOW_PORT=8090")
    assert moved["AIRFLOW__API__PORT"] == "8090" and moved["AIRFLOW__API__BASE_URL"] == "http://localhost:8090"
