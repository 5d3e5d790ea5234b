"""Operators of the apply DAG (plan, apply by spark-submit, validate, report) and of the extract DAG (extract).

Each is thin: it resolves the run through :class:`ApplierHook`, hands off to
the library (or to spark-submit) and turns the library's errors into task
outcomes. Bad input (configuration, a refused pair, a failed expectation) fails
the task without a retry: retrying cannot fix it. Only the apply task's target
errors (exit code 4) are left to the DAG's retries. An apply job refused because
another run holds the configuration's run lock (exit code 6) changed nothing:
it skips the apply task and the rest of the run, and the next scheduled run
picks up the backlog.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, AssetAlias, BaseHook, BaseOperator, Context, SkipMixin
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowNotFoundException,
    AirflowSkipException,
)

from applier.engine.session import JVM_OPTIONS, driver_java_options
from applier.errors import ApplierError
from applier_airflow.base import ApplierTaskMixin, context_run_key, failing_on_bad_input, skipped_downstream
from applier_airflow.builders import (
    application_args,
    asset_uris,
    changed_tables,
    figures_lines,
    max_cycles_from_params,
    run_figures,
    spark_env,
    submit_outcome,
    touched_tables,
    unknown_conf_keys,
)
from applier_airflow.extract_builders import extract_figures, extract_line, extract_outcome, max_wal_mb_from_params
from applier_airflow.hooks import CONFIG_VARIABLE, PROJECT_DIR, TARGET_CONN_ID
from applier_airflow.links import DataDocsLink

APPLY_JOB = PROJECT_DIR / "jobs" / "apply.py"
TABLES_ALIAS = "applier_target_tables"
LOCAL_SPARK_CONN = '{"conn_type": "spark", "host": "local[*]"}'


def jvm_conf() -> dict[str, str]:
    """The Spark properties for the JVMs: the engine's options, and for the driver its class archive too."""
    return {"spark.driver.extraJavaOptions": driver_java_options(), "spark.executor.extraJavaOptions": JVM_OPTIONS}


