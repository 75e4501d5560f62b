#!/usr/bin/env bash
# Instructions a request, two gateway builds side by side, counted by callgrind: the same
# count on every run, where a throughput ratio on a shared VM moves by ±10% with the hour and
# a paired profile by ±5%. It counts user-space instructions only (not the kernel's work, not
# cache misses; a `rep movsb` copy counts a byte an instruction), so it finds what a change
# adds to the proxy's own work, and load.sh / ab_journal.sh give the wall-clock figures.
#
#   bash benches/instructions.sh BIN_A BIN_B [plain|stream] [seconds=8]
#
# A_TOML / B_TOML are appended to that side's config (`B_TOML='[storage]\njournal = "off"'`);
# A_OLD=1 / B_OLD=1 drop the translated pool from the config (a build older than it).
# Each gateway runs alone under valgrind (about fifty times slower), 20 connections from wrk
# after a warm-up; the counters are zeroed before the measured run and dumped after it.
# Needs valgrind and wrk. Nothing here runs in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/common.sh
A=${1:?usage: instructions.sh BIN_A BIN_B [plain|stream] [seconds]}
B=${2:?usage: instructions.sh BIN_A BIN_B [plain|stream] [seconds]}
CASE=${3:-plain}
SECS=${4:-8}
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }

TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
MOCK=$(port)
"$A" mock-upstream --listen 127.0.0.1:"$MOCK" --chunks 20 >/dev/null 2>&1 &
PIDS+=($!)
stream=false
[ "$CASE" = stream ] && stream=true
chat_script "$TMP/load.lua" "$stream"

for t in a b; do
  bin=$A; toml=${A_TOML:-}; old=${A_OLD:-}
  [ "$t" = b ] && { bin=$B; toml=${B_TOML:-}; old=${B_OLD:-}; }
  mkdir -p "$TMP/$t"
  MG=$(port)
  gateway_config "$TMP/$t" "$MG" "$(port)" "$MOCK"
  [ -n "$old" ] && sed -i '/^# The same mock spoken/,$d' "$TMP/$t/modelgate.toml"
  [ -n "$toml" ] && printf '%b\n' "$toml" >> "$TMP/$t/modelgate.toml"
  bin=$(readlink -f "$bin")
  (cd "$TMP/$t" && RUST_LOG=error exec valgrind --tool=callgrind --callgrind-out-file="$TMP/$t/cg.out" \
    "$bin" serve --config modelgate.toml >/dev/null 2>"$TMP/$t/valgrind.log") &
  pid=$!
  PIDS+=($pid)
  for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/"$MG") 2>/dev/null && break; sleep 0.2; done
  url="http://127.0.0.1:$MG/v1/chat/completions"
  wrk -t1 -c20 -d3s -s "$TMP/load.lua" "$url" >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  n=$(wrk -t1 -c20 -d"${SECS}"s -s "$TMP/load.lua" "$url" | awk '/requests in/ {print $1}')
  callgrind_control -d "$pid" >/dev/null 2>&1
  echo "$n" > "$TMP/$t/requests"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
done

python3 - "$TMP" <<'PY'
import collections, glob, re, subprocess, sys
tmp = sys.argv[1]

def per_request(side):
    """Instructions a request by function (its own, not its callees'), from the dump made
    after the measured run."""
    n = int(open(f"{tmp}/{side}/requests").read())
    dumps = sorted(glob.glob(f"{tmp}/{side}/cg.out.*"))
    dump = dumps[0] if dumps else f"{tmp}/{side}/cg.out"
    out = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", dump],
                         capture_output=True, text=True).stdout
    d = collections.Counter()
    total = 0
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*)", line)
        if not m:
            continue
        v = int(m.group(1).replace(",", "")) / n
        sym = re.sub(r" \[[^]]*\]$", "", m.group(2).strip())
        if "PROGRAM TOTALS" in sym:
            total = v
        else:
            d[re.sub(r"^\?\?\?:", "", sym)[:100]] += v
    return n, total, d

(na, ta, A), (nb, tb, B) = per_request("a"), per_request("b")
print(f"instructions a request: A {ta:,.0f} ({na} requests)  B {tb:,.0f} ({nb} requests)  A/B {ta / tb:.3f}")
print("\n       A        B      A-B  function (largest differences)")
skip = ("thread_start", "call_once{{vtable.shim}}", "start_thread", "clone")
keys = [k for k in set(A) | set(B) if not any(s in k for s in skip)]
for k in sorted(keys, key=lambda k: -abs(A[k] - B[k]))[:30]:
    print(f"{A[k]:8.0f} {B[k]:8.0f} {A[k] - B[k]:+8.0f}  {k}")
PY
