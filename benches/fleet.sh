#!/usr/bin/env bash
# The fleet benches with one command: starts a throwaway Postgres (Debian's postgresql, a fresh
# cluster in a temp dir, default durability settings) and Redis (no persistence) on loopback,
# runs `cargo bench --bench fleet` against them, and stops both.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install-deps.sh --test >/dev/null

TMP="$(mktemp -d)"
PG_BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PG_PORT="$(free_port)"; REDIS_PORT="$(free_port)"
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" -eq 0 ] && chown postgres:postgres "$TMP"
cleanup() {
  as_pg "$PG_BIN/pg_ctl" -D "$TMP/pg" -m fast -w stop >/dev/null 2>&1 || true
  [ -n "${REDIS_PID:-}" ] && kill "$REDIS_PID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

as_pg "$PG_BIN/initdb" -D "$TMP/pg" -U postgres --auth=trust -E UTF8 >/dev/null
printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\nshared_buffers = 256MB\n" \
  "$PG_PORT" "$TMP" >> "$TMP/pg/postgresql.auto.conf"
as_pg "$PG_BIN/pg_ctl" -D "$TMP/pg" -l "$TMP/pg.log" -w start >/dev/null
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" >/dev/null &
REDIS_PID=$!
until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.05; done

echo "== Postgres $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT, $(redis-server --version | awk '{print $1, $3}') on 127.0.0.1:$REDIS_PORT"
MODELGATE_BENCH_PG="postgres://postgres@127.0.0.1:$PG_PORT/postgres" \
MODELGATE_BENCH_REDIS="redis://127.0.0.1:$REDIS_PORT" \
  cargo bench --bench fleet
