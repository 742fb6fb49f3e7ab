# The Spark job of compose/docker-compose.yml: spark_examples/ with PySpark, on Python 3.11.
# The official apache/spark images run Python 3.10 (Ubuntu 22.04), below what this project
# needs (>= 3.11), so this one takes Apache Spark from PyPI (pyspark, which ships
# spark-submit and Spark's jars) at the version the project pins, on Java 17.
# Build context: the repository root.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYSPARK_PYTHON=python3

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/kiln
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY storage ./storage
COPY cli ./cli
COPY spark_examples ./spark_examples
# The `spark` extra: pyspark at the pinned version. spark_examples is installed so that the
# job's script, run by path, imports its package. Spark's Kafka connector is not in this
# image: docker-compose.yml's spark-submit --packages fetches it, at the same version.
RUN pip install ".[spark]" \
    && useradd --create-home --uid 10002 spark \
    && mkdir -p /data \
    && chown spark /data

# Output and checkpoints (a named volume takes this directory's owner).
VOLUME /data
USER spark
WORKDIR /home/spark
