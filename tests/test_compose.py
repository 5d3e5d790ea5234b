"""``docker-compose.yaml`` holds together without a Docker engine.

The file is interpolated with its defaults (an empty environment), validated
against the Compose Specification JSON schema, and checked for what matters to
the Applier: Airflow 3's four components on PostgreSQL after an init service,
``spark_default`` pointing at the Spark master, and the intermediate files,
output and target shared by the Spark driver and the executors at the paths
``config/demo.yaml`` names.

``tests/compose_spec.json`` is the schema docker-compose 1.29.2 validates with
(``compose/config/compose_spec.json`` of Debian's ``docker-compose`` package,
from the compose-spec project, Apache-2.0), kept here so that the check needs
no package; ``docker-compose config`` itself is run by hand (see
docs/notes/readme-cluster.md).
"""

from __future__ import annotations

import copy
import json
import posixpath
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCHEMA = Path(__file__).with_name("compose_spec.json")
AIRFLOW_COMPONENTS = {
    "airflow-api-server": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}
SHARED_VOLUMES = ("intermediate", "output", "target")
_VARIABLE = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<sep>:?-)(?P<default>[^}]*))?\})")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable substitution: ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}``, ``$$``."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group("name"), match.group("default") or ""
        value = env.get(name)
        # ":-" takes the default when the variable is unset or empty, "-" only when unset.
        if value is None or (value == "" and match.group("sep") == ":-"):
            return default
        return value

    return _VARIABLE.sub(substitute, value)


def validation_errors(document: dict[str, Any]) -> list[str]:
    """Every Compose Specification violation of ``document``, as ``path: message``."""
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft201909Validator(schema)
    return sorted(f"{e.json_path}: {e.message}" for e in validator.iter_errors(document))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """docker-compose.yaml as Compose reads it with no variables set (every default in force)."""
    document: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    return dict(interpolate(document, {}))


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "environments are written as mappings"
    return {k: str(v) for k, v in env.items()}


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """A service's mounts as ``{container path: source}`` (short syntax ``source:target[:mode]``)."""
    out = {}
    for spec in service.get("volumes", []):
        source, target = spec.split(":")[:2]
        out[target] = source
    return out


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    assert validation_errors(compose) == []


def test_the_schema_check_refuses_an_unknown_service_key(compose: dict[str, Any]) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["spark-worker"]["replica"] = 2
    errors = validation_errors(broken)
    assert len(errors) == 1 and errors[0].startswith("$.services['spark-worker']:") and "'replica'" in errors[0]


def test_every_reference_between_services_and_volumes_resolves(compose: dict[str, Any]) -> None:
    services, volumes = compose["services"], set(compose["volumes"])
    for name, service in services.items():
        assert set(service.get("depends_on", {})) <= set(services), f"{name}: depends on an unknown service"
        named = {source for source in mounts(service).values() if not source.startswith((".", "/"))}
        assert named <= volumes, f"{name}: undeclared volumes {named - volumes}"
        for source in mounts(service).values():
            if source.startswith("./"):
                assert (REPO / source).is_dir(), f"{name}: mounts {source}, missing from the repository"


def test_airflow_runs_its_four_components_on_postgres_after_an_init_service(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {name: services[name].get("command") for name in AIRFLOW_COMPONENTS} == AIRFLOW_COMPONENTS
    init_script = services["airflow-init"]["command"][0]
    assert "airflow db migrate" in init_script
    assert "SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in init_script, "the init service sets the admin's password"
    assert services["postgres"]["image"].startswith("postgres:")
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]
    for name in [*AIRFLOW_COMPONENTS, "airflow-init"]:
        env = environment(services[name])
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:airflow@postgres:")
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-api-server:8080/execution/"
        assert env["AIRFLOW__API_AUTH__JWT_SECRET"], f"{name}: every component shares one JWT secret"
    for name in AIRFLOW_COMPONENTS:
        assert services[name]["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "airflow-init": {"condition": "service_completed_successfully"},
        }, name
        assert "healthcheck" in services[name], f"{name} has no healthcheck"


