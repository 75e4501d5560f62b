#!/usr/bin/env bash
# Load benchmark: the mock upstream alone, then modelgate in front of the same mock, in one
# run, for chat (plain) and chat (streamed). Prints req/s of each and the ratio
# gateway/direct, for modelgate as configured (metered) and for the same build with metering
# switched off (MODELGATE_METERING=off), so the cost of metering shows. Traffic stays on
# 127.0.0.1.
# Each case runs ROUNDS rounds; a round measures direct, modelgate and modelgate without
# metering for DURATION/ROUNDS seconds each, one after the other, and the medians are
# reported. Interleaving keeps slow drift of a shared machine out of the comparison.
#   DURATION=15 ROUNDS=5 CONNECTIONS=32 CHUNKS=16 bash benches/load.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-15}
ROUNDS=${ROUNDS:-5}
CONNECTIONS=${CONNECTIONS:-32}
CHUNKS=${CHUNKS:-16}
THREADS=${THREADS:-1}

command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
bash scripts/install-deps.sh >/dev/null
cargo build --release --quiet
BIN=target/release/modelgate

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MOCK=$(port); MAIN=$(port); DIRECT=$(port); MAIN2=$(port); DIRECT2=$(port)
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

KEY=sk-bench-key-000000000000
cat > "$TMP/modelgate.toml" <<TOML
[listeners]
main = "127.0.0.1:$MAIN"
direct = "127.0.0.1:$DIRECT"
[keys]
file = "keys.toml"
[server]
threads = $THREADS
grace_period_seconds = 0
[[pools]]
name = "mock"
upstreams = ["http://127.0.0.1:$MOCK"]
[[models]]
name = "echo-1"
pool = "mock"
TOML
printf '[[keys]]\nid = "bench"\nsecret = "%s"\n' "$KEY" > "$TMP/keys.toml"
mkdir -p "$TMP/off"
sed -e "s/$MAIN/$MAIN2/; s/$DIRECT/$DIRECT2/" "$TMP/modelgate.toml" > "$TMP/off/modelgate.toml"
cp "$TMP/keys.toml" "$TMP/off/keys.toml"

RUST_LOG=error "$BIN" mock-upstream --listen "127.0.0.1:$MOCK" --chunks "$CHUNKS" & PIDS+=($!)
RUST_LOG=error "$BIN" serve --config "$TMP/modelgate.toml" & PIDS+=($!)
RUST_LOG=error MODELGATE_METERING=off "$BIN" serve --config "$TMP/off/modelgate.toml" & PIDS+=($!)
for p in $MOCK $DIRECT $DIRECT2; do
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done
done

lua() { # $1 = false | true | usage (streamed, the client asks for include_usage itself)
  local stream=$1 extra=""
  if [ "$1" = usage ]; then stream=true; extra=',"stream_options":{"include_usage":true}'; fi
  cat > "$TMP/$1.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"echo-1","stream":$stream$extra,"messages":[{"role":"user","content":"hello there, how are you"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $KEY"
LUA
  echo "$TMP/$1.lua"
}

SLICE=$(python3 -c "print(max(1, round($DURATION / $ROUNDS)))")
rps() { # $1 = url, $2 = lua
  wrk -t1 -c"$CONNECTIONS" -d"${SLICE}s" -s "$2" "$1" | awk '/Requests\/sec/ {print $2}'
}
median() { python3 -c "import statistics,sys; print(f'{statistics.median(map(float, sys.argv[1:])):.0f}')" "$@"; }

printf '%-16s %12s %16s %7s %18s %7s\n' "case" "direct" "modelgate" "ratio" "metering off" "ratio"
for stream in false true usage; do
  script=$(lua $stream)
  # Warm every path (connection pools, page cache) before measuring.
  for p in $MOCK $DIRECT $DIRECT2; do
    wrk -t1 -c"$CONNECTIONS" -d1s -s "$script" "http://127.0.0.1:$p/v1/chat/completions" >/dev/null
  done
  ds=(); gs=(); us=()
  for _ in $(seq "$ROUNDS"); do
    ds+=("$(rps "http://127.0.0.1:$MOCK/v1/chat/completions" "$script")")
    gs+=("$(rps "http://127.0.0.1:$DIRECT/v1/chat/completions" "$script")")
    us+=("$(rps "http://127.0.0.1:$DIRECT2/v1/chat/completions" "$script")")
  done
  d=$(median "${ds[@]}"); g=$(median "${gs[@]}"); u=$(median "${us[@]}")
  case $stream in false) name="chat plain" ;; true) name="chat streamed" ;; *) name="streamed+usage" ;; esac
  printf '%-16s %12s %16s %7s %18s %7s\n' "$name" "$d" "$g" "$(python3 -c "print(f'{$g/$d:.2f}')")" \
    "$u" "$(python3 -c "print(f'{$u/$d:.2f}')")"
done
echo "(medians of $ROUNDS interleaved rounds of ${SLICE}s per target, $CONNECTIONS connections, $CHUNKS chunks per reply, gateway threads=$THREADS, $(nproc) cores shared by wrk, mock and gateways)"
