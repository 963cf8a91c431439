# The project's images, one Dockerfile with a target each (docs/install-compose.md):
#
#   docker build --target rte     -t rte:dev .      the RTE (the last stage, so also the default)
#   docker build --target rte-app -t rte-app:dev .  the reference app
#   docker build --target host    -t rte-host:dev . a managed host with sshd, for compose and tests
#   docker build --target postgres -t rte-postgres:dev .  PostgreSQL for several app nodes (compose's ha profile)
#
# The bases are the registries' own images, so this builds unchanged wherever one answers;
# scripts/image makes stand-ins for them on a machine without a registry. Nothing secret is
# built in: tokens, certificates and ssh keys come at run time (environment and volumes).

ARG GO_IMAGE=golang:1.26-bookworm
ARG DEBIAN_IMAGE=debian:bookworm-slim

# ---- postgres: the store of several app nodes ----------------------------------------------
# Debian's PostgreSQL 15 on the same base as the other images, for compose's ha profile and the
# tests. The package would make a cluster at install time, with a password nobody chose, baked
# into the image; createcluster.conf stops that, and the entrypoint makes it in the volume at the
# first start instead, with POSTGRES_PASSWORD from the environment. It comes before the build
# stage because Docker's classic builder builds every stage before its target: built first, it
# compiles no Go.
FROM ${DEBIAN_IMAGE} AS postgres
RUN mkdir -p /etc/postgresql-common \
 && echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 tini \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data
COPY deploy/image/postgres-entrypoint /usr/local/bin/postgres-entrypoint
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data \
    POSTGRES_USER=rte \
    POSTGRES_DB=rte
VOLUME /var/lib/postgresql/data
USER postgres
WORKDIR /var/lib/postgresql
EXPOSE 5432
# Over TCP, as the app nodes come: ready only once the server takes connections on the network.
HEALTHCHECK --interval=2s --timeout=3s --start-period=30s --retries=15 \
  CMD ["sh", "-c", "pg_isready --quiet --host=127.0.0.1 --username=\"$POSTGRES_USER\" --dbname=\"$POSTGRES_DB\""]
# postgres stops cleanly on SIGINT (fast shutdown); SIGTERM would wait for every client to leave.
STOPSIGNAL SIGINT
ENTRYPOINT ["tini", "--", "postgres-entrypoint"]

# ---- build: static binaries ------------------------------------------------------------------
FROM ${GO_IMAGE} AS build
WORKDIR /src
# Modules first, so a change to the sources does not download them again. No plain
# `go mod download`: it would fetch every module go.mod names, the Helm SDK and the Kubernetes
# modules of the chart's tests among them, which no binary links. Building the binaries' largest
# dependencies downloads just their modules, and keeps them compiled in this layer's cache, which
# only a change of go.mod or go.sum makes stale; a change to the project's code then compiles
# only the project (minutes less on a small machine). Only a warm-up: what it leaves out is
# downloaded and compiled below.
COPY go.mod go.sum ./
ENV CGO_ENABLED=0
RUN go build -trimpath modernc.org/sqlite golang.org/x/crypto/ssh go.uber.org/zap \
      github.com/prometheus/client_golang/prometheus/promhttp github.com/klauspost/compress/zstd \
      github.com/gorilla/websocket github.com/caarlos0/env/v11 github.com/santhosh-tekuri/jsonschema/v6 \
      github.com/jackc/pgx/v5/pgxpool gopkg.in/yaml.v3 golang.org/x/text/message net/http crypto/tls
COPY . .
# VERSION stamps rte (rte version, its starting line, its hello to the app); without it, it
# says "devel". CGO is off (above): the SQLite driver is pure Go, and a static binary needs no
# libc of a particular version in the runtime stage.
ARG VERSION=devel
RUN go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.version=${VERSION}" -o /out/ ./cmd/rte ./cmd/rte-app

# ---- host: a managed host reached over ssh -------------------------------------------------
# Python is what ansible's modules need on a managed host. The host key and authorized_keys
# are not made here (they would be the same in every copy of the image): the entrypoint takes
# them from /etc/ssh/keys, a volume, at start.
FROM ${DEBIAN_IMAGE} AS host
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      openssh-server openssh-client python3 tini \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /etc/ssh/ssh_host_* \
 && useradd --create-home --shell /bin/bash ansible \
 && mkdir -p /run/sshd
COPY deploy/image/host-entrypoint deploy/image/make-ssh-keys /usr/local/bin/
EXPOSE 22
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=12 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/22 && head -c 4 <&3 | grep -q SSH-"]
ENTRYPOINT ["tini", "--", "host-entrypoint"]

# ---- rte-app: the reference app ------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS rte-app
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && useradd --system --uid 10002 --user-group --home-dir /var/lib/rte-app --create-home rte-app
COPY --from=build /out/rte-app /usr/local/bin/rte-app
COPY examples/playbooks /usr/share/rte-app/playbooks
COPY examples/inventory /usr/share/rte-app/inventory
ENV APP_LISTEN=0.0.0.0:8080 \
    APP_DB=/var/lib/rte-app/data/rte-app.db \
    APP_PLAYBOOKS_PATH=/usr/share/rte-app/playbooks \
    APP_INVENTORY_PATH=/usr/share/rte-app/inventory
RUN install -d -o rte-app -g rte-app -m 0700 /var/lib/rte-app/data
VOLUME /var/lib/rte-app/data
USER rte-app
WORKDIR /var/lib/rte-app
EXPOSE 8080
# The app answers the admin API only with APP_ADMIN_TOKEN, which its own environment holds;
# listing the runners shows the server and its store both answer.
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=12 \
  CMD ["rte-app", "runners"]
ENTRYPOINT ["tini", "--", "rte-app"]
CMD ["serve"]

# ---- rte: the runtime environment ----------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS rte
# ansible-core brings python3, which the health check uses too. tini is PID 1: ansible leaves
# orphans (ssh control masters, async tasks) that only an init reaps. The spool and the key are
# 0700: job output and the private key are the RTE user's alone (a new named volume takes the
# mode of the directory it is mounted on).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ansible-core openssh-client ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && useradd --system --uid 10001 --user-group --home-dir /home/rte --create-home --shell /usr/sbin/nologin rte \
 && install -d -o rte -g rte -m 0700 /home/rte/.ssh /var/lib/rte/spool /var/lib/rte/certificates \
 && install -d -o rte -g rte -m 0750 /var/lib/rte /var/lib/rte/cache /var/lib/rte/jobs
COPY --from=build /out/rte /usr/local/bin/rte
COPY deploy/image/rte-live /usr/local/bin/rte-live
# Every path is absolute, so the RTE does the same whatever its working directory.
ENV PORT=8000 \
    RTE_SPOOL_PATH=/var/lib/rte/spool \
    RTE_CACHE_PATH=/var/lib/rte/cache \
    RTE_WORK_PATH=/var/lib/rte/jobs \
    HTTPS_KEY=/var/lib/rte/certificates/key.pem \
    HTTPS_CERT=/var/lib/rte/certificates/cert.pem \
    HOME=/home/rte
# What must survive a restart: undelivered records, the bundle cache, and the certificate the
# app pinned (docs/backup.md).
VOLUME ["/var/lib/rte/spool", "/var/lib/rte/cache", "/var/lib/rte/certificates"]
USER rte
WORKDIR /var/lib/rte
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=12 CMD ["rte-live"]
ENTRYPOINT ["tini", "--", "rte"]
CMD ["serve"]
