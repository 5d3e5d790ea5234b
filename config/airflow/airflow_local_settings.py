"""Airflow's local settings on SQLite (`make airflow`, `make demo` and the tests copy it into `$AIRFLOW_HOME/config`).

SQLite lets one writer at a time, and Python's driver gives up after waiting
five seconds for the lock. With the scheduler, the DAG processor and the API
server writing, a UI click could then fail with HTTP 500: the trigger form's
"unpause on trigger" was lost that way, leaving the triggered run queued
behind a paused DAG. A minute's wait is what a person at the UI would rather
have. ``[database] sql_alchemy_connect_args`` (and ``_async``) name these.
"""

connect_args = {"timeout": 60}
