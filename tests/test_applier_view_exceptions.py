"""The Applier view's exceptions: the store as the target lists it, and a resubmission only an editor may make.

A real run sets transactions aside: on Delta, a CHECK constraint added after
the first pair refuses two transactions of the second, and
``errors.actions.check: log`` keeps them in the store (as
``test_delta_resubmit`` does); on PostgreSQL, the same with a constraint the
table had from the start. The view is Airflow's own API app
(``view_support``); what it lists is compared with what the target's store
holds, read apart from the view, and a resubmission is checked in the
target table's rows. The Delta tests share one store and run in order: the
refusals first, which change nothing, then the resubmission.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from airflow_support import airflow_home  # noqa: F401  (airflow_home: session fixture)
from applier.config import Config, load_config
from applier.engine.runlock import RunLock
from applier.targets import open_target
from engine_support import run
from view_support import SECOND, api_client, bearer, draw, with_cookie, write_items

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

RESUBMIT = "/applier/api/exceptions/{}/resubmit"


def settings(folder: Path, name: str, target: str) -> Path:
    """A configuration file whose check errors set the transaction aside (``log``)."""
    path = folder / f"{name}.yaml"
    path.write_text(
        f"configuration_name: {name}\nintermediate_dir: {folder / 'pairs'}\noutput_dir: {folder / 'out'}\n"
        f"target: {target}\nerrors: {{actions: {{check: log}}}}\n"
    )
    return path


def delta_items(config: Config) -> dict[int, int]:
    """``shop.items`` as id -> qty, read with delta-rs (not through the target)."""
    rows = DeltaTable(str(config.target.path / "shop" / "items")).to_pyarrow_table().to_pylist()
    return {r["id"]: r["qty"] for r in rows}


@pytest.fixture(scope="module")
def delta(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> tuple[Path, Config]:
    """A Delta configuration whose second run set x2 and x4 aside (exceptions 1 and 2)."""
    folder = tmp_path_factory.mktemp("excepted")
    path = settings(folder, "excepted", f"{{type: delta, path: {folder / 'target'}}}")
    config = load_config(path)
    write_items(config.intermediate_dir, 1, {"x0": [(1, 1)]})
    run(config, spark)
    DeltaTable(str(config.target.path / "shop" / "items")).alter.add_constraint({"qty_not_negative": "qty >= 0"})
    write_items(config.intermediate_dir, 2, SECOND)
    run(config, spark)
    assert delta_items(config) == {1: 1, 2: 2, 5: 5}
    return path, config


@pytest.fixture(scope="module")
def client(airflow_home: Path) -> Iterator[Any]:  # noqa: F811  (the imported fixture)
    yield from api_client()


@pytest.fixture
def on_delta(delta: tuple[Path, Config], monkeypatch: pytest.MonkeyPatch) -> Config:
    """The ``applier`` DAG's configuration (``$APPLIER_CONFIG``) is the Delta one."""
    monkeypatch.setenv("APPLIER_CONFIG", str(delta[0]))
    return delta[1]


def store(config: Config) -> list[dict[str, Any]]:
    """The exceptions store's records, id order, as the target lists them (``applier exceptions list``)."""
    target = open_target(config)
    try:
        return target.exceptions()
    finally:
        target.close()


