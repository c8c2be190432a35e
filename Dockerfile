# The regionbus image: the base package (the cache server, the gateway workers, the CLI and
# the client library). `regionbus` is the entry point, so a compose `command` is its
# arguments (default: `regionbus serve`). Spark jobs (`regionbus spark ...`) need the
# `spark` extra and a Java runtime, which this image does not ship; the flights demo needs
# the `demo` extra (build argument EXTRAS below).

# Build a wheel of the package only, so no source tree or build tool reaches the runtime.
FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11.11-slim-bookworm
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
# Extras of the package to install besides the base (client, cache server, gateways, CLI):
# empty for the servers' image; docker-compose.yml builds the demo's image with
# EXTRAS=demo, so the servers do not carry pandas and the flights data.
ARG EXTRAS=""
COPY --from=build /wheels /wheels
# Every dependency at the version docker/image-constraints.txt pins
# (scripts/pin_image_dependencies.py), so two builds of this file hold the same packages.
COPY docker/image-constraints.txt /wheels/constraints.txt
# The dependencies (confluent-kafka with librdkafka, hiredis, pandas) all come as
# manylinux wheels: nothing is compiled, so no compiler is installed.
RUN wheel="$(ls /wheels/*.whl)" \
    && pip install --constraint /wheels/constraints.txt "${wheel}${EXTRAS:+[$EXTRAS]}" \
    && rm -rf /wheels
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin regionbus
USER regionbus
WORKDIR /home/regionbus
# Prometheus metrics (REGIONBUS_METRICS_PORT in docker-compose.yml)
EXPOSE 9464
ENTRYPOINT ["regionbus"]
CMD ["serve"]
