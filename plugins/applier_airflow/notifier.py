"""A notifier that logs a task's failure and POSTs it as JSON to a webhook: where the lag alert goes.

:class:`ApplierWebhookNotifier` is an Airflow ``BaseNotifier``, used as a
task's ``on_failure_callback``. It sends the lag check's facts (configuration,
lag, threshold, oldest unapplied pair and commit, what blocks) when the task
failed with :class:`applier_airflow.lag.LagAlert`, and the error's line for
any other failure, plus the DAG run and the task log's URL. The JSON has a
top-level ``text``, so Slack, Mattermost and Microsoft Teams incoming webhooks
show the line as it is; anything else reads the fields.

The webhook is an Airflow connection (``applier_alert`` by default), not a
configuration key: its URL usually holds a token, and connections keep
secrets out of files in git. Without that connection the alert is in the task
log only. The URL, the headers and basic authentication are read from the
connection as the HTTP provider's ``HttpHook`` reads them, so the same
connection serves its ``HttpNotifier`` too.

The standard library posts the request: no dependency beyond Airflow's.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook, BaseNotifier, Context
from airflow.sdk.exceptions import AirflowNotFoundException

from applier_airflow.lag import LagAlert

ALERT_CONN_ID = "applier_alert"


def webhook_url(conn_id: str, host: str | None, schema: str | None, port: int | None, endpoint: str = "") -> str:
    """The URL to POST to, from an HTTP connection's fields, as ``HttpHook`` builds it.

    ``host`` may be the whole URL (``https://hooks.slack.com/services/…``);
    else it is a host name, ``schema`` the scheme (``https`` when empty) and
    ``port`` its port. ``endpoint`` is appended after a ``/``.

    Raises:
        ValueError: the connection has no host.
    """
    if not host:
        raise ValueError(f"connection {conn_id} has no host: set it to the webhook's URL")
    base = host if "://" in host else f"{schema or 'https'}://{host}" + (f":{port}" if port else "")
    if not endpoint:
        return base
    return f"{base.rstrip('/')}/{endpoint.lstrip('/')}"


def webhook_headers(extra: Mapping[str, Any], login: str | None, password: str | None) -> dict[str, str]:
    """The request's headers: JSON, the connection's extra (as ``HttpHook`` reads it), basic auth with a login."""
    headers = {"Content-Type": "application/json", **{str(k): str(v) for k, v in extra.items()}}
    if login:
        token = base64.b64encode(f"{login}:{password or ''}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    return headers


def alert_payload(error: BaseException | str | None, run: Mapping[str, Any]) -> dict[str, Any]:
    """What is sent: a lag alert's facts, or a failure's one line, with the run's identity (``run``) after them.

    Args:
        error: the exception the task failed with (the callback context's ``exception``).
        run: ``dag_id``, ``task_id``, ``run_id``, ``try_number``, ``log_url`` of the failed task.
    """
    if isinstance(error, LagAlert):
        facts = dict(error.payload)
    else:
        message = (str(error) if error is not None else "no error recorded").strip().splitlines() or [""]
        text = f"{run.get('dag_id')}.{run.get('task_id')} failed in run {run.get('run_id')}: {message[0]}"
        facts = {"text": text, "alert": "task_failed", "error": message[0]}
    return {**facts, **run}


def post_json(url: str, payload: Mapping[str, Any], headers: Mapping[str, str], timeout: float) -> int:
    """POST ``payload`` as JSON; returns the HTTP status.

    Raises:
        urllib.error.HTTPError: the server answered with an error status.
        OSError: it could not be reached (including a timeout).
    """
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=dict(headers), method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return int(answer.status)


def _run_facts(context: Context) -> dict[str, Any]:
    ti = context.get("ti")
    dag_run = context.get("dag_run")
    try:
        log_url = ti.log_url if ti is not None else None
    except Exception:  # a link the notification can do without
        log_url = None
    return {
        "dag_id": getattr(ti, "dag_id", None) or getattr(dag_run, "dag_id", None),
        "task_id": getattr(ti, "task_id", None),
        "run_id": getattr(ti, "run_id", None) or getattr(dag_run, "run_id", None),
        "try_number": getattr(ti, "try_number", None),
        "log_url": log_url,
    }


class ApplierWebhookNotifier(BaseNotifier):
    """Log a task's failure in one line and POST it as JSON to the webhook of an HTTP connection.

    Use it as a task's ``on_failure_callback`` (the apply DAG's ``check_lag``
    has it). A webhook that refuses or cannot be reached is logged as an
    error in the task log, naming the connection and the host (never the URL's
    path, which may hold a token); it does not change the task's outcome.

    Args:
        conn_id: the HTTP connection of the webhook; when it is not defined, the alert is logged only.
        endpoint: a path appended to the connection's URL.
        timeout: seconds to wait for the webhook.
    """

    template_fields: Sequence[str] = ("conn_id", "endpoint")

    def __init__(self, *, conn_id: str = ALERT_CONN_ID, endpoint: str = "", timeout: float = 10.0) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.endpoint = endpoint
        self.timeout = timeout

    def notify(self, context: Context) -> None:
        """Log the alert, then POST it when the connection is defined."""
        payload = alert_payload(context.get("exception"), _run_facts(context))
        self.log.error("%s", payload["text"])
        try:
            conn = BaseHook.get_connection(self.conn_id)
        except AirflowNotFoundException:
            self.log.info("connection %s is not defined: the alert is in this log only", self.conn_id)
            return
        try:
            url = webhook_url(self.conn_id, conn.host, conn.schema, conn.port, self.endpoint)
        except ValueError as e:
            self.log.error("%s", e)
            return
        where = f"{urlsplit(url).netloc} (connection {self.conn_id})"
        headers = webhook_headers(conn.extra_dejson, conn.login, conn.password)
        try:
            status = post_json(url, payload, headers, self.timeout)
        except urllib.error.HTTPError as e:
            self.log.error("the webhook at %s refused the alert: HTTP %d %s", where, e.code, e.reason)
            return
        except OSError as e:
            self.log.error("the webhook at %s could not be reached: %s", where, getattr(e, "reason", e))
            return
        self.log.info("alert posted to the webhook at %s: HTTP %d", where, status)
