"""What every Applier operator and sensor shares: the run key, the run's configuration, bad input."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.sdk import Context, TriggerRule
from airflow.sdk.exceptions import AirflowFailException

from applier.errors import ApplierError
from applier_airflow.builders import overrides_from_params, run_key
from applier_airflow.hooks import ApplierHook, ApplierRun


def context_run_key(context: Context) -> str:
    """The run key of the DAG run in ``context`` (see :func:`builders.run_key`)."""
    dag_run = context["dag_run"]
    return run_key(dag_run.logical_date, dag_run.run_id)


@contextmanager
def failing_on_bad_input() -> Iterator[None]:
    """Turn the library's deliberate errors and unusable connections into a failure without retry."""
    try:
        yield
    except (ApplierError, ValueError) as e:
        raise AirflowFailException(str(e)) from e


def skipped_downstream(task: Any) -> list[Any]:
    """The tasks a skip by ``task`` (nothing new, a dry run, a held run lock) skips: all downstream but two kinds.

    Teardowns, and tasks declared to run whatever became of their upstream
    (trigger rule ``all_done``: the lag check), are left to their trigger
    rule: a skip set on them directly would override it, and a stuck or idle
    pipeline is exactly when the lag must still be checked.
    """
    relatives = task.get_flat_relatives(upstream=False)
    return [t for t in relatives if not t.is_teardown and t.trigger_rule != TriggerRule.ALL_DONE]


class ApplierTaskMixin:
    """What every Applier operator shares: how it finds the run's configuration.

    Each operator declares ``config_path``, ``config_variable`` and
    ``target_conn_id`` in its own ``__init__``: Airflow's operator metaclass
    wraps the ``__init__`` of each operator class, and an ``__init__`` here,
    ahead of ``BaseOperator``, breaks that wrapping at instantiation.
    """

    config_path: str | None
    config_variable: str
    target_conn_id: str

    def resolve(self, context: Context) -> ApplierRun:
        """The run's configuration, with the target connection's and the params' overrides."""
        hook = ApplierHook(
            config_path=self.config_path, config_variable=self.config_variable, target_conn_id=self.target_conn_id
        )
        with failing_on_bad_input():
            return hook.resolve(overrides_from_params(context["params"]))
