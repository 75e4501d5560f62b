#!/usr/bin/env bash
# Paired CPU profile of two gateway builds under the same load: where each spends its CPU per
# request, by symbol, and the difference ("paired profile"): finer than load.sh's ratios, whose
# noise is a few percent, when a change moves a request by half a microsecond.
#
#   bash benches/profile.sh BIN_A BIN_B [plain|stream] [seconds=10] [rounds=3]
#
# BIN_B may be `bare` for the bare-Pingora baseline (examples/bare_pingora.rs, release build).
# B_TOML is appended to B's config (`B_TOML='[storage]\njournal = "off"'`: one build, a setting
# on and off).
# Both run pinned to CPU 0 with the mock upstream, wrk on CPU 1 (50 connections); the rounds
# alternate A and B, `perf record -e cpu-clock` samples the whole process (every thread: the
# usage writer's share is counted) and the samples are divided by the requests wrk made.
# Needs perf (Debian `linux-perf`) and wrk. Nothing here runs in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/common.sh
A=${1:?usage: profile.sh BIN_A BIN_B [plain|stream] [seconds] [rounds]}
B=${2:?usage: profile.sh BIN_A BIN_B [plain|stream] [seconds] [rounds]}
CASE=${3:-plain}
SECS=${4:-10}
ROUNDS=${5:-3}
command -v perf >/dev/null || { echo "perf is missing: apt-get install linux-perf" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
if [ "$B" = bare ]; then
  cargo build --release --quiet --example bare_pingora
  BARE=target/release/examples/bare_pingora
fi

TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
MOCK=$(port)
taskset -c 0 "$A" mock-upstream --listen 127.0.0.1:"$MOCK" --chunks 20 >/dev/null 2>&1 &
PIDS+=($!)
declare -A PID_OF PORT_OF
for t in a b; do
  MG=$(port)
  mkdir -p "$TMP/$t"
  if [ "$t" = b ] && [ -n "${BARE:-}" ]; then
    RUST_LOG=error taskset -c 0 "$BARE" 127.0.0.1:"$MG" 127.0.0.1:"$MOCK" &
  else
    gateway_config "$TMP/$t" "$MG" "$(port)" "$MOCK"
    [ "$t" = b ] && [ -n "${B_TOML:-}" ] && printf '%b\n' "$B_TOML" >> "$TMP/$t/modelgate.toml"
    bin=$A
    [ "$t" = b ] && bin=$B
    bin=$(readlink -f "$bin")
    (cd "$TMP/$t" && RUST_LOG=error exec taskset -c 0 "$bin" serve --config modelgate.toml) &
  fi
  PIDS+=($!)
  PID_OF[$t]=$!
  PORT_OF[$t]=$MG
  wait_port "$MG"
done
stream=false
[ "$CASE" = stream ] && stream=true
chat_script "$TMP/load.lua" "$stream"
url() { echo "http://127.0.0.1:${PORT_OF[$1]}/v1/chat/completions"; }
for t in a b; do taskset -c 1 wrk -t1 -c50 -d1s -s "$TMP/load.lua" "$(url $t)" >/dev/null; done
for r in $(seq "$ROUNDS"); do
  for t in a b; do
    perf record -q -e cpu-clock -F 2999 -p "${PID_OF[$t]}" -o "$TMP/$t.$r.data" -- sleep "$SECS" >/dev/null 2>&1 &
    rec=$!
    out=$(taskset -c 1 wrk -t1 -c50 -d"${SECS}"s -s "$TMP/load.lua" "$(url $t)")
    wait "$rec" || true
    echo "$t $r $(echo "$out" | awk '/requests in/ {print $1}')" >> "$TMP/counts"
  done
done

python3 - "$TMP" <<'PY'
import collections, re, subprocess, sys
tmp = sys.argv[1]
counts = {}
for line in open(f"{tmp}/counts"):
    t, r, n = line.split()
    counts[f"{t}.{r}"] = int(n)

def per_request(tag):
    """µs of CPU per request by (object, symbol): cpu-clock periods are ns."""
    out = subprocess.run(
        ["perf", "report", "-i", f"{tmp}/{tag}.data", "--stdio", "--no-children",
         "--sort", "dso,sym", "-F", "period,dso,sym"],
        capture_output=True, text=True).stdout
    d = collections.Counter()
    for line in out.splitlines():
        m = re.match(r"\s+(\d+)\s+(\S+)\s+\[.\]\s+(.*)", line)
        if m:
            dso = m.group(2)
            if dso not in ("[kernel.kallsyms]", "[vdso]") and not dso.startswith("lib"):
                dso = "binary"
            d[(dso, m.group(3).strip()[:90])] += int(m.group(1)) / counts[tag] / 1000
    return d

avg = {}
for side in "ab":
    tags = [k for k in counts if k.startswith(side + ".")]
    total = collections.Counter()
    for tag in tags:
        for k, v in per_request(tag).items():
            total[k] += v / len(tags)
    avg[side] = total
A, B = avg["a"], avg["b"]
print("requests per round:", " ".join(f"{k}={v}" for k, v in sorted(counts.items())))
print(f"µs of CPU a request: A {sum(A.values()):.1f}  B {sum(B.values()):.1f}")
for dso in ("binary", "[kernel.kallsyms]", "libc.so.6"):
    a = sum(v for k, v in A.items() if k[0] == dso)
    b = sum(v for k, v in B.items() if k[0] == dso)
    print(f"  {dso:18} A {a:5.1f}  B {b:5.1f}")
print("\n     A      B    A-B  symbol (largest differences)")
for k in sorted(set(A) | set(B), key=lambda k: -abs(A[k] - B[k]))[:30]:
    print(f"{A[k]:6.2f} {B[k]:6.2f} {A[k] - B[k]:+6.2f}  {k[0][:6]} {k[1]}")
PY
