#!/usr/bin/env bash
# How the gateway scales with threads, in one run:
#   1. for each thread count N in THREADS (default "1,2"): bare Pingora (examples/bare_pingora.rs)
#      and modelgate with `threads = N`, each with the mock upstream (N threads), plain and
#      streamed chat: medians of ROUNDS interleaved rounds, and modelgate ÷ bare. With N below
#      the machine's cores the servers are pinned to CPUs 0..N-1 and wrk to the others (as
#      load.sh does at N = 1); at N = cores nothing is pinned.
#   2. on all cores: modelgate's default config (`threads` unset) against the same build with
#      `threads = cores`, all traffic on the `direct` listener; then the default config with
#      traffic on both listeners at once against one alone, and the proxy threads busy then.
# Same benchmark config as load.sh (auth, an rpm limit, permissions, metering, the usage
# record written, the access log off).
#   THREADS=1,2,4,8 DURATION=5 ROUNDS=3 CONNECTIONS=50 CHUNKS=20 bash benches/threads.sh
# (CONNECTIONS is per thread; NO_BUILD=1 uses the binaries in target/release as they are.)
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/common.sh

THREADS=${THREADS:-1,2}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-50}
CHUNKS=${CHUNKS:-20}
CORES=$(nproc)

if [ -z "${NO_BUILD:-}" ]; then
  command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
  bash scripts/install-deps.sh >/dev/null
  cargo build --release --quiet --bin modelgate --example bare_pingora
fi
BIN=$PWD/target/release/modelgate
BARE=$PWD/target/release/examples/bare_pingora
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

TMP=$(mktemp -d)
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done; PIDS=(); }
trap 'stop_all; rm -rf "$TMP"' EXIT

median() { python3 -c "import statistics,sys; print(statistics.median(map(float, sys.argv[1:])))" "$@"; }
ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }

# CPU sets for N server threads: "servers wrk" (taskset prefixes; empty when unpinned).
cpus_for() {
  if [ "$1" -lt "$CORES" ]; then
    echo "taskset -c 0-$(($1 - 1))|taskset -c $1-$((CORES - 1))"
  else
    echo "|"
  fi
}

# Starts a modelgate in folder $1 with the benchmark config, `threads` as $3 ("" leaves it
# unset); prints its pid.
start_gateway() { # $1 = dir, $2 = main port, $3 = threads or "", $4 = direct port, $5 = mock port, $6 = taskset
  mkdir -p "$1"
  gateway_config "$1" "$2" "$4" "$5"
  if [ -n "$3" ]; then sed -i "s/^threads = 1$/threads = $3/" "$1/modelgate.toml"; else sed -i '/^threads = 1$/d' "$1/modelgate.toml"; fi
  (cd "$1" && RUST_LOG=error exec $6 "$BIN" serve --config modelgate.toml) >"$1/stdout.log" &
  echo $!
}

# One run of wrk: its req/s. $1 = port, $2 = script, $3 = wrk threads, $4 = connections,
# $5 = taskset, $6 = path.
rps() {
  local out
  out=$($5 wrk -t"$3" -c"$4" -d"${DURATION}s" -s "$2" "http://127.0.0.1:$1$6")
  if grep -q "Non-2xx" <<<"$out"; then echo "non-2xx responses: $out" >&2; exit 1; fi
  awk '/Requests\/sec/ {print $2}' <<<"$out"
}

chat_script "$TMP/plain.lua" false
chat_script "$TMP/stream.lua" true
PATH_CHAT=/v1/chat/completions

echo "machine: $CORES cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo "each figure: the median of $ROUNDS interleaved rounds of ${DURATION}s, $CONNECTIONS connections a thread, $CHUNKS chunks a streamed reply"
printf '\n%-8s %-8s %12s %12s %9s   %s\n' threads case "bare req/s" "modelgate" "÷ bare" "(servers; wrk)"
IFS=, read -r -a counts <<<"$THREADS"
for n in "${counts[@]}"; do
  IFS='|' read -r srv load <<<"$(cpus_for "$n")"
  wrk_threads=$n
  [ "$n" -lt "$CORES" ] && wrk_threads=$(( CORES - n < n ? CORES - n : n ))
  conns=$((CONNECTIONS * n))
  MOCK=$(port); BP=$(port); MG=$(port); MGD=$(port)
  RUST_LOG=error $srv "$BIN" mock-upstream --listen "127.0.0.1:$MOCK" --chunks "$CHUNKS" --threads "$n" & PIDS+=($!)
  RUST_LOG=error $srv "$BARE" "127.0.0.1:$BP" "127.0.0.1:$MOCK" "$n" & PIDS+=($!)
  PIDS+=("$(start_gateway "$TMP/mg$n" "$MG" "$n" "$MGD" "$MOCK" "$srv")")
  for p in $MOCK $BP $MG; do wait_port "$p"; done
  for case in plain stream; do
    for p in $BP $MG; do $load wrk -t"$wrk_threads" -c"$conns" -d1s -s "$TMP/$case.lua" "http://127.0.0.1:$p$PATH_CHAT" >/dev/null; done
    b=(); m=()
    for _ in $(seq "$ROUNDS"); do
      b+=("$(rps "$BP" "$TMP/$case.lua" "$wrk_threads" "$conns" "$load" "$PATH_CHAT")")
      m+=("$(rps "$MG" "$TMP/$case.lua" "$wrk_threads" "$conns" "$load" "$PATH_CHAT")")
    done
    bm=$(median "${b[@]}"); mm=$(median "${m[@]}")
    printf '%-8s %-8s %12.0f %12.0f %9s   (%s; %s)\n' "$n" "$case" "$bm" "$mm" "$(ratio "$mm" "$bm")" \
      "${srv:-any CPU}" "${load:-any CPU}, $wrk_threads wrk threads"
  done
  stop_all
