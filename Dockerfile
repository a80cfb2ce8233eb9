# The asynctier image: `asynctier run scheduler|tailers|delay|submitter`. docker-compose.yml
# and the Helm chart (deploy/helm/asynctier) run it; your functions go into an image built
# FROM it (deploy/helm/example/Dockerfile).
FROM python:3.11-slim
# no .pyc written at run time (the chart's root filesystem is read-only); logs unbuffered
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY asynctier ./asynctier
RUN pip install --no-cache-dir '.[tracing]'
# nobody, by number: Kubernetes' runAsNonRoot can check a number, not a name
USER 65534:65534
# SIGTERM goes to asynctier itself (exec form, PID 1): it drains, commits and exits
ENTRYPOINT ["asynctier"]
CMD ["run"]
