"""A real, running Airflow for tests: api-server, scheduler and dag-processor on SQLite.

:func:`running_airflow` migrates a fresh ``AIRFLOW_HOME``, starts the three
components as subprocesses (each in its own process group, logs in
``<home>/process-logs/``) with the LocalExecutor at parallelism 4 and the API
on a free loopback port (SQLite told to wait a minute for its lock, by the
project's ``config/airflow/airflow_local_settings.py``), waits until the health endpoint reports the
scheduler and the DAG processor healthy, and stops them all on the way out,
failure or not. The environment is ``airflow_support.airflow_env``'s (the
project's DAGs and plugins, ``spark_default`` on local Spark) plus the API,
its authentication and the executor.

:class:`AirflowServer` talks to it the way a user's tools do: the REST API
``/api/v2`` with a JWT from ``POST /auth/token`` (the simple auth manager, one
``admin`` whose password the test writes), and the ``airflow`` CLI against the
same home. Nothing here imports ``airflow``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from airflow_support import AIRFLOW_BIN, REPO, airflow_command, airflow_env

T = TypeVar("T")
FINISHED = ("success", "failed")
STARTUP_SECONDS = 240
RUN_SECONDS = 420
LOCAL_SETTINGS = REPO / "config" / "airflow" / "airflow_local_settings.py"


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def iso(moment: dt.datetime) -> str:
    """``moment`` as the API wants it: ISO 8601 with its UTC offset."""
    return moment.astimezone(dt.UTC).isoformat()


class AirflowTestError(AssertionError):
    """Airflow did not get where the test waited for it to get; the message carries its logs."""


@dataclass
class AirflowServer:
    """A running Airflow and the calls tests make to it.

    Attributes:
        home: its ``AIRFLOW_HOME``.
        url: the API server's base URL, ``http://127.0.0.1:<port>``.
        env: the environment its processes run with (for the CLI too).
        password: the ``admin`` user's password.
        processes: the component processes by name.
    """

    home: Path
    url: str
    env: dict[str, str]
    password: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _token: str | None = None

    # ------------------------------------------------------------------ plumbing

    def logs(self, chars: int = 3000) -> str:
        """The end of each component's log, for failure messages."""
        parts = []
        for name in self.processes:
            path = self.home / "process-logs" / f"{name}.log"
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"--- {name} (last {chars} chars):\n{text[-chars:]}")
        return "\n".join(parts)

    def request(self, method: str, path: str, body: Any = None, *, token: bool = True) -> tuple[int, Any]:
        """One API call; returns the status and the decoded JSON body (or text)."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if token:
            headers["Authorization"] = f"Bearer {self.token()}"
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """An API call that must succeed (2xx); returns its JSON body."""
        status, answer = self.request(method, path, body)
        if not 200 <= status < 300:
            raise AirflowTestError(f"{method} {path} answered {status}: {answer}")
        return answer

    def token(self) -> str:
        """A JWT for ``admin`` from ``POST /auth/token`` (fetched once)."""
        if self._token is None:
            status, answer = self.request(
                "POST", "/auth/token", {"username": "admin", "password": self.password}, token=False
            )
            if status != 201:
                raise AirflowTestError(f"POST /auth/token answered {status}: {answer}")
            self._token = str(answer["access_token"])
        return self._token

    def wait(self, what: str, probe: Callable[[], T | None], timeout: float) -> T:
        """Poll ``probe`` until it returns something; fail with the logs if a component dies or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            found = probe()
            if found is not None:
                return found
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise AirflowTestError(f"{name} exited {process.returncode} waiting for {what}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise AirflowTestError(f"no {what} after {timeout:.0f}s\n{self.logs()}")
            time.sleep(2)

    def cli(
        self, *args: str, timeout: float = 300, took_effect: Callable[[], bool] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``airflow ARGS`` against this instance's home (:func:`airflow_command`)."""
        return airflow_command(list(args), self.env, timeout=timeout, took_effect=took_effect)

    # ------------------------------------------------------------------ DAGs, variables, runs

    def wait_for_dag(self, dag_id: str, timeout: float = STARTUP_SECONDS) -> dict[str, Any]:
        """The DAG once the DAG processor has parsed it; fails naming the import errors."""

        def parsed() -> dict[str, Any] | None:
            status, answer = self.request("GET", f"/api/v2/dags/{dag_id}")
            if status == 200 and not answer.get("has_import_errors"):
                return dict(answer)
            errors = self.api("GET", "/api/v2/importErrors").get("import_errors", [])
            if errors:
                raise AirflowTestError(f"DAG import errors: {json.dumps(errors, indent=1)}")
            return None

        return self.wait(f"parsed DAG {dag_id}", parsed, timeout)

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})

    def set_variable(self, key: str, value: str) -> None:
        """Create or replace an Airflow Variable."""
        status, _ = self.request("GET", f"/api/v2/variables/{key}")
        if status == 200:
            self.api("PATCH", f"/api/v2/variables/{key}", {"key": key, "value": value})
        else:
            self.api("POST", "/api/v2/variables", {"key": key, "value": value})

    def delete_variable(self, key: str) -> None:
        status, answer = self.request("DELETE", f"/api/v2/variables/{key}")
        if status not in (204, 404):
            raise AirflowTestError(f"DELETE variable {key} answered {status}: {answer}")

    def trigger(self, dag_id: str, conf: dict[str, Any], logical_date: dt.datetime | None = None) -> tuple[int, Any]:
        """``POST /dags/{dag_id}/dagRuns``; returns the status and the answer (the run, or the refusal)."""
        body: dict[str, Any] = {"conf": conf, "logical_date": iso(logical_date) if logical_date else None}
        return self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """Every run of the DAG, oldest logical date first."""
        answer = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100&order_by=run_after")
        return list(answer["dag_runs"])

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        quoted = urllib.parse.quote(run_id, safe="")
        answer = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances")
        return {ti["task_id"]: ti["state"] for ti in answer["task_instances"]}

    def task_log(self, dag_id: str, run_id: str, task_id: str, chars: int = 4000) -> str:
        """The end of the latest attempt's log file of a task (read from the home's log folder)."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        attempts = sorted(folder.glob("attempt=*.log"), key=lambda p: int(p.stem.split("=")[1]))
        return attempts[-1].read_text(errors="replace")[-chars:] if attempts else f"(no log under {folder})"

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        """A task's XCom value, deserialised from its JSON."""
        quoted = urllib.parse.quote(run_id, safe="")
        answer = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances/{task_id}/xcomEntries/{key}")
        value = answer["value"]
        return json.loads(value) if isinstance(value, str) and value[:1] in "[{" else value

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = RUN_SECONDS) -> dict[str, Any]:
        """The run once finished; fails with its task states and the logs of its failed tasks unless it succeeded."""
        quoted = urllib.parse.quote(run_id, safe="")

        def finished() -> dict[str, Any] | None:
            run = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}")
            return dict(run) if run["state"] in FINISHED else None

        run = self.wait(f"end of run {run_id}", finished, timeout)
        if run["state"] != "success":
            raise AirflowTestError(self.describe_run(dag_id, run_id))
        return run

    def describe_run(self, dag_id: str, run_id: str) -> str:
        """A run's task states and the log ends of its tasks that did not succeed."""
        states = self.task_states(dag_id, run_id)
        failed = [task for task, state in states.items() if state not in ("success", "skipped")]
        logs = "\n".join(f"--- {task}:\n{self.task_log(dag_id, run_id, task)}" for task in failed)
        return f"run {run_id}: tasks {states}\n{logs}"


