"""The Applier view plugin, in Airflow's own API app: refused without Airflow's JWT, and its JSON told by a run's files.

A generated workload is applied for two cycles by the engine and validated;
the app is Airflow's (``airflow.api_fastapi.app.create_app``, see
``view_support``), with the project's plugins folder, so the mount path and the
authentication are the real ones. Every expected figure is read from the
files (``checkpoint.json``, ``cycles.jsonl``, ``validation.json``), not from
the view's code. The exceptions store and resubmission: ``test_applier_view_exceptions``.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_support import airflow_home  # noqa: F401  (airflow_home: session fixture)
from applier.config import Config
from engine_support import run
from view_support import api_client, draw, generated_configuration, token, with_cookie

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

ENDPOINTS = ["/applier/", "/applier/static/view.js", "/applier/static/view.css", "/applier/api/status",
             "/applier/docs/index.html"]  # fmt: skip


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> tuple[Path, Config]:
    """A configuration with two cycles applied, more pairs waiting, and its tables validated."""
    from applier.validate import validate_target

    folder, cycle = tmp_path_factory.mktemp("view"), "apply: {process_intermediate_size_per_job: 0.1}\n"
    path, config = generated_configuration(folder, "viewed", seed=5, transactions=80, settings=cycle)
    run(config, spark, max_cycles=2)
    validate_target(config, spark)
    return path, config


@pytest.fixture(scope="module")
def client(airflow_home: Path) -> Iterator[Any]:  # noqa: F811  (the imported fixture)
    yield from api_client()


@pytest.fixture
def viewer(client: Any, applied: tuple[Path, Config], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Headers of a viewer, with the DAG's configuration (``$APPLIER_CONFIG``) the applied one."""
    monkeypatch.setenv("APPLIER_CONFIG", str(applied[0]))
    return {"Authorization": f"Bearer {token('viewer')}"}


