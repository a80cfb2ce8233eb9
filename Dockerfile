# The asynctier image used by docker-compose.yml: `asynctier run scheduler|tailers|delay`.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY asynctier ./asynctier
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT ["asynctier"]
CMD ["run"]
