#!/usr/bin/env bash
# The gateway's cost, in one run: the same mock upstream behind
#   - nginx (`proxy_pass`, one worker, upstream keep-alive),
#   - a bare Pingora 0.9 ProxyHttp (examples/bare_pingora.rs: `upstream_peer` only, same
#     server settings as modelgate),
#   - modelgate with everything a request goes through: auth, an rpm limit, permissions,
#     metering, the usage record written to SQLite (the access log off, as in the others).
# The servers are pinned to CPU 0 and wrk to CPU 1 (PIN=0 to share both cores). Each case
# runs ROUNDS interleaved rounds (nginx, bare, modelgate, DURATION seconds each) and reports
# medians: req/s, p50/p99 latency, CPU time per request of the proxy process, and the ratios
# to bare Pingora and to nginx. Then: RSS of each proxy holding SLOW concurrent slow streams
# (and after they close), and IDLE_CONNS connections whose requests have not come, and the
# usage writer alone.
#   DURATION=5 ROUNDS=3 PACED_ROUNDS=5 CONNECTIONS=50 CHUNKS=20 SLOW=2000 IDLE_STREAMS=10000
#   IDLE_CONNS=5000
#   PACE_MS=10 bash benches/load.sh
# (CASES="plain" runs only some of the throughput cases (plain, stream, translated: a stream
# translated to Anthropic's API and back, models), CASES="" none of them; ALT_BIN=path
# adds another modelgate build side by side.)
# (WRITER=0 skips the writer-alone figure and the build of its bench.)
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/common.sh

DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
# The half-rate case's p99s are the medians of more rounds: its figure is a difference of two
# tails, and moved by ±0.3 ms between runs of 3.
PACED_ROUNDS=${PACED_ROUNDS:-5}
CONNECTIONS=${CONNECTIONS:-50}
CHUNKS=${CHUNKS:-20}
SLOW=${SLOW:-2000}
IDLE_STREAMS=${IDLE_STREAMS:-10000}
IDLE_CONNS=${IDLE_CONNS:-5000}
PIN=${PIN:-1}

need() { # $1 = command, $2 = Debian package
  command -v "$1" >/dev/null && return
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
need wrk wrk
need nginx nginx-light
bash scripts/install-deps.sh >/dev/null
cargo build --release --quiet --bin modelgate --example bare_pingora
[ "${WRITER:-1}" = 1 ] && cargo bench --quiet --bench store --no-run 2>/dev/null
BIN=target/release/modelgate
BARE=target/release/examples/bare_pingora
NGINX=$(command -v nginx)
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

if [ "$PIN" = 1 ] && [ "$(nproc)" -ge 2 ]; then SRV="taskset -c 0"; LOAD="taskset -c 1"; else SRV=""; LOAD=""; fi

MOCK=$(port); NG=$(port); BP=$(port); MG=$(port); MGD=$(port); MGA=$(port)
TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 0.2; rm -rf "$TMP"; }
trap cleanup EXIT

gateway_config "$TMP" "$MG" "$MGD" "$MOCK" "$MGA"

