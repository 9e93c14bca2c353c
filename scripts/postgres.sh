#!/usr/bin/env bash
# A throw-away PostgreSQL server for running the Prefect server of the tests on PostgreSQL.
#
#   scripts/postgres.sh up       install Debian's postgresql if needed, initialise a cluster in
#                                the state dir, start it on 127.0.0.1, create role + db
#                                `prefect`, print the export line; safe to run twice
#   scripts/postgres.sh down     stop it (the data stay in the state dir); safe to run twice
#   scripts/postgres.sh status   running or not, and the URL
#
#   eval "$(scripts/postgres.sh up)"   # sets TRAINMEDIC_TEST_DATABASE_URL for the tests
#
# Environment: TRAINMEDIC_PG_DIR (state dir, default /var/tmp/trainmedic-pg),
# TRAINMEDIC_PG_PORT (default 54329).
#
# The cluster is private to the state dir (data, socket, log) so it never touches a system
# cluster on 5432. It is a test database: fsync is off. The role `prefect` may create
# databases, so that each test stack can use a fresh database of its own. Only stdout carries
# the export line; progress goes to stderr so `eval "$(... up)"` is safe.
set -euo pipefail

DIR="${TRAINMEDIC_PG_DIR:-/var/tmp/trainmedic-pg}"
PORT="${TRAINMEDIC_PG_PORT:-54329}"
DATA="$DIR/data"
LOG="$DIR/postgres.log"
USER_NAME=prefect
PASSWORD=prefect
URL="postgresql+asyncpg://$USER_NAME:$PASSWORD@127.0.0.1:$PORT/prefect"

LOG_TAG=postgres.sh
# shellcheck source=scripts/lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

[[ "$PORT" =~ ^[0-9]+$ && "$PORT" -ge 1024 && "$PORT" -le 65535 ]] || die "TRAINMEDIC_PG_PORT=$PORT: out of range"

# Newest installed major version's server binaries (Debian keeps them off PATH).
pg_bindir() {
    local dir
    dir=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
    [[ -n "$dir" && -x "$dir/initdb" && -x "$dir/pg_ctl" ]] || return 1
    printf '%s\n' "$dir"
}

install_packages() {
    pg_bindir >/dev/null && return 0
    apt_install postgresql
    pg_bindir >/dev/null || die "postgresql installed but no initdb/pg_ctl under /usr/lib/postgresql"
}

# Run a server binary as the cluster's owner: postgres refuses to run as root.
as_owner() {
    if [[ $(id -u) == 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

running() {
    local bin
    bin=$(pg_bindir) || return 1
    [[ -f "$DATA/PG_VERSION" ]] || return 1
    as_owner "$bin/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

psql_admin() {
    local bin
    bin=$(pg_bindir)
    as_owner "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$DIR" -p "$PORT" -U postgres -d postgres
}

init_cluster() {
    local bin=$1
    [[ -f "$DATA/PG_VERSION" ]] && return 0
    log "initialising a cluster in $DATA"
    mkdir -p "$DIR"
    [[ $(id -u) == 0 ]] && chown postgres: "$DIR"
    chmod 700 "$DIR"
    # As root the server runs as `postgres` and peer auth maps that user; otherwise the
    # invoking user owns the cluster and the socket in the private dir is trusted.
    local auth_local=trust
    [[ $(id -u) == 0 ]] && auth_local=peer
    as_owner "$bin/initdb" -D "$DATA" -U postgres --auth-local="$auth_local" \
        --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >&2
    cat >>"$DATA/postgresql.conf" <<EOF

# scripts/postgres.sh: a private test cluster
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
EOF
}

cmd_up() {
    install_packages
    local bin started=$SECONDS
    bin=$(pg_bindir)
    init_cluster "$bin"
    if running; then
        log "already running on 127.0.0.1:$PORT ($DATA)"
    else
        if ! as_owner "$bin/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >&2; then
            tail -n 20 "$LOG" >&2 || true
            die "postgres did not start (log: $LOG)"
        fi
        log "started on 127.0.0.1:$PORT in $((SECONDS - started)) s"
    fi
    # Idempotent: the role's password is (re)set, the database made only when missing.
    psql_admin <<EOF
SELECT 'CREATE ROLE $USER_NAME LOGIN'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$USER_NAME')\gexec
ALTER ROLE $USER_NAME LOGIN CREATEDB PASSWORD '$PASSWORD';
SELECT 'CREATE DATABASE prefect OWNER $USER_NAME'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'prefect')\gexec
EOF
    printf 'export TRAINMEDIC_TEST_DATABASE_URL=%s\n' "$URL"
}

cmd_down() {
    local bin
    if ! running; then
        log "not running"
        return 0
    fi
    bin=$(pg_bindir)
    as_owner "$bin/pg_ctl" -D "$DATA" -m fast -w -t 30 stop >&2
    log "stopped"
}

cmd_status() {
    if running; then
        echo "running on 127.0.0.1:$PORT ($DATA): $URL"
    else
        echo "not running ($DATA)"
        return 1
    fi
}

run_command "up down status" "$@"
