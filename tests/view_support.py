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

from applier.config import Config, load_config
from applier.generate import generate_workload
from handmade import event, row, write_pair

HERE = Path(__file__).resolve().parent
VIEW_JS = HERE.parent / "plugins" / "applier_airflow" / "view_static" / "view.js"


def generated_configuration(
    folder: Path, name: str, *, seed: int, transactions: int, settings: str = ""
) -> tuple[Path, Config]:
    """A demo workload generated in ``folder/in`` (pairs of about 0.03 MiB) and a Delta configuration over it.

    ``settings``: more YAML lines for the configuration file.
    """
    generate_workload(folder / "in", seed=seed, transactions=transactions, file_size_mb=0.03, profile="demo")
    path = folder / "applier.yaml"
    path.write_text(
        f"configuration_name: {name}\nintermediate_dir: {folder / 'in'}\noutput_dir: {folder / 'out'}\n"
        f"target: {{path: {folder / 'target'}}}\n{settings}"
    )
    return path, load_config(path)


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


ITEMS = {
    "columns": [
        {"name": "id", "type": "bigint", "nullable": False},
        {"name": "qty", "type": "int", "nullable": True},
    ],
    "primary_key": ["id"],
}
# Pair 2: x2 and x4 each hold an item with a negative quantity, which the constraint refuses.
SECOND = {"x1": [(2, 2)], "x2": [(3, -1), (4, 4)], "x3": [(5, 5)], "x4": [(6, -2)]}


def write_items(directory: Path, seq: int, transactions: dict[str, list[tuple[int, int]]]) -> None:
    """Pair ``seq``: each transaction inserts its items ``(id, qty)`` into ``shop.items``."""
    lsn, rows, events = seq * 1000, [], []
    for xid, items in transactions.items():
        events.append(event("begin", xid, lsn))
        for ident, qty in items:
            lsn += 1
            rows.append(row(lsn, xid, "I", after={"id": ident, "qty": qty}, table="shop.items"))
        events.append(event("commit", xid, lsn + 1))
        lsn += 2
    write_pair(directory, seq, rows, events, tables={"shop.items": ITEMS})