@pytest.mark.parametrize("path", ENDPOINTS)
def test_every_endpoint_refuses_a_request_without_airflow_token(client: Any, path: str) -> None:
    assert client.get(path).status_code == 401
    assert client.get(path, headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403
    assert with_cookie(client, "GET", path, "not-a-jwt").status_code == 403


@pytest.mark.parametrize("path", ENDPOINTS)
def test_every_endpoint_refuses_a_user_without_read_access_to_the_dag(client: Any, path: str) -> None:
    # The simple auth manager grants nothing to a user without a role.
    assert client.get(path, headers={"Authorization": f"Bearer {token(None)}"}).status_code == 403


def test_the_app_exposes_no_unprotected_docs(client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A configuration without a Data Docs site, whatever the checkout's own (`make demo` writes one for the default).
    (tmp_path / "in").mkdir()
    config = tmp_path / "applier.yaml"
    config.write_text(f"configuration_name: nodocs\nintermediate_dir: {tmp_path / 'in'}\n"
                      f"output_dir: {tmp_path / 'out'}\ntarget: {{path: {tmp_path / 'target'}}}\n")  # fmt: skip
    monkeypatch.setenv("APPLIER_CONFIG", str(config))
    for path in ("/applier/docs", "/applier/openapi.json", "/applier/redoc"):
        assert client.get(path, headers={"Authorization": f"Bearer {token('viewer')}"}).status_code == 404


def test_the_page_and_its_assets_are_served_with_relative_paths(client: Any, viewer: dict[str, str]) -> None:
    page = client.get("/applier/", headers=viewer)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    references = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sorted(references) == ["static/view.css", "static/view.js"]
    script = client.get("/applier/static/view.js", headers=viewer)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert 'fetch("api/status"' in script.text
    assert not re.search(r"""["'`]/(?!/)""", script.text), "an absolute path in view.js"
    assert client.get("/applier/static/view.css", headers=viewer).headers["content-type"].startswith("text/css")
    assert client.get("/applier/static/../view.py", headers=viewer).status_code == 404


def test_the_ui_cookie_is_accepted_as_the_bearer_header_is(client: Any, viewer: dict[str, str]) -> None:
    bearer = viewer["Authorization"].removeprefix("Bearer ")
    assert with_cookie(client, "GET", "/applier/api/status?cycles=1", bearer).status_code == 200


def test_status_tells_what_the_run_files_hold(
    client: Any, viewer: dict[str, str], applied: tuple[Path, Config]
) -> None:
    path, config = applied
    response = client.get("/applier/api/status?cycles=5", headers=viewer)
    assert response.status_code == 200, response.text
    doc = response.json()
    checkpoint = json.loads((config.work_dir / "checkpoint.json").read_text())
    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]

    assert doc["config_file"] == str(path)
    status = doc["status"]
    assert status["configuration"] == "viewed"
    assert {k: checkpoint[k] for k in status["checkpoint"]} == status["checkpoint"]
    pairs = sorted(int(p.name[:12]) for p in config.intermediate_dir.glob("*.trn"))
    assert status["backlog"]["pairs"] == len([s for s in pairs if s > checkpoint["applied_seq"]]) > 0
    assert status["lag"]["seconds"] is not None and status["blocked_by"] is None

    assert [c["cycle_id"] for c in doc["cycles"]] == [r["cycle_id"] for r in reports] == [1, 2]
    for cycle, report in zip(doc["cycles"], reports, strict=True):
        assert cycle["seqs"] == report["seqs"] and cycle["rows_read"] == report["rows_read"]
        assert cycle["seconds"] == report["seconds"]
        assert cycle["total_seconds"] == pytest.approx(sum(report["seconds"].values()), abs=0.002)
        assert cycle["changes_per_second"] == pytest.approx(report["rows_read"] / cycle["total_seconds"], abs=0.1)
        assert cycle["driver_peak_rss_mib"] == report.get("driver_peak_rss_mib")
    assert [c["cycle_id"] for c in client.get("/applier/api/status?cycles=1", headers=viewer).json()["cycles"]] == [2]

    (results,) = (config.work_dir / "validation").glob("*/validation.json")
    validation = json.loads(results.read_text())
    assert sorted(doc["validation"]) == sorted(validation["tables"]) == sorted(checkpoint["row_counts"])
    for name, shown in doc["validation"].items():
        table = validation["tables"][name]
        assert shown["success"] is table["success"] is True
        assert shown["expectations"] == len(table["expectations"]) > 0 and shown["failed"] == 0
        assert shown["cycle_id"] == validation["cycle_id"] == checkpoint["cycle_id"]
        assert shown["results_name"] == results.parent.name
        assert "gx_result" not in shown

    # No error action set anything aside: the exceptions store is empty (it does not exist yet).
    assert doc["exceptions"] == {"error": None, "open": 0, "resubmitted": 0, "total": 0, "records": []}
    assert status["set_aside"] == {}


def test_each_table_links_its_data_docs_page_which_the_view_serves_and_nothing_beside(
    client: Any, viewer: dict[str, str], applied: tuple[Path, Config]
) -> None:
    _, config = applied
    site = config.work_dir / "validation" / "data_docs"
    doc = client.get("/applier/api/status", headers=viewer).json()
    for name, shown in doc["validation"].items():
        url = shown["data_docs_url"]
        assert url.startswith("docs/validations/") and Path(shown["data_docs_page"]) == site / url[len("docs/") :]
        page = client.get(f"/applier/{url}", headers=viewer)
        assert page.status_code == 200 and name in page.text, name
    index = client.get("/applier/docs/index.html", headers=viewer)
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert client.get("/applier/docs/vendor/jquery-3.7.1/jquery.min.js", headers=viewer).status_code == 200  # offline
    checkpoint = (config.work_dir / "checkpoint.json").read_text()
    for outside in ("..%2Fcheckpoint.json", "..%2F..%2F..%2F" + "viewed%2Fcheckpoint.json", "nowhere.html"):
        response = client.get(f"/applier/docs/{outside}", headers=viewer)  # the route sees the decoded ..
        assert response.status_code == 404 and checkpoint not in response.text, outside


def test_status_refuses_an_out_of_range_count_of_cycles_or_exceptions(client: Any, viewer: dict[str, str]) -> None:
    assert client.get("/applier/api/status?cycles=0", headers=viewer).status_code == 422
    assert client.get("/applier/api/status?exceptions=501", headers=viewer).status_code == 422


def test_a_configuration_that_does_not_load_is_one_line_of_json(
    client: Any, viewer: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APPLIER_CONFIG", str(tmp_path / "missing.yaml"))
    response = client.get("/applier/api/status", headers=viewer)
    assert response.status_code == 500
    assert "missing.yaml" in response.json()["error"] and "\n" not in response.json()["error"]


def test_the_plugin_puts_the_view_in_airflow_navigation(client: Any) -> None:
    admin = {"Authorization": f"Bearer {token('admin')}"}
    plugins = client.get("/api/v2/plugins", headers=admin).json()["plugins"]
    (plugin,) = [p for p in plugins if p["name"] == "applier_view"]
    assert [(a["url_prefix"], a["name"]) for a in plugin["fastapi_apps"]] == [("/applier", "Applier view")]
    (view,) = plugin["external_views"]
    assert (view["name"], view["href"], view["url_route"], view["destination"]) == (
        "Applier",
        "applier/",
        "applier",
        "nav",
    )


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_the_script_draws_the_status_without_an_error(
    client: Any, viewer: dict[str, str], applied: tuple[Path, Config], tmp_path: Path
) -> None:
    # Not a browser: the page's script under Node with a minimal DOM, fed what api/status answers.
    drawn = draw(tmp_path, client.get("/applier/api/status", headers=viewer).text)
    assert drawn["error"] is None and drawn["shown"] is True, drawn
    checkpoint = json.loads((applied[1].work_dir / "checkpoint.json").read_text())
    cp = f"applied pair {checkpoint['applied_seq']} (commit LSN {checkpoint['applied_commit_lsn']})"
    assert cp in drawn["text"]
    assert "viewed" in drawn["text"] and "passed" in drawn["text"] and "nothing blocks" in drawn["text"]
    assert "exceptions-summary: 0 open , 0 resubmitted · set aside in the last 2 cycles: none" in drawn["text"]
    assert "exceptions: none" in drawn["text"] and drawn["buttons"] == []