mkdir -p "$TMP/nginx"
cat > "$TMP/nginx/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/error.log error;
worker_rlimit_nofile 65536;
events { worker_connections 32768; }
http {
  access_log off;
  client_body_temp_path $TMP/nginx; proxy_temp_path $TMP/nginx;
  fastcgi_temp_path $TMP/nginx; uwsgi_temp_path $TMP/nginx; scgi_temp_path $TMP/nginx;
  upstream mock { server 127.0.0.1:$MOCK; keepalive 1024; keepalive_timeout 2s; }
  server {
    listen 127.0.0.1:$NG;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
NGINX

RUST_LOG=error $SRV "$BIN" mock-upstream --listen "127.0.0.1:$MOCK" --chunks "$CHUNKS" & PIDS+=($!)
$SRV "$NGINX" -c "$TMP/nginx/nginx.conf" -p "$TMP/nginx" & PIDS+=($!); NGINX_MASTER=$!
RUST_LOG=error $SRV "$BARE" "127.0.0.1:$BP" "127.0.0.1:$MOCK" & PIDS+=($!); BARE_PID=$!
(cd "$TMP" && RUST_LOG=error exec $SRV "$OLDPWD/$BIN" serve --config modelgate.toml) & PIDS+=($!); MG_PID=$!
for p in $MOCK $NG $BP $MG; do wait_port "$p"; done
NGINX_WORKER=$(pgrep -P "$NGINX_MASTER" | head -1)
declare -A PID_OF=([nginx]=$NGINX_WORKER [bare]=$BARE_PID [modelgate]=$MG_PID)
declare -A PORT_OF=([nginx]=$NG [bare]=$BP [modelgate]=$MG)
TARGETS=(nginx bare modelgate)
# ALT_BIN=path adds a second modelgate build as target `alt` (same config, own ports and
# store): an A/B of two builds in the same run, e.g. another allocator.
if [ -n "${ALT_BIN:-}" ]; then
  ALT=$(port); ALTD=$(port); mkdir -p "$TMP/alt"
  gateway_config "$TMP/alt" "$ALT" "$ALTD" "$MOCK" "$(port)"
  (cd "$TMP/alt" && RUST_LOG=error exec $SRV "$ALT_BIN" serve --config modelgate.toml) & PIDS+=($!)
  PID_OF[alt]=$!; PORT_OF[alt]=$ALT; TARGETS+=(alt)
  wait_port "$ALT"
fi
declare -A IDLE=()
for t in "${TARGETS[@]}"; do IDLE[$t]=$(awk '/VmRSS/ {print $2}' "/proc/${PID_OF[$t]}/status"); done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
script() { # $1 = plain | stream | translated | models
  case $1 in
    plain) chat_script "$TMP/$1.lua" false ;;
    stream) chat_script "$TMP/$1.lua" true ;;
    # Streamed chat for a model whose pool speaks Anthropic's API: modelgate translates the
    # request and every event of the reply (nginx and bare Pingora pass the same request to
    # the mock's chat endpoint, as for `stream`).
    translated) chat_script "$TMP/$1.lua" true claude-bench ;;
    models)
      printf 'wrk.headers["Authorization"] = "Bearer %s"\n' "$KEY" > "$TMP/$1.lua" ;;
  esac
  echo "$TMP/$1.lua"
}
path_of() { case $1 in models) echo /v1/models ;; *) echo /v1/chat/completions ;; esac; }

# One measurement: "rps p50_ms p99_ms cpu_us_per_request".
measure() { # $1 = target, $2 = case
  local pid=${PID_OF[$1]} before after out
  before=$(cpu_ticks "$pid")
  out=$($LOAD wrk -t1 -c"${CONNS_OVERRIDE:-$CONNECTIONS}" -d"${DURATION}s" --latency -s "${SCRIPT_OVERRIDE:-$(script "$2")}" \
    "http://127.0.0.1:${PORT_OF[$1]}$(path_of "$2")")
  after=$(cpu_ticks "$pid")
  python3 - "$out" "$before" "$after" "$DURATION" <<'PY'
import re, sys
out, before, after, dur = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
def ms(label):
    m = re.search(label + r"%\s+([\d.]+)(us|ms|s)", out)
    v, u = float(m.group(1)), m.group(2)
    return v / 1000 if u == "us" else v * 1000 if u == "s" else v
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
if errors:
    sys.exit(f"non-2xx responses in the run:\n{out}")
cpu_us = (after - before) * 10_000 / max(rps * dur, 1)   # ticks are 10 ms
print(f"{rps:.0f} {ms('50'):.3f} {ms('99'):.3f} {cpu_us:.1f}")
PY
}

median() { python3 -c "import statistics,sys; print(statistics.median(map(float, sys.argv[1:])))" "$@"; }

echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); servers on ${SRV:-any CPU}, wrk on ${LOAD:-any CPU}"
echo "open files: $(ulimit -n) a process (a proxy holds two a stream, its client's and its upstream's: \"fds held\" below)"
echo "each case: medians of $ROUNDS interleaved rounds of ${DURATION}s per target, $CONNECTIONS connections, $CHUNKS chunks per streamed reply"
printf '\n%-14s %-10s %10s %9s %9s %11s %9s %9s\n' case target "req/s" "p50 ms" "p99 ms" "CPU µs/req" "÷ bare" "÷ nginx"
declare -A MG_CPU=()
for case in ${CASES-plain stream translated models}; do
  for t in "${TARGETS[@]}"; do # warm connection pools and caches
    $LOAD wrk -t1 -c"$CONNECTIONS" -d1s -s "$(script $case)" "http://127.0.0.1:${PORT_OF[$t]}$(path_of $case)" >/dev/null
  done
  declare -A R=() P50=() P99=() CPU=()
  for _ in $(seq "$ROUNDS"); do
    for t in "${TARGETS[@]}"; do
      read -r rps p50 p99 cpu < <(measure "$t" "$case")
      R[$t]+=" $rps"; P50[$t]+=" $p50"; P99[$t]+=" $p99"; CPU[$t]+=" $cpu"
    done
  done
  declare -A M=()
  for t in "${TARGETS[@]}"; do M[$t]=$(median ${R[$t]}); done
  for t in "${TARGETS[@]}"; do
    printf '%-14s %-10s %10.0f %9.3f %9.3f %11.1f %9.2f %9.2f\n' "$case" "$t" "${M[$t]}" \
      "$(median ${P50[$t]})" "$(median ${P99[$t]})" "$(median ${CPU[$t]})" \
      "$(python3 -c "print(${M[$t]}/${M[bare]})")" "$(python3 -c "print(${M[$t]}/${M[nginx]})")"
  done
  [ "$case" = plain ] && PEAK_PLAIN=${M[modelgate]}
  MG_CPU[$case]=$(median ${CPU[modelgate]})
  unset R P50 P99 CPU M
