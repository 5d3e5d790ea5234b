"""The validate task's extra link, apart from the operators so that the view's plugin imports little."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator, BaseOperatorLink

from applier_airflow.builders import data_docs_url


class DataDocsLink(BaseOperatorLink):
    """The Data Docs the Applier view serves (``/applier/docs/``, behind Airflow's login), under ``[api] base_url``."""

    name = "Data Docs"

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        from airflow.configuration import conf

        return data_docs_url(conf.get("api", "base_url", fallback="/"))
