# Two commands for a newcomer: `make demo` and `make test`. Both set up first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(BIN)/python

.PHONY: setup demo test test-fast lint clean

setup: $(VENV)/.installed

# Reinstall when the pins change. pyspark and pyspark-client share one package
# folder: both are pinned to one version and pyspark-client is never uninstalled.
$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

demo: setup
	rm -rf var/demo
	applier generate --out var/demo/intermediate --seed 1
	applier check var/demo/intermediate
	applier plan --config config/demo.yaml
	applier run --config config/demo.yaml
	applier status --config config/demo.yaml

lint: setup
	ruff check .
	mypy

test: lint
	pytest

# The fast part alone: no Spark, Airflow or PostgreSQL.
test-fast: setup
	pytest -m "not slow and not spark and not postgres and not airflow"

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
