"""A deferrable sensor that waits for new complete intermediate-file pairs.

Use it in front of the apply tasks when runs should start on arrival rather
than on a schedule: it checks once in the worker, then waits in the triggerer
(no worker slot held) until a complete pair after the checkpoint's applied
pair exists. Its XCom says which pairs are new.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue

from applier.engine.checkpoint import CheckpointStore
from applier.intermediate.pairs import list_pairs
from applier_airflow.base import ApplierTaskMixin, failing_on_bad_input
from applier_airflow.builders import new_pairs_event
from applier_airflow.hooks import CONFIG_VARIABLE, TARGET_CONN_ID
from applier_airflow.triggers import NewPairsTrigger


class NewPairsSensor(ApplierTaskMixin, BaseSensorOperator):
    """Wait until a complete pair after the applied one is in the intermediate folder.

    Args:
        config_path: the configuration file; None discovers it (see ``ApplierHook``).
        config_variable: the Airflow Variable naming the configuration file.
        target_conn_id: the optional target connection.
        deferrable: wait in the triggerer (default) rather than poking from a worker.
        **kwargs: ``BaseSensorOperator`` arguments (``poke_interval``, ``timeout``, ``mode``, ...).
    """

    template_fields: Sequence[str] = ("config_path",)

    def __init__(
        self,
        *,
        config_path: str | None = None,
        config_variable: str = CONFIG_VARIABLE,
        target_conn_id: str = TARGET_CONN_ID,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.config_variable = config_variable
        self.target_conn_id = target_conn_id
        self.deferrable = deferrable

    def _look(self, context: Context) -> tuple[str, int, dict[str, Any] | None]:
        config = self.resolve(context).config
        with failing_on_bad_input():
            applied = CheckpointStore(config.work_dir).load().applied_seq
            listing = list_pairs(config.intermediate_dir, applied + 1)
        directory = str(config.intermediate_dir)
        found = new_pairs_event(directory, applied, [p.seq for p in listing.pairs]) if listing.pairs else None
        return directory, applied, found

    def poke(self, context: Context) -> PokeReturnValue:
        _, _, found = self._look(context)
        return PokeReturnValue(is_done=found is not None, xcom_value=found)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        directory, applied, found = self._look(context)
        if found is not None:
            return found
        self.log.info("no complete pair after %d in %s: deferring", applied, directory)
        self.defer(
            trigger=NewPairsTrigger(directory, applied, self.poke_interval),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Called when the trigger fires: the new pairs become the XCom."""
        self.log.info("new pairs %d..%d in %s", event["first_seq"], event["last_seq"], event["directory"])
        return event
