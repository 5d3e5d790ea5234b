"""The operator of the materialize DAG: add a table to running replication, then copy it.

Thin, as the other operators: the library records the subscription and one
bounded batch of ``applier extract`` materializes it (see
docs/materialization.md). When another extractor holds the intermediate
folder (a ``--follow`` container, the extract DAG's batch), the subscription
stays recorded and that extractor copies the table at its next batch: the task
succeeds and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from applier.errors import ApplierError, RunLockedError
from applier_airflow.base import ApplierTaskMixin, failing_on_bad_input
from applier_airflow.extract_builders import extract_outcome, subscription_from_params
from applier_airflow.hooks import CONFIG_VARIABLE, TARGET_CONN_ID


class ApplierSubscribeOperator(ApplierTaskMixin, BaseOperator):
    """``applier subscribe``: record the subscription of the ``table`` param in ``mode``, then materialize it.

    Returns the subscription's table, mode, state, rows copied and recovering
    flag. A subscription that fails (a lock wait that ran out, a keyless table
    in nonatomic mode) fails the task with its message, without a retry: it
    waits for ``applier subscriptions --resume`` once fixed, or a drop.

    Args:
        config_path: the configuration file; None discovers it (see ``ApplierHook``).
        config_variable: the Airflow Variable naming the configuration file.
        target_conn_id: the optional target connection (unused here).
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
        from applier.extract.subscriptions import Registry

        run = self.resolve(context)
        registry = Registry(run.config.intermediate_dir)
        with failing_on_bad_input():
            table, mode, chunk_rows = subscription_from_params(context["params"])
            registry.add(table, mode, chunk_rows)
        self.log.info("subscription %s (%s) defined", table, mode)
        try:
            extract(run.config)
        except RunLockedError as e:
            self.log.warning("another extractor holds the folder; it materializes %s at its next batch (%s)", table, e)
        except ApplierError as e:
            outcome, reason = extract_outcome(e)
            raise (AirflowFailException if outcome == "fail" else AirflowException)(reason) from e
        sub = registry.load()[table]
        if sub.error:
            raise AirflowFailException(f"subscription {table} is recovering: {sub.error}")
        figures = {"table": table, "mode": mode, "state": sub.state, "copied_rows": sub.copied_rows,
                   "recovering": sub.recovering}  # fmt: skip
        self.log.info("subscription %s (%s): %s, %d rows copied", table, mode, sub.state, sub.copied_rows)
        return figures
