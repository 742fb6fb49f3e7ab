# Kiln: the proxy and its `kiln` CLI (compose/docker-compose.yml builds it).
#   docker build -t kiln .
#   docker run -e KILN_REDIS_URL=redis://redis:6379/0 -e KILN_KAFKA_BOOTSTRAP=kafka:9092 kiln
# Configuration is KILN_* environment variables (docs/operations.md).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/kiln
# Every dependency ships wheels for this platform: no compiler needed.
COPY pyproject.toml README.md ./
COPY wire ./wire
COPY proxy ./proxy
COPY storage ./storage
COPY cli ./cli
RUN pip install . && useradd --system --uid 10001 --no-create-home kiln

USER kiln
# Kafka clients connect here; /metrics, /healthz and /readyz are served on 9644. One node
# per container (KILN_WORKERS=1): each worker would need its own published port; run more
# containers to use more cores.
ENV KILN_LISTEN=0.0.0.0:9092 \
    KILN_HTTP_LISTEN=0.0.0.0:9644 \
    KILN_WORKERS=1
EXPOSE 9092 9644
ENTRYPOINT ["kiln"]
CMD ["serve"]
