"""
### Materialize: add a table to running replication

Triggered, with the table and the mode as params (no schedule). The task
records the subscription and runs one bounded batch of `applier extract`,
which copies the table consistently with the change stream; the `applier` DAG
then applies the copy and the table's changes. When another extractor holds
the intermediate folder (a `--follow` container, the `applier_extract` DAG's
batch), the subscription stays recorded and that extractor copies the table.

- **atomic**: a snapshot fixed under a `SHARE` lock held for milliseconds,
  applied, truncate first, in one target transaction with the switch-over.
- **incremental**: the same snapshot in chunks of `chunk_rows`, each its own
  source transaction.
- **nonatomic**: no lock and no long transaction: chunks in key order between
  low and high watermarks (DBLog); collisions in the copy's window are
  autocorrected. Needs a primary key.

`applier subscriptions` lists the states (defined, materializing, activating,
active, valid, recovering); a failed subscription fails the task with its
message and waits for `--resume` or `--drop`. See docs/materialization.md.

**Configuration file**: as for the `applier` DAG; it needs `source.*`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import DAG, Param

from applier_airflow.extract_builders import MODES
from applier_airflow.materialize import ApplierSubscribeOperator

with DAG(
    dag_id="applier_materialize",
    description="Add a table to running replication: subscribe it and copy it (atomic, incremental, nonatomic)",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["applier", "cdc", "extract"],
    default_args={"owner": "applier", "retries": 0},
    params={
        "table": Param(
            "public.example",
            type="string",
            pattern=r"^[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*$",
            title="Table",
            description="The source table, schema.table.",
        ),
        "mode": Param("atomic", enum=list(MODES), title="Mode", description="atomic, incremental or nonatomic."),
        "chunk_rows": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            maximum=1_000_000,
            title="Chunk rows",
            description="Rows per chunk (incremental, nonatomic); empty = materialize.chunk_rows.",
        ),
    },
) as dag:
    ApplierSubscribeOperator(task_id="subscribe")
