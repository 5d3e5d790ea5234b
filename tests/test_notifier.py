"""The webhook notifier: the URL and headers it builds from a connection, and what it POSTs to a real server.

The apply DAG's own use of it (a failed lag check posting its facts) is in
test_dag_e2e.py; here it is called as Airflow calls a failure callback, with
the connection given the way Airflow reads it from the environment.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_support import airflow_home  # noqa: F401  (the session fixture)
from webhook_support import Webhook

pytestmark = pytest.mark.airflow

RUN = {"dag_id": "applier", "task_id": "check_lag", "run_id": "manual__1", "try_number": 1, "log_url": None}


def context(error: BaseException) -> dict[str, Any]:
    """A failure callback's context: the failed task instance and its exception."""
    ti = SimpleNamespace(dag_id="applier", task_id="check_lag", run_id="manual__1", try_number=1, log_url=None)
    return {"ti": ti, "exception": error}


def lag_alert() -> Any:
    from applier_airflow.lag import LagAlert

    return LagAlert("lag alert: configuration c: …", {"text": "lag alert: configuration c: …", "lag_seconds": 90.0})


def test_the_url_is_the_connections_host_or_built_from_its_fields(airflow_home: Path) -> None:  # noqa: F811
    from applier_airflow.notifier import webhook_url

    slack = "https://hooks.slack.com/services/T0/B0/x"
    assert webhook_url("a", slack, None, None) == slack
    assert webhook_url("a", "alerts.example", None, None) == "https://alerts.example"
    assert webhook_url("a", "alerts.example", "http", 8080, "/v1/lag") == "http://alerts.example:8080/v1/lag"
    assert webhook_url("a", "http://alerts.example/", None, None, "hook") == "http://alerts.example/hook"
    with pytest.raises(ValueError, match=r"^connection a has no host: set it to the webhook's URL$"):
        webhook_url("a", None, None, None)


def test_headers_are_json_the_connections_extra_and_basic_auth(airflow_home: Path) -> None:  # noqa: F811
    from applier_airflow.notifier import webhook_headers

    assert webhook_headers({}, None, None) == {"Content-Type": "application/json"}
    assert webhook_headers({"X-Token": "t"}, "ops", "pw") == {
        "Content-Type": "application/json",
        "X-Token": "t",
        "Authorization": "Basic " + base64.b64encode(b"ops:pw").decode(),
    }


def test_a_failure_other_than_a_lag_alert_is_sent_as_its_first_line(airflow_home: Path) -> None:  # noqa: F811
    from applier_airflow.notifier import alert_payload

    payload = alert_payload(RuntimeError("checkpoint.json is damaged\nTraceback …"), RUN)
    assert payload == {
        "text": "applier.check_lag failed in run manual__1: checkpoint.json is damaged",
        "alert": "task_failed",
        "error": "checkpoint.json is damaged",
        **RUN,
    }
    assert alert_payload(lag_alert(), RUN) == {"text": "lag alert: configuration c: …", "lag_seconds": 90.0, **RUN}


def test_the_alert_is_posted_to_the_connections_webhook_with_its_headers(
    airflow_home: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from applier_airflow.notifier import ApplierWebhookNotifier

    with Webhook() as hook:
        fields = {"conn_type": "http", "host": hook.url, "login": "ops", "password": "pw", "extra": {"X-Team": "data"}}
        conn = json.dumps(fields)
        monkeypatch.setenv("AIRFLOW_CONN_LAG_HOOK", conn)
        ApplierWebhookNotifier(conn_id="lag_hook", endpoint="lag")(context(lag_alert()))
    assert hook.received == [{"text": "lag alert: configuration c: …", "lag_seconds": 90.0, **RUN}]
    assert hook.paths == ["/hooks/T0/B0/secret/lag"]
    assert hook.headers[0]["X-Team"] == "data" and hook.headers[0]["Authorization"].startswith("Basic ")


def test_a_refusing_or_missing_webhook_is_one_logged_line_without_the_urls_path(
    airflow_home: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from applier_airflow.notifier import ApplierWebhookNotifier

    with Webhook(status=500) as hook:
        monkeypatch.setenv("AIRFLOW_CONN_LAG_HOOK", hook.connection())
        ApplierWebhookNotifier(conn_id="lag_hook")(context(lag_alert()))  # does not raise: the task already failed
    assert len(hook.received) == 1
    ApplierWebhookNotifier(conn_id="undefined_hook")(context(lag_alert()))
    captured = capfd.readouterr()
    logged = captured.out + captured.err + caplog.text
    netloc = hook.url.split("/")[2]
    assert f"the webhook at {netloc} (connection lag_hook) refused the alert: HTTP 500" in logged
    assert "connection undefined_hook is not defined: the alert is in this log only" in logged
    assert "secret" not in logged
