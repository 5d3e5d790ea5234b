"""
### The Applier: apply cycles of change-data-capture files to the target

Each run applies the complete intermediate-file pairs that arrived since the
last one, in apply cycles, then validates the tables it changed and reports.

- **plan**: lists the new pairs and the cycles they make (XCom); skips the rest
  when there is nothing new (and the run is no replay) or when `plan_only` is set.
- **apply**: submits `jobs/apply.py` through the `spark_default` connection; the
  job records its cycles in the run ledger under the run key.
- **validate**: Great Expectations on every table the run touched; a failed
  expectation fails the task naming the table.
- **report**: the run's figures in the log and XCom, and an asset event per
  changed table (through the asset alias `applier_target_tables`).
- **check_lag**: every run, once apply is done whatever became of it (nothing
  new, a dry run, a failed or skipped apply): the age of the oldest unapplied
  commit against `alert.max_lag_seconds`. Over it, the task fails with one line
  naming the configuration, the lag and the threshold, and its notifier posts
  the alert to the webhook of the connection `applier_alert` (logged only
  without it). Beside validate and report, so it neither waits for nor hides them.

**Configuration file**: the Airflow Variable `applier_config`, else the
environment variable `APPLIER_CONFIG`, else `config/demo.yaml`; read when a
task runs, never when this file is parsed. An optional connection
`applier_target` (type `fs`, extra `{"path": "/folder"}`) overrides the target folder.

**Schedule**: `APPLIER_SCHEDULE` in the environment of the DAG processor
(a cron expression or preset; `none` for triggered runs only), every five
minutes by default. Runs are serial (`max_active_runs=1`).

**Recovery**: a backfill with `--reprocess-behavior completed` replays the
cycles each past run recorded (same logical date, same run key).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Param, TriggerRule

from applier_airflow.builders import schedule_from_env
from applier_airflow.lag import ApplierLagOperator
from applier_airflow.notifier import ApplierWebhookNotifier
from applier_airflow.operators import (
    ApplierPlanOperator,
    ApplierReportOperator,
    ApplierSubmitOperator,
    ApplierValidateOperator,
)

with DAG(
    dag_id="applier",
    description="Apply change-data-capture files to the target in apply cycles, validate, report",
    doc_md=__doc__,
    schedule=schedule_from_env(os.environ.get("APPLIER_SCHEDULE")),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["applier", "cdc", "delta"],
    default_args={
        "owner": "applier",
        "retries": 2,
        "retry_delay": timedelta(minutes=1),
    },
    params={
        # Numbers are declared with two numeric types (a whole number: multipleOf 1): Airflow's form then
        # draws a text field that keeps what was typed, or says why not. Its number field clamps a value
        # below the minimum to the minimum and blanks "1e3" (the run would take the default): silently.
        "max_cycles": Param(
            None,
            type=["null", "integer", "number"],
            minimum=0,
            multipleOf=1,
            title="Max cycles",
            description="Apply cycles in this run; 0 = until caught up; empty = apply.max_cycles_per_run.",
        ),
        "process_intermediate_size_per_job": Param(
            None,
            type=["null", "number", "integer"],
            minimum=0,
            title="MiB per cycle",
            description="Overrides apply.process_intermediate_size_per_job; 0 = every available file.",
        ),
        "buffer_size_for_split_records": Param(
            None,
            type=["null", "integer", "number"],
            minimum=1,
            multipleOf=1,
            title="Buffer bytes per open transaction",
            description="Overrides apply.buffer_size_for_split_records.",
        ),
        "plan_only": Param(False, type="boolean", title="Plan only", description="Dry run: plan, apply nothing."),
        "skip_validation": Param(False, type="boolean", title="Skip validation", description="Do not validate."),
    },
) as dag:
    plan = ApplierPlanOperator(task_id="plan")
    apply = ApplierSubmitOperator(task_id="apply", conn_id="spark_default")
    validate = ApplierValidateOperator(task_id="validate")
    # Runs when validation passed or was skipped by the param, never after a failed one.
    report = ApplierReportOperator(task_id="report", trigger_rule=TriggerRule.NONE_FAILED)
    # Every run, once apply is done, whatever became of it: a stuck or idle pipeline is when lag grows.
    # A leaf beside report, not after it: a run whose apply or validation failed stays failed
    # whatever the check finds, and a lag alert costs no asset event.
    check_lag = ApplierLagOperator(
        task_id="check_lag",
        trigger_rule=TriggerRule.ALL_DONE,
        on_failure_callback=ApplierWebhookNotifier(conn_id="applier_alert"),
    )
    plan >> apply >> validate >> report
    apply >> check_lag
