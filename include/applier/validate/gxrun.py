"""Running suites with Great Expectations: one ephemeral context per validation.

The context keeps its suites and results in memory and has one Data Docs
site, a folder. Each table is a DataFrame asset of one of two data sources: a
Spark one (a large table, read through the caller's session) or a pandas one
(a table small enough to validate in memory, read as Arrow), validated through a validation definition so that its
result lands in the context's results store, which is what Data Docs render.
The site therefore shows the validation just run: its folder is emptied
before each build, so pages of earlier validations do not pile up unlinked
(their JSON stays in their own results folders). Its pages load their styles
and scripts from the site's own ``vendor/`` folder (:mod:`applier.validate.offline`).
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from applier.validate._gx import gx
from applier.validate.offline import make_offline

_SITE = "applier"
_SOURCE = "target"
_IN_MEMORY = "target_in_memory"


def _project_config(docs_dir: Path) -> Any:
    """An in-memory context: no analytics, no progress bars, one filesystem Data Docs site."""
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    site = {
        "class_name": "SiteBuilder",
        "show_how_to_buttons": False,
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    }
    return DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        data_docs_sites={_SITE: site},
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )


class SuiteRunner:
    """Validates DataFrames against expectation suites and builds their Data Docs.

    Args:
        docs_dir: the Data Docs site's folder.
        run_name: names the validation run in the results and Data Docs.
    """

    def __init__(self, docs_dir: Path, run_name: str) -> None:
        from great_expectations.core.run_identifier import RunIdentifier

        self.docs_dir = docs_dir
        self.context = gx.get_context(mode="ephemeral", project_config=_project_config(docs_dir))
        self._sources: dict[str, Any] = {}
        self.run_id = RunIdentifier(run_name=run_name, run_time=dt.datetime.now(dt.UTC))

    def validate(self, name: str, frame: Any, expectations: Sequence[Any]) -> dict[str, Any]:
        """Validate ``frame`` against ``expectations`` as the suite ``name``.

        GX persists the DataFrame while it computes the metrics; it is
        unpersisted here afterwards.

        Args:
            name: the suite's (and asset's) name, the table name.
            frame: a Spark DataFrame of the table, or a pandas one (Arrow-backed columns).
            expectations: the suite's expectations.

        Returns:
            GX's suite validation result as JSON.
        """
        in_memory = not hasattr(frame, "unpersist")
        asset = self._source(in_memory).add_dataframe_asset(name=name)
        batch = asset.add_batch_definition_whole_dataframe(name="whole table")
        suite = self.context.suites.add(gx.ExpectationSuite(name=name, expectations=list(expectations)))
        definition = self.context.validation_definitions.add(
            gx.ValidationDefinition(name=name, data=batch, suite=suite)
        )
        try:
            result = definition.run(batch_parameters={"dataframe": frame}, result_format="BASIC", run_id=self.run_id)
        finally:
            if not in_memory:
                frame.unpersist()
        as_json: dict[str, Any] = result.to_json_dict()
        return as_json

    def _source(self, in_memory: bool) -> Any:
        """The pandas or the Spark data source, added when first needed (a Spark one needs a session)."""
        name = _IN_MEMORY if in_memory else _SOURCE
        if name not in self._sources:
            sources = self.context.data_sources
            self._sources[name] = sources.add_pandas(name=name) if in_memory else sources.add_spark(name=name)
        return self._sources[name]

    def build_docs(self) -> tuple[Path, dict[str, Path]]:
        """Rebuild the Data Docs site from this run's results, readable offline.

        Returns:
            The site's ``index.html`` and, per suite name, its validation page.
        """
        if self.docs_dir.exists():
            shutil.rmtree(self.docs_dir)
        self.context.build_data_docs(site_names=[_SITE])
        make_offline(self.docs_dir)
        pages: dict[str, Path] = {}
        for key in self.context.validation_results_store.list_keys():
            urls = self.context.get_docs_sites_urls(resource_identifier=key, site_name=_SITE)
            if urls and urls[0].get("site_url"):
                pages[key.expectation_suite_identifier.name] = _file_path(urls[0]["site_url"])
        return self.docs_dir / "index.html", pages


def _file_path(url: str) -> Path:
    return Path(unquote(urlparse(url).path))