done

# Part 2, on every core, nothing pinned.
conns=$((CONNECTIONS * CORES))
MOCK=$(port); DM=$(port); DD=$(port); CM=$(port); CD=$(port)
RUST_LOG=error "$BIN" mock-upstream --listen "127.0.0.1:$MOCK" --chunks "$CHUNKS" --threads "$CORES" & PIDS+=($!)
DEFAULT_PID=$(start_gateway "$TMP/default" "$DM" "" "$DD" "$MOCK" ""); PIDS+=("$DEFAULT_PID")
PIDS+=("$(start_gateway "$TMP/cores" "$CM" "$CORES" "$CD" "$MOCK" "")")
for p in $MOCK $DD $CD; do wait_port "$p"; done
for p in $DD $CD; do wrk -t"$CORES" -c"$conns" -d1s -s "$TMP/plain.lua" "http://127.0.0.1:$p$PATH_CHAT" >/dev/null; done
d=(); c=()
for _ in $(seq "$ROUNDS"); do
  d+=("$(rps "$DD" "$TMP/plain.lua" "$CORES" "$conns" "" "$PATH_CHAT")")
  c+=("$(rps "$CD" "$TMP/plain.lua" "$CORES" "$conns" "" "$PATH_CHAT")")
done
dm=$(median "${d[@]}"); cm=$(median "${c[@]}")
echo
echo "all $CORES cores, plain chat, all traffic on direct:"
printf '  default config (threads unset) %10.0f req/s\n' "$dm"
printf '  threads = %-3s                  %10.0f req/s   default ÷ threads = cores: %s\n' "$CORES" "$cm" "$(ratio "$dm" "$cm")"

# Both listeners at once (half the connections each), the default config: their total
# against one listener alone, and how many of its threads were busy (over a tenth of the run
# on CPU).
# Each thread's CPU ticks, with whether it is a proxy thread (Pingora names the service's
# runtime threads after it, "modelgate api").
task_ticks() {
  for t in /proc/"$1"/task/*; do
    kind=other; [[ "$(cat "$t/comm")" == "modelgate api"* ]] && kind=proxy
    awk -v t="${t##*/}" -v k="$kind" '{print t, k, $14 + $15}' "$t/stat"
  done
}
both=()
for _ in $(seq "$ROUNDS"); do
  task_ticks "$DEFAULT_PID" > "$TMP/ticks.before"
  rps "$DM" "$TMP/plain.lua" "$(( (CORES + 1) / 2 ))" "$((conns / 2))" "" "$PATH_CHAT" > "$TMP/main.rps" &
  one=$!
  rps "$DD" "$TMP/plain.lua" "$(( (CORES + 1) / 2 ))" "$((conns / 2))" "" "$PATH_CHAT" > "$TMP/direct.rps"
  wait "$one"
  task_ticks "$DEFAULT_PID" > "$TMP/ticks.after"
  both+=("$(python3 -c "print($(cat "$TMP/main.rps") + $(cat "$TMP/direct.rps"))")")
done
busy=$(python3 - "$TMP/ticks.before" "$TMP/ticks.after" "$DURATION" <<'PY'
import sys
def read(path):
    return {t: (k, int(v)) for t, k, v in (l.split() for l in open(path))}
before, after = read(sys.argv[1]), read(sys.argv[2])
ticks = float(sys.argv[3]) * 100
busy = [k for t, (k, v) in after.items() if v - before.get(t, (k, 0))[1] > ticks / 10]
print(f"{busy.count('proxy')} proxy + {busy.count('other')} other")
PY
)
bothm=$(median "${both[@]}")
printf '  default config, both listeners  %9.0f req/s   ÷ one listener alone: %s; busy threads %s (cores %s)\n' \
  "$bothm" "$(ratio "$bothm" "$dm")" "$busy" "$CORES"
