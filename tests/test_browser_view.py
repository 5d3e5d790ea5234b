"""The Applier view and the trigger form in a real browser (Debian's Chromium, Playwright) against `airflow standalone`.

One ``airflow standalone`` (``airflow_server.running_airflow``, on loopback,
the project's DAGs and plugins, ``APPLIER_CONFIG`` a generated workload on a
Delta target, no schedule) serves the module. The browser logs in through
Airflow's login page as a user does, triggers the ``applier`` DAG through its
trigger form, and opens the Applier entry of the navigation. Every figure the
page shows is checked against the configuration's files (``checkpoint.json``,
``cycles.jsonl``, the pairs, ``validation.json``), not against the view's code.
Requests that leave loopback are refused and recorded: the page and its Data
Docs work offline. ``APPLIER_SCREENSHOT=docs/applier-view.png`` keeps the
screenshot of the page (docs/ holds one made that way).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from deltalake import DeltaTable

from airflow_server import AirflowServer, running_airflow
from applier.config import Config, load_config
from applier.targets import open_target
from engine_support import run
from view_support import SECOND, generated_configuration, write_items

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"  # Debian's package; `make setup` installs it
# As root, in a closed network: no sandbox, and none of Chromium's own background connections.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MIB = 1024 * 1024
TYPED = {"max_cycles": "2", "process_intermediate_size_per_job": "0.05"}  # what the user types in the form
EXPECTED_CONF = {
    "max_cycles": 2,
    "process_intermediate_size_per_job": 0.05,
    "buffer_size_for_split_records": None,
    "plan_only": False,
    "skip_validation": False,
}


@dataclass
class Watched:
    """What a page did that a user would not see: console errors, uncaught exceptions, requests refused or failed."""

    errors: list[str] = field(default_factory=list)
    offline: list[str] = field(default_factory=list)

    def attach(self, page: Any) -> None:
        page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        page.on("requestfailed", self._failed)
        page.on("response", lambda r: self.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)

    def _failed(self, request: Any) -> None:
        if request.failure != "net::ERR_ABORTED":  # a load the next navigation cancelled, not a failure
            self.errors.append(f"request failed: {request.url} {request.failure}")


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Config]:
    """A configuration over a generated workload of more pairs than two cycles of 0.05 MiB take."""
    return generated_configuration(tmp_path_factory.mktemp("browser"), "browsed", seed=7, transactions=120)


@pytest.fixture(scope="module")
def airflow(workload: tuple[Path, Config], tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    home = tmp_path_factory.mktemp("airflow-standalone")
    with running_airflow(home, standalone=True, APPLIER_CONFIG=str(workload[0]), APPLIER_SCHEDULE="none") as server:
        server.wait_for_dag("applier")
        server.set_paused("applier", False)  # as the form's "unpause on trigger" does, before the form is used
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM), f"{CHROMIUM} is missing: `make setup` installs Debian's chromium"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def open_page(browser: Any, airflow: AirflowServer) -> tuple[Any, list[str]]:
    """A page in a new browser context whose requests may only go to the Airflow on loopback, and those refused."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, base_url=airflow.url)
    loopback = urlsplit(airflow.url).netloc
    offline: list[str] = []

    def route(r: Any) -> None:
        if urlsplit(r.request.url).netloc == loopback or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            offline.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    return context.new_page(), offline


def log_in(page: Any, airflow: AirflowServer) -> None:
    """Airflow's login page, as a user fills it in."""
    page.goto("/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", airflow.password)
    page.click("button[type=submit]")
    page.wait_for_url(airflow.url + "/")


@pytest.fixture
def page(browser: Any, airflow: AirflowServer) -> Iterator[tuple[Any, Watched]]:
    """A logged-in page, watched from the login on."""
    tab, offline = open_page(browser, airflow)
    log_in(tab, airflow)
    watched = Watched(offline=offline)
    watched.attach(tab)
    yield tab, watched
    tab.context.close()


def trigger_form(page: Any) -> Any:
    """The ``applier`` DAG's trigger dialog, open."""
    page.goto("/dags/applier")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.locator("[name=element_max_cycles]").wait_for()
    return dialog


