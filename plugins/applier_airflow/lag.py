"""The apply DAG's lag check: measure how far behind the source the target is, and fail when it is too far.

The measurement and the rule are the library's (:func:`applier.lag_alert.check_lag`:
the age of the oldest unapplied commit against ``alert.max_lag_seconds``);
this operator only runs it every DAG run and turns a breach into a failed task
whose exception carries the facts, for the failure callback's notifier
(:class:`applier_airflow.notifier.ApplierWebhookNotifier`, or any other).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException

from applier_airflow.base import ApplierTaskMixin, failing_on_bad_input
from applier_airflow.hooks import CONFIG_VARIABLE, TARGET_CONN_ID


class LagAlert(AirflowFailException):
    """The Applier is further behind than ``alert.max_lag_seconds``: the message is the alert's one line.

    A failure without retry (a retry would measure the same backlog again).
    ``payload`` holds the facts (:meth:`applier.lag_alert.LagCheck.payload`)
    that a notifier sends.
    """

    def __init__(self, message: str, payload: dict[str, Any]) -> None:
        super().__init__(message)
        self.payload = payload

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.payload))


class ApplierLagOperator(ApplierTaskMixin, BaseOperator):
    """Check the replication lag of the run's configuration against ``alert.max_lag_seconds``.

    Meant to run in every DAG run, whatever became of the others (trigger
    rule ``all_done``; the plan and apply tasks leave such tasks to it when
    they skip the rest): with nothing new, in a dry run, after a failed or
    skipped apply. Logs the measurement in one line and returns it (XCom);
    when the lag passes the threshold, raises :class:`LagAlert` with that
    line, which fails the task and calls its ``on_failure_callback``.

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
        from applier.lag_alert import check_lag

        run = self.resolve(context)
        with failing_on_bad_input():
            check = check_lag(run.config)
        payload = check.payload()
        if check.over:
            raise LagAlert(check.line(), payload)
        self.log.info("%s", check.line())
        return payload
