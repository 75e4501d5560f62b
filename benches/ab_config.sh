#!/usr/bin/env bash
# One modelgate binary under two configs side by side: the benchmark config (benches/common.sh)
# as "a", and the same with the TOML in $B appended as "b"; plain and streamed chat in ROUNDS
# interleaved rounds of DUR seconds, 50 connections, then the medians and b/a. What a setting
# costs, measured apart from the machine's hour. Not part of the tests.
#   B=$'[log]\naccess = "on"' bash benches/ab_config.sh            (access log on vs off)
#   BIN=target/release/modelgate ROUNDS=7 DUR=4 GW_CPU=0 MOCK_CPUS=0 WRK_CPUS=1 (defaults here)
# The benchmark config has `[log] access = "off"`; a later [log] would be a duplicate section,
# so B may also name a sed expression in B_SED that edits the config instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/common.sh
BIN=${BIN:-target/release/modelgate}; ROUNDS=${ROUNDS:-7}; DUR=${DUR:-4}; C=${C:-50}
GW_CPU=${GW_CPU:-0}; MOCK_CPUS=${MOCK_CPUS:-0}; WRK_CPUS=${WRK_CPUS:-1}
command -v wrk >/dev/null || { echo "ab_config: needs wrk (apt-get install wrk)" >&2; exit 1; }
[ -x "$BIN" ] || cargo build --release
BIN=$(realpath "$BIN")
TMP=$(mktemp -d); PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null || true; done; rm -rf "$TMP"' EXIT
MOCK=$(port)
taskset -c "$MOCK_CPUS" "$BIN" mock-upstream --listen 127.0.0.1:$MOCK --chunks 20 >/dev/null 2>&1 & PIDS+=($!)
for t in a b; do
  mkdir -p $TMP/$t; M=$(port); D=$(port); gateway_config $TMP/$t $M $D $MOCK
  if [ $t = b ]; then
    [ -n "${B_SED:-}" ] && sed -i "$B_SED" $TMP/b/modelgate.toml
    [ -n "${B:-}" ] && printf '%s\n' "$B" >> $TMP/b/modelgate.toml
  fi
  echo $M > $TMP/$t/port
  (cd $TMP/$t && RUST_LOG=error exec taskset -c "$GW_CPU" "$BIN" serve --config modelgate.toml >/dev/null 2>&1) & PIDS+=($!)
  echo $! > $TMP/$t/pid
done
for t in a b; do wait_port "$(cat $TMP/$t/port)"; done
chat_script $TMP/plain.lua false; chat_script $TMP/stream.lua true
echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)); b = a + ${B:-}${B_SED:+ sed $B_SED}"
ab_rounds a b