done
if [ -n "${MG_CPU[translated]:-}" ] && [ -n "${MG_CPU[stream]:-}" ]; then
  printf '\ntranslated stream (OpenAI client, Anthropic-speaking upstream): modelgate %.1f CPU µs/req against %.1f passed through (%+.1f µs, %.2f×)\n' \
    "${MG_CPU[translated]}" "${MG_CPU[stream]}" \
    "$(python3 -c "print(${MG_CPU[translated]} - ${MG_CPU[stream]})")" \
    "$(python3 -c "print(${MG_CPU[translated]} / ${MG_CPU[stream]})")"
fi

# Latency at half of modelgate's peak plain rate, the same rate for every target: each
# connection waits PACE_MS between a reply and its next request (wrk's `delay`, whole ms), and
# as many connections as make that rate are opened: first as if replies took no time, then
# scaled by the rate modelgate made in a 2 s trial (a reply's own latency adds to each
# connection's pause). The added p99 is modelgate's minus bare Pingora's.
if [ -n "${PEAK_PLAIN:-}" ]; then
  half=$(python3 -c "print(round($PEAK_PLAIN / 2))")
  pause=${PACE_MS:-10}
  paced=$TMP/paced.lua
  cat "$(script plain)" > "$paced"
  printf 'function delay()\n  return %s\n end\n' "$pause" >> "$paced"
  conns=$(python3 -c "print(max(1, round($half * $pause / 1000)))")
  trial=$($LOAD wrk -t1 -c"$conns" -d2s -s "$paced" "http://127.0.0.1:$MG/v1/chat/completions" | awk '/Requests\/sec/ {print $2}')
  conns=$(python3 -c "print(max(1, round($conns * $half / max(float('$trial'), 1))))")
  printf '\nplain chat at half of modelgate peak (%s req/s offered: %s connections, %s ms apart; medians of %s rounds)\n' "$half" "$conns" "$pause" "$PACED_ROUNDS"
  printf '%-14s %10s %9s %9s %11s %14s\n' target "req/s" "p50 ms" "p99 ms" "CPU µs/req" "p99 over bare"
  declare -A R=() P50=() P99=() CPU=()
  for _ in $(seq "$PACED_ROUNDS"); do
    for t in "${TARGETS[@]}"; do
      read -r rps p50 p99 cpu < <(SCRIPT_OVERRIDE=$paced CONNS_OVERRIDE=$conns measure "$t" plain)
      R[$t]+=" $rps"; P50[$t]+=" $p50"; P99[$t]+=" $p99"; CPU[$t]+=" $cpu"
    done
  done
  bare99=$(median ${P99[bare]})
  for t in "${TARGETS[@]}"; do
    p99=$(median ${P99[$t]})
    printf '%-14s %10.0f %9.3f %9.3f %11.1f %11.3f ms\n' "$t" "$(median ${R[$t]})" "$(median ${P50[$t]})" \
      "$p99" "$(median ${CPU[$t]})" "$(python3 -c "print($p99 - $bare99)")"
  done
  unset R P50 P99 CPU
fi

# Connections that are open and have sent nothing, or only the start of a request's header:
# what each proxy holds for a connection before its request is in (benches/hold.py). Read 1 s
# after all are open, within modelgate's `client_header_timeout_ms` (10 s), which then closes
# them. Before the streams: a proxy that keeps what it freed (glibc's malloc in bare Pingora)
# would count nothing after them.
conns_rss() { # $1 = connections, $2 = idle | partial
  printf '\n%-22s %11s %11s %13s\n' "$1 connections, $2" "RSS before" "RSS held" "a connection"
  for t in "${TARGETS[@]}"; do
    pid=${PID_OF[$t]}
    before=$(rss_kib "$pid")
    $LOAD python3 benches/hold.py "${PORT_OF[$t]}" "$1" "$2" > "$TMP/hold.out" &
    hold=$!
    for _ in $(seq 100); do grep -q open "$TMP/hold.out" 2>/dev/null && break; sleep 0.1; done
    sleep 1
    held=$(rss_kib "$pid")
    kill "$hold"; wait "$hold" 2>/dev/null || true
    printf '%-22s %8.1f MB %8.1f MB %10.1f KB\n' "$t" "$(python3 -c "print($before/1024)")" \
      "$(python3 -c "print($held/1024)")" "$(python3 -c "print(($held-$before)/$1)")"
    sleep 2
  done
}
conns_rss "$IDLE_CONNS" idle
conns_rss "$IDLE_CONNS" partial

