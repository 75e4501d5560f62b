#!/usr/bin/env bash
# Three gateways side by side: "base" (BASE_BIN, an older build), "head" (HEAD_BIN, the crash
# journal on, as by default) and "off" (HEAD_BIN with [storage] journal = "off"); each one
# thread on GW_CPU, the mock on MOCK_CPUS, wrk on WRK_CPUS; plain and streamed chat in ROUNDS
# interleaved rounds of DUR seconds; then the medians and head/base, off/base, head/off.
# Made for a many-core machine (defaults: gateway CPU 0, mock 2-5, wrk 8-15); binaries are
# carried there prebuilt, with wrk. Not part of the tests.
#   BASE_BIN=… HEAD_BIN=target/release/modelgate ROUNDS=7 DUR=4 bash benches/ab_journal.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/common.sh
ROUNDS=${ROUNDS:-7}; DUR=${DUR:-4}; C=${C:-50}
BASE_BIN=$(realpath "${BASE_BIN:?an older build to compare with}")
HEAD_BIN=$(realpath "${HEAD_BIN:-target/release/modelgate}")
TMP=$(mktemp -d); PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null || true; done' EXIT
MOCK=$(port)
taskset -c "${MOCK_CPUS:-2-5}" "$HEAD_BIN" mock-upstream --listen 127.0.0.1:$MOCK --chunks 20 --threads 4 >/dev/null 2>&1 & PIDS+=($!)
for t in base head off; do
  mkdir -p $TMP/$t; M=$(port); D=$(port); gateway_config $TMP/$t $M $D $MOCK
  [ $t = off ] && printf '[storage]\njournal = "off"\n' >> $TMP/$t/modelgate.toml
  bin=$HEAD_BIN; [ $t = base ] && bin=$BASE_BIN
  echo $M > $TMP/$t/port
  (cd $TMP/$t && RUST_LOG=error exec taskset -c "${GW_CPU:-0}" "$bin" serve --config modelgate.toml >/dev/null 2>&1) & PIDS+=($!)
done
for t in base head off; do wait_port "$(cat $TMP/$t/port)"; done
chat_script $TMP/plain.lua false; chat_script $TMP/stream.lua true
for c in plain stream; do
  for t in base head off; do taskset -c "${WRK_CPUS:-8-15}" wrk -t2 -c$C -d1s -s $TMP/$c.lua "http://127.0.0.1:$(cat $TMP/$t/port)/v1/chat/completions" >/dev/null; done
  for r in $(seq "$ROUNDS"); do
    for t in base head off; do
      v=$(taskset -c "${WRK_CPUS:-8-15}" wrk -t2 -c$C -d${DUR}s -s $TMP/$c.lua "http://127.0.0.1:$(cat $TMP/$t/port)/v1/chat/completions" | awk '/Requests\/sec/{print $2}')
      echo "$c $r $t $v"
    done
  done
done | tee $TMP/rounds.txt
python3 - "$TMP/rounds.txt" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    c, _, t, v = line.split()
    d[(c, t)].append(float(v))
for c in ("plain", "stream"):
    m = {t: statistics.median(d[(c, t)]) for t in ("base", "head", "off")}
    print(c, " ".join(f"{t} {v:.0f}" for t, v in m.items()),
          " head/base %.3f off/base %.3f head/off %.3f"
          % (m["head"] / m["base"], m["off"] / m["base"], m["head"] / m["off"]))
PY
