"""The Applier view: a FastAPI app the Airflow API server mounts at ``/applier`` (see ``plugins/applier_view.py``).

* ``GET /applier/`` the page (HTML), ``GET /applier/static/view.js`` and
  ``/static/view.css`` its script and styles: no build step, no CDN, every
  path relative so the page works behind a reverse proxy and in Airflow's iframe.
* ``GET /applier/docs/…`` the configuration's Data Docs site (offline: its
  assets are vendored), which the page links per table.
* ``GET /applier/api/status?cycles=N&exceptions=M`` the JSON the page draws:
  :func:`applier.view_document.view_document` for the configuration the
  ``applier`` DAG uses, resolved by :class:`~applier_airflow.hooks.ApplierHook`
  (Variable ``applier_config``, else ``$APPLIER_CONFIG``, else ``config/demo.yaml``,
  with the ``applier_target`` connection's overrides; a run's params are not applied).
* ``POST /applier/api/exceptions/{id}/resubmit`` resubmits one exception of
  the target's exceptions store, as ``applier exceptions resubmit ID`` does
  (:func:`applier.engine.resubmit.resubmit`): 200 with its words, else one
  line of JSON (``{"error": ...}``) and 404 (no such exception), 409 (resubmitted
  already), 422 (the target refused it again; nothing changed), 423 (a run or
  another resubmission holds the run lock; try again after it), 503 (a
  transient target error: a lost connection, a lock timeout).

Airflow does not protect a plugin's app: every route here depends on
Airflow's own JWT check (``Authorization: Bearer`` or the UI's ``_token``
cookie) and on read access to the ``applier`` DAG. Without a token the answer
is 401 (the page too: it is opened from the Airflow UI, which is logged in);
an invalid token or a user without that access gets 403. Resubmitting changes
the target, so it also requires edit access to the DAG (``PUT``: with the simple
auth manager, roles user, op and admin; a viewer gets 403), and, when only the
cookie authorises it, a request from this Airflow's own pages (:func:`same_origin`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse

from applier.errors import (
    ApplierError,
    ExceptionNotFoundError,
    ExceptionResubmittedError,
    RunLockedError,
    TargetError,
)

log = logging.getLogger(__name__)

DAG_ID = "applier"  # the DAG whose read access the view requires (and edit access, to resubmit)
URL_PREFIX = "/applier"
STATIC = Path(__file__).resolve().parent / "view_static"
ASSETS = {"view.js": "text/javascript", "view.css": "text/css"}
# What a refused resubmission answers, the first class that matches (the subclasses first); a transient
# target error (a lost connection, a lock timeout) answers 503 instead of 422: the same request may pass later.
RESUBMIT_REFUSALS: tuple[tuple[type[ApplierError], int], ...] = (
    (ExceptionNotFoundError, 404),
    (ExceptionResubmittedError, 409),
    (TargetError, 422),
    (RunLockedError, 423),
    (ApplierError, 500),
)


def _status(cycles: int, exceptions: int) -> dict[str, Any]:
    """The view's document for the ``applier`` DAG's configuration (imports the library only when asked)."""
    from applier.view_document import view_document
    from applier_airflow.hooks import ApplierHook

    run = ApplierHook().resolve([])
    return {"config_file": str(run.config_path), **view_document(run.config, cycles=cycles, exceptions=exceptions)}


def _resubmit(ident: int) -> str:
    """Resubmit exception ``ident`` of the ``applier`` DAG's configuration; the library's words."""
    from applier.engine.resubmit import resubmit
    from applier.targets import open_target
    from applier_airflow.hooks import ApplierHook

    config = ApplierHook().resolve([]).config
    target = open_target(config)
    try:
        return resubmit(config, target, ident)
    finally:
        target.close()


def refusal_status(e: ApplierError) -> int:
    """The HTTP status a resubmission refused with ``e`` answers (see :data:`RESUBMIT_REFUSALS`)."""
    if isinstance(e, TargetError) and e.transient:
        return 503
    return next(code for kind, code in RESUBMIT_REFUSALS if isinstance(e, kind))


def _error(e: Exception, status: int) -> JSONResponse:
    return JSONResponse({"error": " ".join(f"{type(e).__name__}: {e}".split())}, status_code=status)


def same_origin(request: Request) -> None:
    """Refuse a change authorised by the UI's cookie alone unless it comes from this Airflow's own pages.

    A browser attaches the ``_token`` cookie to a request another site's page
    makes (the simple auth manager's login page sets it without ``SameSite``),
    so such a request could resubmit in the user's name: cross-site request
    forgery. A browser never adds an ``Authorization`` header by itself, so a
    bearer token needs nothing more. Otherwise ``Sec-Fetch-Site`` (which every
    current browser sends) must be ``same-origin``; without it, ``Origin`` must
    name this server (its ``Host``, or the host of ``[api] base_url``).

    Raises:
        HTTPException: 403, naming what was missing.
    """
    if request.headers.get("authorization", "").lower().startswith("bearer "):
        return
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        if site == "same-origin":
            return
        raise HTTPException(403, f"a change authorised by the UI's cookie must come from this Airflow, not {site}")
    origin = urlsplit(request.headers.get("origin", "")).netloc
    if origin and origin in _own_hosts(request):
        return
    raise HTTPException(403, "a change authorised by the UI's cookie needs an Origin header naming this Airflow")


def _own_hosts(request: Request) -> set[str]:
    from airflow.configuration import conf

    base = urlsplit(conf.get("api", "base_url", fallback="") or "").netloc
    return {h for h in (request.headers.get("host", ""), base) if h}


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
    def status(cycles: int = Query(20, ge=1, le=500), exceptions: int = Query(20, ge=1, le=500)) -> JSONResponse:
        try:
            return JSONResponse(_status(cycles, exceptions), headers={"Cache-Control": "no-store"})
        except (ApplierError, ValueError) as e:
            # A bad configuration or a damaged state file is the view's news, in one line, not a traceback.
            return _error(e, 500)

    # Plain def too: the resubmission reads and writes the target (and may wait on it) in a worker thread.
    @app.post(
        "/api/exceptions/{ident}/resubmit",
        dependencies=[Depends(requires_access_dag("PUT", param_dag_id=DAG_ID)), Depends(same_origin)],
    )
    def resubmit_exception(ident: int, user: GetUserDep) -> JSONResponse:
        try:
            words = _resubmit(ident)
        except ApplierError as e:
            status = refusal_status(e)
            log.warning("exception %d: resubmission by %s refused (%d): %s", ident, user.get_name(), status, e)
            return _error(e, status)
        log.info("exception %d resubmitted by %s from the Applier view: %s", ident, user.get_name(), words)
        return JSONResponse({"id": ident, "message": words}, headers={"Cache-Control": "no-store"})

    return app


app = create_app()