def _start(home: Path, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start ``airflow ARGS`` in its own process group, so that stopping it stops its children (tasks, Spark)."""
    logs = home / "process-logs"
    logs.mkdir(exist_ok=True)
    with (logs / f"{name}.log").open("wb") as out:
        return subprocess.Popen(
            [str(AIRFLOW_BIN), *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group; SIGKILL it when it has not ended in 30 seconds."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # what lingers of the group (task processes, JVMs)
    process.wait(timeout=30)


def server_env(home: Path, port: int, password_file: Path, **extra: str) -> dict[str, str]:
    """The environment of every component and of the CLI (see the module docstring)."""
    return {
        **os.environ,
        **airflow_env(home, **extra),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(password_file),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": "airflow_local_settings.connect_args",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": "airflow_local_settings.connect_args",
        # One machine: the API server reads task logs from the files; no log server on the fixed port 8793.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
    }


@contextmanager
def running_airflow(home: Path, *, standalone: bool = False, **extra_env: str) -> Iterator[AirflowServer]:
    """Migrate ``home``, start the api-server, scheduler and dag-processor, yield the server, stop them.

    Args:
        home: an empty folder for ``AIRFLOW_HOME``.
        standalone: start them (and a triggerer) as ``airflow standalone`` does, in one process,
            as a user running ``make airflow`` has them.
        **extra_env: more environment for every component (``APPLIER_CONFIG``, ``APPLIER_SCHEDULE``...).

    Raises:
        AirflowTestError: a component died or was not healthy in time (with the logs).
    """
    port = free_port()
    password = secrets.token_urlsafe(16)
    password_file = home / "passwords.json"
    password_file.write_text(json.dumps({"admin": password}))
    (home / "config").mkdir(exist_ok=True)
    shutil.copy(LOCAL_SETTINGS, home / "config")  # SQLite waits for its lock instead of failing a request
    env = server_env(home, port, password_file, **extra_env)
    server = AirflowServer(home=home, url=f"http://127.0.0.1:{port}", env=env, password=password)
    airflow_command(["db", "migrate"], env)
    try:
        if standalone:
            server.processes["standalone"] = _start(home, "standalone", ["standalone"], env)
        else:
            server.processes["api-server"] = _start(home, "api-server", ["api-server", "--workers", "1"], env)
            server.processes["scheduler"] = _start(home, "scheduler", ["scheduler", "--skip-serve-logs"], env)
            server.processes["dag-processor"] = _start(home, "dag-processor", ["dag-processor"], env)

        def healthy() -> bool | None:
            try:
                status, answer = server.request("GET", "/api/v2/monitor/health", token=False)
            except OSError:  # not listening yet
                return None
            if status != 200:
                return None
            parts = ("metadatabase", "scheduler", "dag_processor")
            return True if all((answer.get(p) or {}).get("status") == "healthy" for p in parts) else None

        server.wait("healthy scheduler and DAG processor", healthy, STARTUP_SECONDS)
        yield server
    finally:
        for name in ("scheduler", "dag-processor", "api-server", "standalone"):
            if name in server.processes:
                _stop(server.processes[name])