def fill(dialog: Any, values: dict[str, str]) -> None:
    for name, text in values.items():
        dialog.locator(f"[name=element_{name}]").fill(text)


@pytest.fixture(scope="module")
def triggered(browser: Any, airflow: AirflowServer) -> dict[str, Any]:
    """The run the trigger form made with ``TYPED``, once it finished."""
    tab, _ = open_page(browser, airflow)
    try:
        log_in(tab, airflow)
        dialog = trigger_form(tab)
        fill(dialog, TYPED)
        created = submit(tab, dialog)
    finally:
        tab.context.close()
    return airflow.wait_for_run("applier", created["dag_run_id"])


def submit(tab: Any, dialog: Any, attempts: int = 2) -> dict[str, Any]:
    """Click the form's Trigger and wait for the API's answer to the request it sends: the run created.

    Waiting for the request itself, not for a run to appear in the list, says
    what went wrong when no run comes. The standalone server keeps its
    metadata in SQLite, which refuses a write while another holds it ("database
    is locked", a 5xx): the user clicks again, and so does this, once.
    """
    posted = []

    def creates_run(r: Any) -> bool:
        return r.request.method == "POST" and r.url.endswith("/dagRuns")  # type: ignore[no-any-return]

    for _ in range(attempts):
        with tab.expect_response(creates_run, timeout=60_000) as answer:
            dialog.get_by_role("button", name="Trigger").click()
        response = answer.value
        posted.append(f"{response.status} {response.text()[:300]}")
        if response.status < 500:
            break
    assert response.ok, f"the trigger form's request was refused: {posted}"
    return response.json()  # type: ignore[no-any-return]


def test_the_trigger_form_passes_the_typed_values_to_the_run(triggered: dict[str, Any]) -> None:
    assert triggered["conf"] == EXPECTED_CONF


def test_the_trigger_form_refuses_what_it_cannot_take_and_changes_nothing(
    page: tuple[Any, Watched], airflow: AirflowServer
) -> None:
    tab, _ = page
    runs = len(airflow.dag_runs("applier"))
    dialog = trigger_form(tab)
    # Not a number: the form says so and will not trigger (Airflow's number field blanked it: the default ran).
    fill(dialog, {"process_intermediate_size_per_job": "abc"})
    assert dialog.get_by_text("Value must be one of").is_visible()
    assert dialog.get_by_role("button", name="Trigger").is_disabled()
    # Below the minimum: kept as typed and refused by the API (Airflow's number field made -5 into 1).
    fill(dialog, {"process_intermediate_size_per_job": "", "buffer_size_for_split_records": "-5"})
    dialog.get_by_role("button", name="Trigger").click()
    tab.get_by_text("Failed to Trigger").first.wait_for()
    assert dialog.locator("[name=element_buffer_size_for_split_records]").input_value() == "-5"
    # Written as 1e3: the form keeps the number (it blanked it), and shows it as the run will get it.
    fill(dialog, {"buffer_size_for_split_records": "", "max_cycles": "1e3"})
    dialog.locator("[name=element_plan_only]").focus()
    assert dialog.locator("[name=element_max_cycles]").input_value() == "1000"
    assert len(airflow.dag_runs("applier")) == runs


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def definitions(dl: Any) -> dict[str, str]:
    """A ``<dl>`` of the page as {term: description}."""
    pairs = "dl => [...dl.querySelectorAll('dt')].map(dt => [dt.textContent, dt.nextElementSibling.textContent])"
    return dict(dl.evaluate(pairs))


def rows(table: Any) -> list[dict[str, str]]:
    """A ``<table>`` of the page as one {header: cell text} per row."""
    return list(
        table.evaluate("""t => {
        const heads = [...t.tHead.rows[0].cells].map(c => c.textContent);
        const cells = (r) => [...r.cells].map((c, i) => [heads[i], c.textContent]);
        return [...t.tBodies[0].rows].map(r => Object.fromEntries(cells(r)));
    }""")
    )


