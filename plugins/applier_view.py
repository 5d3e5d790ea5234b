"""Registers the Applier view with Airflow: its FastAPI app at ``/applier`` and an "Applier" entry in the navigation.

Airflow imports every module of the plugins folder and keeps the
:class:`~airflow.plugins_manager.AirflowPlugin` subclasses it finds; the app
itself is :mod:`applier_airflow.view`.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from applier_airflow.links import DataDocsLink
from applier_airflow.view import URL_PREFIX, app


class ApplierViewPlugin(AirflowPlugin):
    """The Applier view in the Airflow UI (Airflow 3.1 and later)."""

    name = "applier_view"
    # Lists, as AirflowPlugin declares them (Airflow drops an invalid entry from them in place).
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Applier view"}]  # noqa: RUF012
    # url_route: the UI shows the page in its own frame at /plugin/applier; href has no leading slash,
    # so it is relative to Airflow's base URL (behind a proxy too).
    operator_extra_links = [DataDocsLink()]  # noqa: RUF012  (the validate task's link to the Data Docs)
    external_views = [{"name": "Applier", "href": "applier/", "url_route": "applier", "destination": "nav"}]  # noqa: RUF012
