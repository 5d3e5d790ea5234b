"""The Airflow side of the Applier: a hook, operators, a deferrable sensor and its trigger.

Thin on purpose: every decision is a pure function in :mod:`applier_airflow.builders`
and every piece of work is the ``applier`` library's. Importing this package
looks nothing up and starts nothing, so DAG files can import it at parse time.
"""