def test_the_applier_view_shows_what_the_run_files_hold(
    page: tuple[Any, Watched], triggered: dict[str, Any], workload: tuple[Path, Config]
) -> None:
    tab, watched = page
    config = workload[1]
    tab.get_by_test_id("nav-sidebar").get_by_role("link", name="Applier").click()
    view = tab.frame_locator("iframe").first  # Airflow shows the plugin's page in a frame
    view.locator("#view:not([hidden])").wait_for()

    checkpoint = read_json(config.work_dir / "checkpoint.json")
    assert checkpoint["cycle_id"] == 2  # the form's max_cycles
    positions = definitions(view.locator("#positions"))
    assert positions["applied pair"] == f"{checkpoint['applied_seq']} (commit LSN {checkpoint['applied_commit_lsn']})"
    assert positions["restart pair"] == str(checkpoint["restart_seq"])
    assert positions["cycles"].startswith(f"{checkpoint['cycle_id']}, last committed ")
    waiting = [p for p in sorted(config.intermediate_dir.glob("*.trn")) if int(p.name[:12]) > checkpoint["applied_seq"]]
    size = sum(p.stat().st_size + p.with_suffix(".dat").stat().st_size for p in waiting)
    assert waiting, "the workload is meant to leave pairs waiting"
    assert positions["backlog"] == f"{len(waiting)} pairs, {size / MIB:.2f} MiB"
    reports = [json.loads(line) for line in (config.work_dir / "cycles.jsonl").read_text().splitlines()]
    assert positions["changes read"].startswith(f"{sum(r['rows_read'] for r in reports)} (by the cycles")
    shown = rows(view.locator("#cycles table"))
    newest_first = [(str(c["cycle_id"]), str(c["rows_read"])) for c in reversed(reports)]
    assert [(r["cycle"], r["changes"]) for r in shown] == newest_first
    # The charts: changes/s and driver memory a point a cycle, seconds per phase a bar a phase a cycle.
    phases = {p for c in reports for p in c["seconds"]}
    assert view.locator("#charts svg").count() == 3
    assert view.locator("#charts circle").count() == 2 * len(reports)
    assert view.locator("#charts rect.phase").count() == len(reports) * len(phases)

    (results,) = (config.work_dir / "validation").glob("*/validation.json")
    validation = read_json(results)["tables"]
    tables = rows(view.locator("#validation table"))
    assert sorted(r["table"] for r in tables) == sorted(validation)
    for row in tables:
        table = validation[row["table"]]
        assert (row["outcome"], row["expectations"], row["failed"]) == ("passed", str(len(table["expectations"])), "0")
    assert view.locator("#problems").inner_text().startswith("nothing blocks")

    keep = os.environ.get("APPLIER_SCREENSHOT")
    tab.set_viewport_size({"width": 1400, "height": 1700})  # the frame scrolls on its own: show it whole
    tab.screenshot(path=keep or str(config.work_dir / "applier-view.png"))
    assert watched.errors == [] and watched.offline == []


def test_the_validate_task_log_shows_progress_a_table_at_a_time_and_no_error(
    triggered: dict[str, Any], airflow: AirflowServer, workload: tuple[Path, Config]
) -> None:
    text = airflow.task_log("applier", triggered["dag_run_id"], "validate", chars=10**7)
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert lines, text[-2000:]
    assert [e for e in lines if e.get("level") in ("error", "critical")] == []
    (results,) = (workload[1].work_dir / "validation").glob("*/validation.json")
    tables = read_json(results)["tables"]
    progress = [e["event"] for e in lines if str(e.get("event", "")).startswith("validated table ")]
    expected = [f"validated table {i}/{len(tables)} {t}" for i, t in enumerate(tables, 1)]
    assert [p.split(":")[0] for p in progress] == expected


