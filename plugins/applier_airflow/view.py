"""The Applier view: a FastAPI app the Airflow API server mounts at ``/applier`` (see ``plugins/applier_view.py``).

* ``GET /applier/`` the page (HTML), ``GET /applier/static/view.js`` and
  ``/static/view.css`` its script and styles: no build step, no CDN, every
  path relative so the page works behind a reverse proxy and in Airflow's iframe.
* ``GET /applier/docs/…`` the configuration's Data Docs site (offline: its
  assets are vendored), which the page links per table.
* ``GET /applier/api/status?cycles=N`` the JSON the page draws:
  :func:`applier.view_document.view_document` for the configuration the
  ``applier`` DAG uses, resolved by :class:`~applier_airflow.hooks.ApplierHook`
  (Variable ``applier_config``, else ``$APPLIER_CONFIG``, else ``config/demo.yaml``,
  with the ``applier_target`` connection's overrides; a run's params are not applied).

Airflow does not protect a plugin's app: every route here depends on
Airflow's own JWT check (``Authorization: Bearer`` or the UI's ``_token``
cookie) and on read access to the ``applier`` DAG. Without a token the answer
is 401 (the page too: it is opened from the Airflow UI, which is logged in);
an invalid token or a user without that access gets 403.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import FileResponse, JSONResponse

from applier.errors import ApplierError

DAG_ID = "applier"  # the DAG whose read access the view requires
URL_PREFIX = "/applier"
STATIC = Path(__file__).resolve().parent / "view_static"
ASSETS = {"view.js": "text/javascript", "view.css": "text/css"}


def _status(cycles: int) -> dict[str, Any]:
    """The view's document for the ``applier`` DAG's configuration (imports the library only when asked)."""
    from applier.view_document import view_document
    from applier_airflow.hooks import ApplierHook

    run = ApplierHook().resolve([])
    return {"config_file": str(run.config_path), **view_document(run.config, cycles=cycles)}


def create_app() -> FastAPI:
    """The view's app; every route requires Airflow's authentication and read access to the ``applier`` DAG."""
    app = FastAPI(
        title="Applier view",
        dependencies=[Depends(requires_access_dag("GET", param_dag_id=DAG_ID))],
        docs_url=None,  # FastAPI's own pages would skip the app's dependencies
        redoc_url=None,
        openapi_url=None,
    )

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers={"Cache-Control": "no-store"})

    @app.get("/static/{name}", include_in_schema=False)
    def asset(name: str) -> FileResponse:
        if name not in ASSETS:
            raise HTTPException(404, "Not Found")
        return FileResponse(STATIC / name, media_type=ASSETS[name])

    @app.get("/docs/{path:path}", include_in_schema=False)
    def data_docs(path: str) -> FileResponse:
        """A file of the Data Docs site; nothing outside it (``..`` and links are resolved first)."""
        from applier.view_document import DATA_DOCS
        from applier_airflow.hooks import ApplierHook

        site = (ApplierHook().resolve([]).config.work_dir / "validation" / DATA_DOCS).resolve()
        wanted = (site / (path or "index.html")).resolve()
        if not wanted.is_relative_to(site) or not wanted.is_file():
            raise HTTPException(404, "Not Found")
        return FileResponse(wanted)

    # Plain def: FastAPI runs it in a worker thread, so reading files (and the source's slot) blocks no one.
    @app.get("/api/status")
    def status(cycles: int = Query(20, ge=1, le=500)) -> JSONResponse:
        try:
            return JSONResponse(_status(cycles), headers={"Cache-Control": "no-store"})
        except (ApplierError, ValueError) as e:
            # A bad configuration or a damaged state file is the view's news, in one line, not a traceback.
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=500)

    return app


app = create_app()