def assert_lists_the_store(shown: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """The view's section tells ``records`` (as ``Target.exceptions()`` returns them), newest first."""
    assert shown["error"] is None and shown["total"] == len(records)
    assert shown["resubmitted"] == len([r for r in records if r["resubmitted_at"] is not None])
    assert shown["open"] == len(records) - shown["resubmitted"]
    assert [r["id"] for r in shown["records"]] == [r["id"] for r in reversed(records)]
    for listed, record in zip(shown["records"], reversed(records), strict=True):
        same = ("id", "cycle_id", "xid", "commit_lsn", "pair_seq", "table_name", "error_class", "sqlstate", "action")
        assert {k: listed[k] for k in same} == {k: record[k] for k in same}
        assert listed["changes"] == record["changes"] and listed["logged_at"] == record["logged_at"].isoformat()
        assert listed["resubmitted_at"] == (record["resubmitted_at"] and record["resubmitted_at"].isoformat())
        line = " ".join(record["message"].split())  # one line, cut (with …) when long
        assert line.startswith(listed["message"].removesuffix("…")) and len(listed["message"]) <= 300
        assert "changes_list" not in listed


def test_the_view_lists_the_exceptions_store_as_the_target_holds_it_and_as_status_counts_it(
    client: Any, on_delta: Config
) -> None:
    doc = client.get("/applier/api/status", headers=bearer("viewer")).json()
    records = store(on_delta)
    assert [(r["xid"], r["changes"], r["error_class"], r["action"]) for r in records] == [
        ("x2", 2, "check", "log"),
        ("x4", 1, "check", "log"),
    ]
    assert_lists_the_store(doc["exceptions"], records)
    assert doc["exceptions"]["records"][0]["pair_seq"] == 2 and "qty_not_negative" in records[0]["message"]
    # applier status counts what the cycles' reports set aside: every record of the store, here.
    assert sum(doc["status"]["set_aside"].values()) == doc["exceptions"]["total"] == 2
    # Bounded: the newest first.
    shown = client.get("/applier/api/status?exceptions=1", headers=bearer("viewer")).json()["exceptions"]
    assert [r["id"] for r in shown["records"]] == [records[-1]["id"]] and shown["total"] == 2


def test_resubmitting_is_refused_without_a_token_and_to_a_viewer(client: Any, on_delta: Config) -> None:
    url = RESUBMIT.format(store(on_delta)[0]["id"])
    assert client.post(url).status_code == 401
    assert client.post(url, headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403
    assert client.post(url, headers=bearer(None)).status_code == 403
    refused = client.post(url, headers=bearer("viewer"))
    assert refused.status_code == 403 and refused.json()["detail"] == "Forbidden"
    assert [r["resubmitted_at"] for r in store(on_delta)] == [None, None]


def test_a_cookie_alone_resubmits_only_from_this_airflow_pages(client: Any, on_delta: Config) -> None:
    # The constraint still refuses the transaction, so a request let through answers 422 and changes nothing.
    url, cookie = RESUBMIT.format(store(on_delta)[0]["id"]), bearer("op")["Authorization"].removeprefix("Bearer ")
    for headers in ({}, {"Origin": "https://elsewhere.example"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site", "Origin": "http://testserver"}):  # fmt: skip
        refused = with_cookie(client, "POST", url, cookie, headers)
        assert refused.status_code == 403 and "cookie" in refused.json()["detail"], headers
    for headers in ({"Sec-Fetch-Site": "same-origin"}, {"Origin": "http://testserver"}):
        assert with_cookie(client, "POST", url, cookie, headers).status_code == 422, headers
    assert [r["resubmitted_at"] for r in store(on_delta)] == [None, None]


def test_an_operator_resubmits_once_and_every_refusal_is_one_line(
    client: Any, on_delta: Config, tmp_path: Path
) -> None:
    first, second = store(on_delta)
    url, op = RESUBMIT.format(first["id"]), bearer("op")

    # Refused again: the constraint still holds; nothing changes.
    refused = client.post(url, headers=op)
    assert refused.status_code == 422 and "qty_not_negative" in refused.json()["error"]
    assert client.post(RESUBMIT.format(99), headers=op).json() == {
        "error": "ExceptionNotFoundError: no exception 99 in configuration excepted"
    }
    assert client.post(RESUBMIT.format(99), headers=op).status_code == 404
    DeltaTable(str(on_delta.target.path / "shop" / "items")).alter.drop_constraint("qty_not_negative")
    with RunLock(on_delta.work_dir, on_delta.configuration_name):  # a run under way
        locked = client.post(url, headers=op)
    assert locked.status_code == 423 and locked.json()["error"].startswith("RunLockedError: ")
    assert delta_items(on_delta) == {1: 1, 2: 2, 5: 5} and store(on_delta)[0]["resubmitted_at"] is None

    before = client.get("/applier/api/status", headers=op).text
    done = client.post(url, headers=op)  # the user role may too: Airflow grants it edit access to DAGs
    assert done.status_code == 200, done.text
    assert done.json() == {"id": first["id"], "message": f"exception {first['id']}: transaction x2 applied "
                           "(2 changes to shop.items)"}  # fmt: skip
    assert delta_items(on_delta) == {1: 1, 2: 2, 3: -1, 4: 4, 5: 5}
    after = client.get("/applier/api/status", headers=op).json()
    records = store(on_delta)
    assert records[0]["resubmitted_at"] is not None and records[1]["resubmitted_at"] is None
    assert_lists_the_store(after["exceptions"], records)
    assert (after["exceptions"]["open"], after["exceptions"]["resubmitted"]) == (1, 1)

    again = client.post(url, headers=bearer("user"))
    assert again.status_code == 409 and "\n" not in again.json()["error"]
    assert again.json()["error"].startswith(f"ExceptionResubmittedError: exception {first['id']} was resubmitted at")
    assert delta_items(on_delta) == {1: 1, 2: 2, 3: -1, 4: 4, 5: 5}

    # The page, fed these real answers: it draws both open exceptions with a button each (newest first);
    # clicking x2's posts to its relative URL after a confirm, shows the answer in one line and redraws.
    drawn = draw(tmp_path, before, (first["id"], done.text, 200, json.dumps(after)))
    assert drawn["error"] is None and drawn["shown"] is True, drawn
    assert drawn["buttons"] == [str(second["id"]), str(first["id"])]
    assert "exceptions-summary: 2 open , 0 resubmitted · set aside in the last 2 cycles: 2 log" in drawn["text"]
    assert "x4" in drawn["text"] and "qty_not_negative" in drawn["text"]
    assert drawn["posted"] == [f"api/exceptions/{first['id']}/resubmit"]
    assert drawn["confirms"] == [
        f"Resubmit exception {first['id']}: apply transaction x2 (2 changes, table shop.items) to the target now?"
    ]
    assert drawn["result"] == done.json()["message"] and drawn["error_after"] is None
    assert drawn["buttons_after"] == [str(second["id"])]
    assert "exceptions-summary: 1 open , 1 resubmitted" in drawn["text_after"]
    # A page drawn before someone else resubmitted x2: the refusal is the result line; the redraw shows it done.
    stale = draw(tmp_path, before, (first["id"], again.text, again.status_code, json.dumps(after)))
    assert stale["result"] == f"exception {first['id']} not resubmitted: {again.json()['error']}"
    assert stale["buttons_after"] == [str(second["id"])]


@pytest.mark.postgres
def test_on_postgresql_the_view_lists_the_store_and_resubmits_into_the_table(
    client: Any, spark: Any, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute("CREATE SCHEMA shop")
        conn.execute("CREATE TABLE shop.items (id bigint PRIMARY KEY, qty integer CONSTRAINT qty_ok CHECK (qty >= 0))")
    path = settings(tmp_path, "excepted_pg", json.dumps({"type": "postgres", "url": pg_url}))
    config = load_config(path)
    write_items(config.intermediate_dir, 1, SECOND)
    run(config, spark)
    monkeypatch.setenv("APPLIER_CONFIG", str(path))
    with psycopg.connect(pg_url) as conn:
        kept = conn.execute("SELECT id, xid, sqlstate FROM applier_exceptions ORDER BY id").fetchall()
    assert [k[1:] for k in kept] == [("x2", "23514"), ("x4", "23514")]

    doc = client.get("/applier/api/status", headers=bearer("viewer")).json()
    assert_lists_the_store(doc["exceptions"], store(config))
    assert [r["id"] for r in doc["exceptions"]["records"]] == [kept[1][0], kept[0][0]]

    with psycopg.connect(pg_url) as conn:
        conn.execute("ALTER TABLE shop.items DROP CONSTRAINT qty_ok")
    done = client.post(RESUBMIT.format(kept[1][0]), headers=bearer("op"))
    assert done.status_code == 200 and "transaction x4 applied (1 changes to shop.items)" in done.json()["message"]
    assert client.post(RESUBMIT.format(kept[1][0]), headers=bearer("op")).status_code == 409
    with psycopg.connect(pg_url) as conn:
        assert dict(conn.execute("SELECT id, qty FROM shop.items").fetchall()) == {2: 2, 5: 5, 6: -2}
        assert conn.execute("SELECT xid FROM applier_exceptions WHERE resubmitted_at IS NOT NULL").fetchall() == [
            ("x4",)
        ]
    shown = client.get("/applier/api/status", headers=bearer("viewer")).json()["exceptions"]
    assert (shown["open"], shown["resubmitted"]) == (1, 1)


def test_a_store_the_view_cannot_reach_is_one_line_and_the_rest_still_shows(
    client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pairs").mkdir()
    down = "host=127.0.0.1 port=1 user=postgres dbname=nowhere connect_timeout=5"  # nothing listens on port 1
    path = settings(tmp_path, "unreachable", json.dumps({"type": "postgres", "url": down}))
    monkeypatch.setenv("APPLIER_CONFIG", str(path))
    response = client.get("/applier/api/status", headers=bearer("viewer"))
    assert response.status_code == 200 and response.json()["status"]["configuration"] == "unreachable"
    shown = response.json()["exceptions"]
    assert shown["error"].startswith("TargetError: ") and "\n" not in shown["error"]
    assert (shown["open"], shown["resubmitted"], shown["records"]) == (None, None, [])
    # Resubmitting cannot reach it either: a transient error, so 503 (try again), in one line.
    refused = client.post(RESUBMIT.format(1), headers=bearer("op"))
    assert refused.status_code == 503 and refused.json()["error"].startswith("TargetError: ")


def test_a_record_is_listed_with_its_message_on_one_line_and_cut_when_long() -> None:
    from applier.view_document import exceptions_summary

    logged = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
    record = {"id": 7, "cycle_id": 3, "xid": "x9", "commit_lsn": 900, "pair_seq": 4, "table_name": "shop.items",
              "error_class": "check", "sqlstate": "23514", "action": "log", "changes": 12, "logged_at": logged,
              "resubmitted_at": None, "message": "new row violates\n  check constraint " + "x" * 400}  # fmt: skip
    (listed,) = exceptions_summary([record], 5)["records"]
    assert listed == {
        "id": 7, "cycle_id": 3, "xid": "x9", "commit_lsn": 900, "pair_seq": 4, "table_name": "shop.items",
        "error_class": "check", "sqlstate": "23514", "action": "log", "changes": 12,
        "logged_at": "2026-11-21T10:00:00+00:00", "resubmitted_at": None,
        "message": ("new row violates check constraint " + "x" * 400)[:299] + "…",
    }  # fmt: skip