# Slow streams: N clients each holding a stream whose events come DELAY ms apart, for a few
# seconds; RSS of each proxy before, at its peak, while all are held (the last sample before
# they close: past the burst of their start), and 3 s and 10 s after they closed. Upstream
# connections idle in each proxy's pool are closed after 2 s (modelgate's pool
# `keepalive_timeout_ms`, nginx's upstream `keepalive_timeout`; bare Pingora keeps them).
streams_rss() { # $1 = streams, $2 = ms between events, $3 = seconds held
  cat > "$TMP/slow.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"echo-1","stream":true,"messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $KEY"
wrk.headers["x-mock-delay-ms"] = "$2"
LUA
  printf '\n%-22s %9s %11s %11s %11s %13s %13s %9s\n' "$1 streams, ${2} ms" "RSS idle" "RSS before" "RSS peak" "RSS held" "3 s after" "10 s after" "fds held"
  for t in "${TARGETS[@]}"; do
    pid=${PID_OF[$t]}
    before=$(rss_kib "$pid"); peak=$before; held=$before; fds=0
    $LOAD wrk -t2 -c"$1" -d"$3"s --timeout 30s -s "$TMP/slow.lua" "http://127.0.0.1:${PORT_OF[$t]}/v1/chat/completions" >/dev/null 2>&1 &
    load=$!
    while kill -0 "$load" 2>/dev/null; do
      now=$(rss_kib "$pid"); [ "$now" -gt "$peak" ] && peak=$now; held=$now
      fds=$(ls "/proc/$pid/fd" | wc -l); sleep 0.2
    done
    sleep 3; after3=$(rss_kib "$pid")
    sleep 7; after10=$(rss_kib "$pid")
    printf '%-22s %6.1f MB %8.1f MB %8.1f MB %8.1f MB %10.1f MB %10.1f MB %9s\n' "$t" "$(python3 -c "print(${IDLE[$t]}/1024)")" \
      "$(python3 -c "print($before/1024)")" "$(python3 -c "print($peak/1024)")" "$(python3 -c "print($held/1024)")" \
      "$(python3 -c "print($after3/1024)")" "$(python3 -c "print($after10/1024)")" "$fds"
  done
}
# A burst of short streams (about 2 s each), then many held open and quiet (20 s each; wrk
# stops after 6 s, when every one is open).
streams_rss "$SLOW" 100 4
streams_rss "$IDLE_STREAMS" 1000 6

# The usage writer: its wakes per record under the plain-chat load above, and its throughput
# alone (benches/store.rs).
writer_tid=$(grep -l usage-writer /proc/"$MG_PID"/task/*/comm | head -1 | xargs dirname)
wakes() { awk '/voluntary_ctxt_switches/ && !/non/ {print $2}' "$writer_tid/status"; }
writer_ticks() { awk '{print $14 + $15}' "$writer_tid/stat"; }
w0=$(wakes); t0=$(writer_ticks); c0=$(cpu_ticks "$MG_PID")
out=$($LOAD wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" -s "$(script plain)" "http://127.0.0.1:$MG/v1/chat/completions")
w1=$(wakes); t1=$(writer_ticks); c1=$(cpu_ticks "$MG_PID")
reqs=$(echo "$out" | awk '/requests in/ {print $1}')
queued=$(curl -s "http://127.0.0.1:$MGA/metrics" | awk '/^modelgate_usage_records_queued / {print $2}')
echo
echo "usage writer under plain-chat load: $((w1 - w0)) wakes for $reqs records ($(python3 -c "print(f'{$reqs/max($w1-$w0,1):.0f}')") records per wake), ${queued:-?} records not yet committed shortly after the load stopped, RSS then $(python3 -c "print(f'{$(rss_kib "$MG_PID")/1024:.1f}')") MB"
# Its CPU beside the proxy's on the shared core (clock ticks of 10 ms: about ±2%).
python3 -c "print(f'usage writer CPU under that load: {($t1-$t0)*10_000/max($reqs,1):.1f} µs a record, {100*($t1-$t0)/max($c1-$c0,1):.1f}% of the gateway process')"
if [ "${WRITER:-1}" = 1 ]; then
  "$(ls -t target/release/deps/store-* | grep -v '\.d$' | head -1)" --bench writer | tail -1
fi