class ApplierPlanOperator(ApplierTaskMixin, BaseOperator, SkipMixin):
    """Plan what the run will apply; skip the rest when there is nothing to do.

    Pushes the plan (``builders.plan_summary``) as its XCom. Every downstream
    task is skipped when there is nothing new and the run key has no finished
    record to replay, and when the ``plan_only`` param is set (a dry run).

    Args:
        config_path: the configuration file; None discovers it (see ``ApplierHook``).
        config_variable: the Airflow Variable naming the configuration file.
        target_conn_id: the optional target connection.
    """

    template_fields: Sequence[str] = ("config_path",)

    def __init__(
        self,
        *,
        config_path: str | None = None,
        config_variable: str = CONFIG_VARIABLE,
        target_conn_id: str = TARGET_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.config_variable = config_variable
        self.target_conn_id = target_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from applier_airflow.planning import plan_run

        # Against the DAG's declared params: the run's params already hold every conf key.
        unknown = unknown_conf_keys(getattr(context["dag_run"], "conf", None) or {}, self.dag.params)
        if unknown:  # a misspelt key would otherwise be ignored, and the run apply the whole backlog
            raise AirflowFailException(unknown)
        run = self.resolve(context)
        with failing_on_bad_input():
            plan, gap = plan_run(run.config, context_run_key(context), max_cycles_from_params(context["params"]))
        for cycle in plan["cycles"]:
            self.log.info("cycle: pairs %d..%d, %d bytes", cycle["first_seq"], cycle["last_seq"], cycle["bytes"])
        if plan["replay"]:
            self.log.info("run %s has a finished record: replaying cycles %s", plan["run_key"], plan["replay_cycles"])
        if plan["nothing_new"] and gap is not None:
            raise AirflowFailException(str(gap))
        if plan["nothing_new"]:
            self._skip_the_rest(context, plan, "nothing new to apply")
        elif context["params"].get("plan_only"):
            self._skip_the_rest(context, plan, "plan_only is set (a dry run)")
        self.log.info("%d cycles, %d pairs, %d bytes to apply", len(plan["cycles"]), plan["pairs"], plan["bytes"])
        return plan

    def _skip_the_rest(self, context: Context, plan: dict[str, Any], reason: str) -> None:
        self.log.info("%s: skipping the rest of the run", reason)
        # Skipping ends the task by raising, so the plan is pushed first.
        context["ti"].xcom_push(key="return_value", value=plan)
        self.skip(ti=context["ti"], tasks=skipped_downstream(self))


class ApplierSubmitOperator(ApplierTaskMixin, SparkSubmitOperator, SkipMixin):
    """Submit ``jobs/apply.py`` for this run through a Spark connection (``spark_default``).

    The application arguments are built at run time: the configuration file,
    the overrides, the ``max_cycles`` param and the run key. The driver runs this
    worker's Python, which has the ``applier`` package; the executors too,
    unless ``PYSPARK_PYTHON`` names theirs. The driver and executor JVMs get
    the engine's options (``applier.engine.session.JVM_OPTIONS``) unless
    ``conf`` sets their ``extraJavaOptions``: under spark-submit the driver JVM
    is started before the job could set them.

    When the job finds another run applying the configuration (exit code 6,
    the run lock is held), the task and the rest of the run are skipped, not
    failed (``builders.submit_outcome``).

    Args:
        config_path: the configuration file; None discovers it (see ``ApplierHook``).
        config_variable: the Airflow Variable naming the configuration file.
        target_conn_id: the optional target connection.
        conn_id: the Spark connection; it must be defined (the provider would fall back to YARN).
        application: the job submitted, ``jobs/apply.py`` of this project by default.
        name: the Spark application's name.
        **kwargs: other ``SparkSubmitOperator`` arguments (``conf``, ``env_vars``, ``driver_memory``, ...).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "config_path")

    def __init__(
        self,
        *,
        config_path: str | None = None,
        config_variable: str = CONFIG_VARIABLE,
        target_conn_id: str = TARGET_CONN_ID,
        conn_id: str = "spark_default",
        application: str = str(APPLY_JOB),
        name: str = "applier",
        **kwargs: Any,
    ) -> None:
        conf = {**jvm_conf(), **(kwargs.pop("conf", None) or {})}
        super().__init__(conn_id=conn_id, application=application, name=name, conf=conf, **kwargs)
        self.spark_conn_id = conn_id
        self.config_path = config_path
        self.config_variable = config_variable
        self.target_conn_id = target_conn_id

    def execute(self, context: Context) -> None:
        run = self.resolve(context)
        key = context_run_key(context)
        try:
            BaseHook.get_connection(self.spark_conn_id)
        except AirflowNotFoundException as e:
            raise AirflowFailException(
                f"connection {self.spark_conn_id} is not defined; define it, for local mode e.g. "
                f"AIRFLOW_CONN_{self.spark_conn_id.upper()}='{LOCAL_SPARK_CONN}'"
            ) from e
        with failing_on_bad_input():
            max_cycles = max_cycles_from_params(context["params"])
        self.application_args = application_args(str(run.config_path), run.overrides, max_cycles, key)
        executors = os.environ.get("PYSPARK_PYTHON") or sys.executable
        env = spark_env(sys.executable, executors, os.environ.get("PATH", ""))
        self.env_vars = {**env, **(self.env_vars or {})}
        try:
            super().execute(context)
        except AirflowException as e:
            outcome, reason = submit_outcome(str(e))
            if outcome == "skip":
                # Another run holds the lock: nothing of this run to validate or report, and nothing to page
                # about; the lag check (all_done) still measures whether the lock's holder keeps up.
                self.log.warning("%s", reason)
                self.skip(ti=context["ti"], tasks=skipped_downstream(self))
                raise AirflowSkipException(reason) from e
            if outcome == "fail":
                raise AirflowFailException(reason) from e
            raise


class ApplierValidateOperator(ApplierTaskMixin, BaseOperator):
    """Validate the target tables the run applied, re-applied or verified (Great Expectations).

    Skipped when the ``skip_validation`` param is set. A failed expectation
    fails the task, without a retry, with the library's message naming the
    table and the expectation. Returns the validation result.

    Args:
        config_path: the configuration file; None discovers it (see ``ApplierHook``).
        config_variable: the Airflow Variable naming the configuration file.
        target_conn_id: the optional target connection.
    """

    template_fields: Sequence[str] = ("config_path",)
    operator_extra_links = (DataDocsLink(),)

    def __init__(
        self,
        *,
        config_path: str | None = None,
        config_variable: str = CONFIG_VARIABLE,
        target_conn_id: str = TARGET_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.config_variable = config_variable
        self.target_conn_id = target_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from applier_airflow.planning import recorded_run, validate_tables

        if context["params"].get("skip_validation"):
            raise AirflowSkipException("skip_validation is set: the target is not validated in this run")
        run = self.resolve(context)
        key = context_run_key(context)
        with failing_on_bad_input():
            tables = touched_tables(recorded_run(run.config, key))
            self.log.info("validating %d tables: %s", len(tables), ", ".join(tables) or "none")
            report = validate_tables(run.config, tables, key)
            if report is None:
                return {"success": True, "tables": {}, "json_path": None, "data_docs_path": None}
            summary = report.summary()
            for table, result in summary["tables"].items():
                state = "passed" if result["success"] else "FAILED"
                counts = (result["expectations"], result["failed"])
                self.log.info("%s %s: %d expectations, %d failed", table, state, *counts)
            for line in report.failures():
                self.log.error("%s", line)
            self.log.info("results %s, Data Docs %s", summary["json_path"], summary["data_docs_path"])
            report.raise_for_failure()
        return summary


class ApplierReportOperator(ApplierTaskMixin, BaseOperator):
    """Report the run's figures (task log and XCom) and an asset event per changed target table.

    The tables are known only at run time, so the events go through an asset
    alias (``applier_target_tables``): downstream DAGs scheduled on the alias,
    or on a table's asset (``file:///<target.path>/<schema>/<table>``), run on
    fresh data.

    Args:
        config_path: the configuration file; None discovers it (see ``ApplierHook``).
        config_variable: the Airflow Variable naming the configuration file.
        target_conn_id: the optional target connection.
        alias_name: the asset alias the table events are attached to.
        validate_task_id: the task whose XCom holds the validation result.
    """

    template_fields: Sequence[str] = ("config_path",)

    def __init__(
        self,
        *,
        config_path: str | None = None,
        config_variable: str = CONFIG_VARIABLE,
        target_conn_id: str = TARGET_CONN_ID,
        alias_name: str = TABLES_ALIAS,
        validate_task_id: str = "validate",
        **kwargs: Any,
    ) -> None:
        super().__init__(outlets=[AssetAlias(alias_name)], **kwargs)
        self.config_path = config_path
        self.config_variable = config_variable
        self.target_conn_id = target_conn_id
        self.alias_name = alias_name
        self.validate_task_id = validate_task_id

    def execute(self, context: Context) -> dict[str, Any]:
        from applier_airflow.planning import recorded_run

        run = self.resolve(context)
        key = context_run_key(context)
        with failing_on_bad_input():
            record = recorded_run(run.config, key)
            validation = context["ti"].xcom_pull(task_ids=self.validate_task_id)
            figures = run_figures(record, validation)
            uris = asset_uris(run.config.target, changed_tables(record))
        for line in figures_lines(figures):
            self.log.info("%s", line)
        events = context["outlet_events"][AssetAlias(self.alias_name)]
        for table, uri in uris.items():
            extra = {"run_key": key, "table": table, "net_rows": figures["net_rows"].get(table, {})}
            events.add(Asset(uri=uri), extra=extra)
            self.log.info("asset event: %s", uri)
        return {**figures, "assets": uris}


class ApplierExtractOperator(ApplierTaskMixin, BaseOperator):
    """One bounded batch of ``applier extract``: the source's committed transactions into pairs.

    Runs the library in the worker (no Spark): every transaction committed up
    to the WAL end at the start, or ``max_wal_mb`` of WAL (param). A batch held
    back by the unapplied backlog succeeds and says so. Another extractor
    holding the intermediate folder's lock skips the task; a source that cannot
    be reached is left to the DAG's retries; anything else fails it without a
    retry (``extract_builders.extract_outcome``). Returns the batch's figures.

    Args:
        config_path: the configuration file; None discovers it (see ``ApplierHook``).
        config_variable: the Airflow Variable naming the configuration file.
        target_conn_id: the optional target connection (resolved like the apply DAG's; unused here).
    """

    template_fields: Sequence[str] = ("config_path",)

    def __init__(
        self,
        *,
        config_path: str | None = None,
        config_variable: str = CONFIG_VARIABLE,
        target_conn_id: str = TARGET_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.config_variable = config_variable
        self.target_conn_id = target_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from applier.extract import extract

        run = self.resolve(context)
        with failing_on_bad_input():
            max_wal_mb = max_wal_mb_from_params(context["params"])
        try:
            summary = extract(run.config, max_wal_mb=max_wal_mb)
        except ApplierError as e:
            outcome, reason = extract_outcome(e)
            if outcome == "skip":
                self.log.warning("%s", reason)
                raise AirflowSkipException(reason) from e
            if outcome == "fail":
                raise AirflowFailException(reason) from e
            raise AirflowException(reason) from e
        figures = extract_figures(summary)
        self.log.info("%s", extract_line(figures))
        return figures
