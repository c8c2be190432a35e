# The regionbus image: the cache server, the CLI and the client library.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY clients ./clients
COPY schemas ./schemas
COPY gateways ./gateways
COPY spark ./spark
COPY demo ./demo
COPY bench ./bench
RUN pip install --no-cache-dir .
ENTRYPOINT ["regionbus"]
CMD ["serve"]
