"""
### Extract: the PostgreSQL source's log into intermediate files

Each run is one bounded batch of `applier extract`: every transaction the
source committed up to its WAL end at the start (or `max_wal_mb` of WAL) is
written into intermediate-file pairs, durably, and only then is the slot moved
past them. The `applier` DAG applies the pairs on its own schedule.

- **extract**: the batch, in the worker (no Spark). Held back by flow control
  (the unapplied backlog above `extract.max_backlog_mb`), it ends early and
  succeeds, saying so. Skipped when another extractor (a `--follow`
  container, a batch still running) holds the folder's lock. Retried when the
  source cannot be reached; failed, without a retry, when the source holds
  something that cannot be extracted (the message names the table, column and
  value) or the configuration is wrong.

**Why a DAG of its own**: extraction is not held up by a slow apply run, nor
apply by a slow extraction; flow control couples them through the backlog.

**Configuration file**: as for the `applier` DAG, the Airflow Variable
`applier_config`, else `APPLIER_CONFIG`, else `config/demo.yaml`, read when
the task runs; it needs `source.*`.

**Schedule**: `APPLIER_EXTRACT_SCHEDULE` in the environment of the DAG
processor (a cron expression or preset; `none` for triggered runs only), every
minute by default. Runs are serial (`max_active_runs=1`).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Param

from applier_airflow.builders import schedule_from_env
from applier_airflow.extract_builders import EXTRACT_SCHEDULE
from applier_airflow.operators import ApplierExtractOperator

with DAG(
    dag_id="applier_extract",
    description="Extract the PostgreSQL source's committed transactions into intermediate files, a batch a run",
    doc_md=__doc__,
    schedule=schedule_from_env(os.environ.get("APPLIER_EXTRACT_SCHEDULE"), EXTRACT_SCHEDULE),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["applier", "cdc", "extract"],
    default_args={
        "owner": "applier",
        "retries": 1,
        "retry_delay": timedelta(seconds=30),
    },
    params={
        "max_wal_mb": Param(
            None,
            type=["null", "number"],
            exclusiveMinimum=0,
            title="Max WAL MiB",
            description="This batch reads at most this much WAL past the slot; empty = up to the WAL end.",
        ),
    },
) as dag:
    ApplierExtractOperator(task_id="extract")
