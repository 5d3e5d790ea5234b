"""What the Applier view's tests share: Airflow's API app in process, tokens of roles, the script under Node.

The app is Airflow's own (``airflow.api_fastapi.app.create_app``) with the
project's plugins folder, so mount path, authentication and authorisation
are the real ones. Tokens are minted by the simple auth manager, as
``POST /auth/token`` does.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VIEW_JS = HERE.parent / "plugins" / "applier_airflow" / "view_static" / "view.js"


def api_client() -> Iterator[Any]:
    """Airflow's API app (core: plugins, auth manager, UI) in process, for a module's ``client`` fixture.

    Airflow's home must be prepared first (the ``airflow_home`` session fixture).
    """
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    with TestClient(create_app(apps="core")) as c:
        yield c


def token(role: str | None) -> str:
    """A JWT for a simple-auth-manager user of ``role`` (None: no role), as ``POST /auth/token`` issues it."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=f"view-{role}", role=role))


def bearer(role: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(role)}"}


def with_cookie(client: Any, method: str, path: str, value: str, headers: dict[str, str] | None = None) -> Any:
    """``method`` ``path`` with the ``_token`` cookie the Airflow UI sets after login (and no bearer header)."""
    client.cookies.set("_token", value)
    try:
        return client.request(method, path, headers=headers or {})
    finally:
        client.cookies.clear()


def draw(folder: Path, status: str, click: tuple[int, str, int, str] | None = None) -> dict[str, Any]:
    """Run view.js under Node (``view_smoke.js``) on a status document; its JSON report.

    With ``click`` (an exception id, the POST's answer, its status code, the
    status document after it) that exception's Resubmit button is clicked too.
    """
    (folder / "status.json").write_text(status)
    args = [str(HERE / "view_smoke.js"), str(VIEW_JS), str(folder / "status.json")]
    if click is not None:
        ident, answer, code, later = click
        (folder / "resubmit.json").write_text(answer)
        (folder / "after.json").write_text(later)
        args += [str(ident), str(folder / "resubmit.json"), str(code), str(folder / "after.json")]
    done = subprocess.run(["node", *args], capture_output=True, text=True, timeout=60, check=True)
    report: dict[str, Any] = json.loads(done.stdout)
    return report