def test_spark_default_points_at_the_master_the_worker_joins(compose: dict[str, Any]) -> None:
    services = compose["services"]
    master, worker = services["spark-master"], services["spark-worker"]
    assert master["command"][:5] == [
        "org.apache.spark.deploy.master.Master",
        "--host",
        "spark-master",
        "--port",
        "7077",
    ]
    assert master["hostname"] == "spark-master"
    assert worker["command"][:2] == ["org.apache.spark.deploy.worker.Worker", "spark://spark-master:7077"]
    assert worker["command"][worker["command"].index("--cores") + 1] == "2"
    for name in AIRFLOW_COMPONENTS:
        assert environment(services[name])["AIRFLOW_CONN_SPARK_DEFAULT"] == "spark://spark-master:7077", name
    # Driver and executors run the same image, so the same Python and libraries.
    images = {services[name]["image"] for name in [*AIRFLOW_COMPONENTS, "spark-master", "spark-worker"]}
    assert images == {"cdc-applier:local"}
    assert services["spark-master"]["build"] == {"context": ".", "dockerfile": "Dockerfile"}


def test_driver_and_executors_share_the_paths_the_configuration_names(compose: dict[str, Any]) -> None:
    services = compose["services"]
    scheduler, worker = services["airflow-scheduler"], services["spark-worker"]
    config_file = environment(scheduler)["APPLIER_CONFIG"]
    assert mounts(scheduler)[posixpath.dirname(config_file)] == "./config"
    demo = yaml.safe_load((REPO / "config" / Path(config_file).name).read_text())
    in_container = {
        "intermediate": demo["intermediate_dir"],
        "output": demo["output_dir"],
        "target": demo["target"]["path"],
    }
    for volume, relative in in_container.items():
        path = posixpath.normpath(posixpath.join(posixpath.dirname(config_file), relative))
        assert mounts(scheduler).get(path) == volume, f"the driver does not see volume {volume} at {path}"
        assert mounts(worker).get(path) == volume, f"the executors do not see volume {volume} at {path}"
    expected_project = {
        "/opt/airflow/dags": "./dags",
        "/opt/airflow/plugins": "./plugins",
        "/opt/airflow/include": "./include",
        "/opt/airflow/jobs": "./jobs",
    }
    assert {k: v for k, v in mounts(scheduler).items() if k in expected_project} == expected_project
    assert environment(worker)["PYSPARK_PYTHON"] == environment(scheduler)["PYSPARK_PYTHON"] == "python"
    assert set(SHARED_VOLUMES) <= set(compose["volumes"])


def test_the_follow_extractor_is_a_service_of_its_own_profile_on_the_schedulers_folders(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    extractor, scheduler = services["applier-extractor"], services["airflow-scheduler"]
    assert extractor["profiles"] == ["extract"]  # not started by a plain `up`: it needs source.*
    script = extractor["command"][-1]
    assert "--setup" in script and script.endswith('applier extract --config "$APPLIER_CONFIG" --follow')
    assert extractor["stop_signal"] == "SIGTERM"  # --follow ends after the batch in hand
    assert mounts(extractor) == mounts(scheduler)  # the intermediate folder the apply DAG reads
    assert environment(extractor)["APPLIER_CONFIG"] == environment(scheduler)["APPLIER_CONFIG"]


def test_the_image_extends_the_pinned_airflow_with_the_project_requirements() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    pinned = re.search(r"^apache-airflow==(\S+)$", (REPO / "requirements.txt").read_text(), re.MULTILINE)
    assert pinned is not None
    assert f"ARG AIRFLOW_VERSION={pinned.group(1)}\n" in dockerfile
    assert "FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}\n" in dockerfile
    assert "ARG PYTHON_VERSION=3.11\n" in dockerfile
    assert re.search(r"pip install .*-r /opt/cdc-applier/requirements.txt", dockerfile)
    assert "default-jre-headless" in dockerfile, "the Spark driver and executors need Java"


def test_interpolation_takes_the_environment_before_the_default() -> None:
    env = {"POSTGRES_PASSWORD": "s3cret", "EMPTY": ""}
    assert interpolate("a:${POSTGRES_PASSWORD:-airflow}@b", env) == "a:s3cret@b"
    assert interpolate("${MISSING:-x} ${EMPTY:-y} ${EMPTY-z} ${MISSING} $${HOSTNAME}", env) == "x y   ${HOSTNAME}"
    assert interpolate({"k": ["${POSTGRES_PASSWORD}"], "n": 3}, env) == {"k": ["s3cret"], "n": 3}