def test_a_table_data_docs_page_opens_offline_from_the_view(
    page: tuple[Any, Watched], triggered: dict[str, Any], airflow: AirflowServer
) -> None:
    tab, watched = page
    tab.goto("/applier/")
    tab.locator("#validation a").first.wait_for()
    name = tab.locator("#validation tbody tr").first.locator("td").first.inner_text()
    with tab.context.expect_page() as opened:
        tab.locator("#validation a").first.click()
    docs = opened.value
    watched.attach(docs)
    docs.wait_for_load_state("networkidle")
    assert name in docs.content()
    # The site's own styles, served by the view from the vendored assets (Bootstrap makes its navbar sticky).
    assert docs.evaluate("[...document.styleSheets].some(s => (s.href || '').includes('/vendor/bootstrap'))")
    assert docs.evaluate("getComputedStyle(document.querySelector('nav')).position") == "sticky"
    assert watched.errors == [] and watched.offline == []


def test_the_view_refuses_a_browser_that_has_not_logged_in(browser: Any, airflow: AirflowServer) -> None:
    tab, _ = open_page(browser, airflow)
    try:
        for path in ("/applier/", "/applier/api/status", "/applier/static/view.js"):
            assert tab.goto(path).status == 401, path
    finally:
        tab.context.close()


@pytest.fixture
def excepted(tmp_path: Path, spark: Any, airflow: AirflowServer) -> Iterator[Config]:
    """The DAG's configuration (Variable ``applier_config``) for the test: a run that set x2 and x4 aside.

    A CHECK constraint added after pair 1 refuses them (``errors.actions.check: log``); it is dropped
    again, so that a resubmission applies. The Variable is removed at the end.
    """
    path = tmp_path / "excepted.yaml"
    path.write_text(
        f"configuration_name: excepted\nintermediate_dir: {tmp_path / 'pairs'}\noutput_dir: {tmp_path / 'out'}\n"
        f"target: {{path: {tmp_path / 'target'}}}\nerrors: {{actions: {{check: log}}}}\n"
    )
    config = load_config(path)
    write_items(config.intermediate_dir, 1, {"x0": [(1, 1)]})
    run(config, spark)
    items = DeltaTable(str(config.target.path / "shop" / "items"))
    items.alter.add_constraint({"qty_not_negative": "qty >= 0"})
    write_items(config.intermediate_dir, 2, SECOND)
    run(config, spark)
    DeltaTable(str(config.target.path / "shop" / "items")).alter.drop_constraint("qty_not_negative")
    airflow.set_variable("applier_config", str(path))
    try:
        yield config
    finally:
        airflow.delete_variable("applier_config")


def test_an_exception_is_resubmitted_from_the_page_with_the_login_cookie_alone(
    page: tuple[Any, Watched], excepted: Config
) -> None:
    # The page posts with the browser's cookie and its Sec-Fetch-Site header, as a user's click does.
    tab, watched = page
    target = open_target(excepted)
    try:
        records = target.exceptions()
    finally:
        target.close()
    assert [r["xid"] for r in records] == ["x2", "x4"]
    tab.goto("/applier/")
    shown = rows(tab.locator("#exceptions table"))
    assert [(r["id"], r["transaction"], r["resubmitted"]) for r in shown] == [
        (str(r["id"]), r["xid"], "Resubmit") for r in reversed(records)
    ]
    questions: list[str] = []
    tab.on("dialog", lambda d: (questions.append(d.message), d.accept()))
    x2 = records[0]["id"]
    tab.locator(f"button.resubmit[data-exception-id='{x2}']").click()
    tab.locator("#resubmit-result:not([hidden])").wait_for()
    tab.locator(f"button.resubmit[data-exception-id='{x2}']").wait_for(state="detached")
    assert len(questions) == 1 and "x2" in questions[0]
    assert f"exception {x2}" in tab.locator("#resubmit-result").inner_text()
    rows_now = DeltaTable(str(excepted.target.path / "shop" / "items")).to_pyarrow_table().to_pylist()
    assert {r["id"]: r["qty"] for r in rows_now} == {1: 1, 2: 2, 5: 5, 3: -1, 4: 4}  # x2 applied, x4 still aside
    assert tab.locator("button.resubmit").count() == 1
    assert watched.errors == [] and watched.offline == []
