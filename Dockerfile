# Cairn's image: the `cairn` CLI, run as a coordinator (the default) or as workers.
# docker-compose.yml runs one of each next to Redis; `docker compose up --scale worker=N`
# adds workers. Nothing is fetched at run time: every dependency is installed here.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# bubblewrap: the sandbox workers run agents' commands in (docs/operations.md#the-sandbox;
# a worker container needs the security options named there). util-linux, which it also
# uses, is in every Debian image.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*

# Install the project (with the console's and the traces' extras) at the pinned versions,
# then drop the sources: the processes (and the worker processes they start) import the
# installed packages only.
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY storage ./storage
COPY agents ./agents
COPY coordinator ./coordinator
COPY cairn ./cairn
RUN pip install -c constraints.txt '.[console,otel]' && cd / && rm -rf /src

# A fixed uid, so every host mounting a shared archive agrees on who owns its files.
# /data/archive is the volume the coordinator and every worker share; the workspace
# caches in /data/cache stay in each container (every worker keeps its own).
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /data cairn \
    && mkdir -p /data/archive /data/cache /data/state \
    && chown -R cairn:cairn /data
ENV CAIRN_ARCHIVE_DIR=/data/archive \
    CAIRN_CACHE_DIR=/data/cache \
    CAIRN_STATE_DIR=/data/state
VOLUME ["/data/archive"]

# The example specs: `docker compose exec coordinator cairn submit examples/team.yaml --wait`.
WORKDIR /app
COPY examples ./examples

USER cairn
CMD ["cairn", "coordinator"]
