#!/usr/bin/env bash
# Three gateways side by side: "base" (BASE_BIN, an older build), "head" (HEAD_BIN, the crash
# journal on, as by default) and "off" (HEAD_BIN with [storage] journal = "off"); each one
# thread on GW_CPU, the mock on MOCK_CPUS, wrk on WRK_CPUS; plain and streamed chat in ROUNDS
# interleaved rounds of DUR seconds; then the medians and off/base, head/base, head/off.
# Made for a many-core machine (defaults: gateway CPU 0, mock 2-5, wrk 8-15); binaries are
# carried there prebuilt, with wrk. Not part of the tests.
#   BASE_BIN=… HEAD_BIN=target/release/modelgate ROUNDS=7 DUR=4 bash benches/ab_journal.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source benches/common.sh
ROUNDS=${ROUNDS:-7}; DUR=${DUR:-4}; C=${C:-50}; WRK_CPUS=${WRK_CPUS:-8-15}; WRK_THREADS=${WRK_THREADS:-2}
BASE_BIN=$(realpath "${BASE_BIN:?an older build to compare with}")
HEAD_BIN=$(realpath "${HEAD_BIN:-target/release/modelgate}")
TMP=$(mktemp -d); PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null || true; done' EXIT
MOCK=$(port)
taskset -c "${MOCK_CPUS:-2-5}" "$HEAD_BIN" mock-upstream --listen 127.0.0.1:$MOCK --chunks 20 --threads 4 >/dev/null 2>&1 & PIDS+=($!)
for t in base head off; do
  mkdir -p $TMP/$t; M=$(port); D=$(port); gateway_config $TMP/$t $M $D $MOCK
  [ $t = off ] && printf '[storage]\njournal = "off"\n' >> $TMP/$t/modelgate.toml
  # An older build may not know the translated pool (the config's last lines); it is not used.
  [ $t = base ] && sed -i '/^# The same mock spoken/,$d' $TMP/$t/modelgate.toml
  bin=$HEAD_BIN; [ $t = base ] && bin=$BASE_BIN
  echo $M > $TMP/$t/port
  (cd $TMP/$t && RUST_LOG=error exec taskset -c "${GW_CPU:-0}" "$bin" serve --config modelgate.toml >/dev/null 2>&1) & PIDS+=($!)
  echo $! > $TMP/$t/pid
done
for t in base head off; do wait_port "$(cat $TMP/$t/port)"; done
echo "journals under $TMP ($(stat -f -c %T "$TMP")), kernel $(uname -r), $(nproc) CPUs"
chat_script $TMP/plain.lua false; chat_script $TMP/stream.lua true
ab_rounds base off head
