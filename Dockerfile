# The one image of docker-compose.yaml: Airflow 3 with the project's pinned
# requirements, a Java runtime for Spark, and the `applier` library.
#
# Every service runs it (the Airflow components, the Spark master and the Spark
# worker), so that the Spark driver (in the Airflow task) and the executors (on
# the Spark worker) have the same Python, pyspark, pyarrow and applier.
#
#   docker compose build            # or: docker build -t cdc-applier:local .
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}
ARG AIRFLOW_VERSION

USER root
# Spark 4.1 runs on Java 17 or 21: the distribution's default JRE is either. gcc builds the C pass over row images.
RUN apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless gcc libc6-dev \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
# Mount points of the named volumes, owned by the airflow user so that a new
# volume starts writable by it (Docker copies the ownership into the volume).
# The var/demo paths are where config/demo.yaml puts its files.
RUN mkdir -p /opt/airflow/var/demo/intermediate /opt/airflow/var/demo/output /opt/airflow/var/demo/target \
        /opt/airflow/auth /tmp/spark-work \
    && chown -R airflow:root /opt/airflow/var /opt/airflow/auth /tmp/spark-work

USER airflow
# Pinning apache-airflow again keeps pip from moving the image's Airflow.
COPY --chown=airflow:root requirements.txt /opt/cdc-applier/requirements.txt
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /opt/cdc-applier/requirements.txt
COPY --chown=airflow:root pyproject.toml README.md /opt/cdc-applier/
COPY --chown=airflow:root include /opt/cdc-applier/include
RUN pip install --no-cache-dir --no-deps /opt/cdc-applier \
    && python -m applier.intermediate.native  # the C pass over row images, beside the installed package
