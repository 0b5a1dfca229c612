#!/usr/bin/env bash
# A throw-away local PostgreSQL server for tests and development (trust authentication: never expose it).
#
#   scripts/pg-localhost.sh start DIR PORT   # initdb DIR/data if needed, start on 127.0.0.1:PORT, print the URL
#   scripts/pg-localhost.sh stop DIR
#
# The unix socket and the log (DIR/postgres.log) live in DIR. Run as root, the server runs as the `postgres`
# user (DIR is chown'ed to it; its parent directories must be traversable); as any other user, as that user.
# Installs the Debian `postgresql` package when the binaries are missing and we are root.
# Prints exactly one line on stdout: postgresql+psycopg://dl2d:dl2d@127.0.0.1:PORT/dl2d
set -euo pipefail

usage() { echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2; }
log() { echo "pg-localhost: $*" >&2; }

find_bindir() {
  if [ -n "${PG_BINDIR:-}" ]; then echo "$PG_BINDIR"; return; fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return; fi
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then pg_config --bindir; fi
}

ensure_installed() {
  BINDIR=$(find_bindir)
  if [ -z "$BINDIR" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      log "installing the Debian postgresql package"
      apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
      BINDIR=$(find_bindir)
    fi
  fi
  [ -n "$BINDIR" ] || { log "PostgreSQL server binaries not found (install the postgresql package)"; exit 1; }
}

as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
ensure_installed

case "$cmd" in
  start)
    port=${3:-}; [ -n "$port" ] || usage
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    if [ ! -f "$dir/data/PG_VERSION" ]; then
      as_owner "$BINDIR/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    if as_owner "$BINDIR/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
      log "already running in $dir"
    else
      as_owner "$BINDIR/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
        start >&2 || { cat "$dir/postgres.log" >&2; exit 1; }
    fi
    psql=("$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres -d postgres)
    if [ "$("${psql[@]}" -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'dl2d'")" != 1 ]; then
      "${psql[@]}" -c "CREATE ROLE dl2d LOGIN PASSWORD 'dl2d'" >&2
    fi
    if [ "$("${psql[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname = 'dl2d'")" != 1 ]; then
      "${psql[@]}" -c "CREATE DATABASE dl2d OWNER dl2d" >&2
    fi
    echo "postgresql+psycopg://dl2d:dl2d@127.0.0.1:$port/dl2d"
    ;;
  stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
      as_owner "$BINDIR/pg_ctl" -D "$dir/data" -m fast -w stop >&2
    fi
    ;;
  *) usage ;;
esac
