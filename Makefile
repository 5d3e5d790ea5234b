# Two commands for a newcomer: `make demo` and `make test`. Both set up first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(BIN)/python

.PHONY: setup demo airflow test test-fast lint clean

NATIVE := include/applier/intermediate/libimages.so
setup: $(VENV)/.installed $(NATIVE)

# Reinstall when the pins change. pyspark and pyspark-client share one package
# folder: both are pinned to one version and pyspark-client is never uninstalled.
$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps -e .
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/python -m applier.engine.jvm_archive  # Spark's classes, for a faster start
	touch $@

# The C pass over row images (include/applier/intermediate/native.py), loaded with ctypes; gcc builds it.
$(NATIVE): include/applier/intermediate/csrc/*.h include/applier/intermediate/csrc/*.c $(VENV)/.installed
	$(VENV)/bin/python -m applier.intermediate.native

# Airflow on embedded defaults: SQLite, logs and passwords under var/airflow, the
# project's DAGs and plugins, Spark in local mode, the demo configuration.
AIRFLOW_HOME_DIR := $(CURDIR)/var/airflow
AIRFLOW_ENV := AIRFLOW_HOME=$(AIRFLOW_HOME_DIR) \
	AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
	AIRFLOW__CORE__PLUGINS_FOLDER=$(CURDIR)/plugins \
	AIRFLOW__CORE__LOAD_EXAMPLES=False \
	AIRFLOW__CORE__PARALLELISM=2 \
	AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=sqlite:///$(AIRFLOW_HOME_DIR)/airflow.db \
	AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS=airflow_local_settings.connect_args \
	AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC=airflow_local_settings.connect_args \
	AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[*]"}' \
	APPLIER_CONFIG=$(CURDIR)/config/demo.yaml
PASSWORDS := $(AIRFLOW_HOME_DIR)/simple_auth_manager_passwords.json.generated

# A demo workload applied by the apply DAG (`airflow dags test`), then its summary.
demo: setup
	rm -rf var/demo
	mkdir -p var/demo $(AIRFLOW_HOME_DIR)/config
	cp config/airflow/airflow_local_settings.py $(AIRFLOW_HOME_DIR)/config/
	applier generate --out var/demo/intermediate --seed 1
	applier check var/demo/intermediate
	$(AIRFLOW_ENV) airflow db migrate > var/demo/airflow-db-migrate.log 2>&1
	@echo "airflow dags test applier (plan, apply, validate, report); its log: var/demo/airflow-dags-test.log"
	@$(AIRFLOW_ENV) airflow dags test applier > var/demo/airflow-dags-test.log 2>&1 \
		|| { tail -n 40 var/demo/airflow-dags-test.log; echo "the DAG run failed; see var/demo/airflow-dags-test.log"; exit 1; }
	@grep -Eo "(applier: cycle [0-9]+: |validating [0-9]+ tables|run [0-9]{8}T[^ ]+ \(|asset event: )[^[]*" \
		var/demo/airflow-dags-test.log || true
	@echo
	python -m applier.summary --config config/demo.yaml

# Airflow's UI and API at http://localhost:$(AIRFLOW_PORT) with the project's DAGs (Ctrl-C stops it).
# One setting moves it: `make airflow AIRFLOW_PORT=8090` sets the API server's port and its base URL, which
# the tasks' execution API URL follows (the port alone would leave tasks calling :8080).
AIRFLOW_PORT ?= 8080
airflow: setup
	mkdir -p $(AIRFLOW_HOME_DIR)/config
	cp config/airflow/airflow_local_settings.py $(AIRFLOW_HOME_DIR)/config/  # SQLite waits for its lock
	$(AIRFLOW_ENV) airflow db migrate > $(AIRFLOW_HOME_DIR)/db-migrate.log 2>&1
	@echo "Starting Airflow at http://localhost:$(AIRFLOW_PORT): log in as admin with the password Airflow generates into"
	@echo "  $(PASSWORDS)"
	@( for _ in $$(seq 300); do test -s $(PASSWORDS) && { echo; echo ">>> Airflow login: admin / $$(python -c \
		'import json, sys; print(json.load(open(sys.argv[1]))["admin"])' $(PASSWORDS))  (from $(PASSWORDS))"; \
		echo; break; }; sleep 1; done ) & \
	$(AIRFLOW_ENV) AIRFLOW__API__HOST=127.0.0.1 AIRFLOW__API__PORT=$(AIRFLOW_PORT) \
		AIRFLOW__API__BASE_URL=http://localhost:$(AIRFLOW_PORT) exec airflow standalone

lint: setup
	ruff check .
	mypy
	mypy dags/applier.py  # apart: the module name "applier" would clash with the package
	mypy dags/applier_extract.py dags/applier_materialize.py
	mypy bench  # the benchmark harness: scripts at the root, not a package of the library

# Debian's Chromium, which Playwright drives in the browser test (tests/test_browser_view.py).
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
$(CHROMIUM):
	@echo "installing Debian's chromium for the browser test"
	$(SUDO) apt-get install -y -q chromium > /dev/null || \
		{ $(SUDO) apt-get update -q > /dev/null && $(SUDO) apt-get install -y -q chromium > /dev/null; }

# Two workers, a test file at a time each (see README, Tests).
test: lint $(CHROMIUM)
	pytest -n 2 --dist loadfile

# The fast part alone: no Spark, Airflow or PostgreSQL.
test-fast: setup
	pytest -m "not slow and not spark and not postgres and not airflow"

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache $(NATIVE)
