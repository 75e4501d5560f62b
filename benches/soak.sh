#!/usr/bin/env bash
# The soak: the release binary under 30 minutes of mixed load (plain, streams, cancels, wrong
# keys, oversized bodies, model lists; the keys file rewritten every 10 s; one of two upstreams
# restarted every minute), then the checks: RSS flat after warm-up (within 10%), no fd growth,
# every request answered, records = requests that passed auth, no unexplained warning or
# error in the log. See examples/soak.rs.
#   bash benches/soak.sh                 # 30 minutes
#   SOAK_MINUTES=5 bash benches/soak.sh  # a shorter run
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh >/dev/null
# The gateway in release; the load driver's own speed does not matter (debug build, shared
# with the tests' dependencies).
cargo build --release --quiet --bin modelgate
cargo build --quiet --example soak
ulimit -n 65536 2>/dev/null || true
exec target/debug/examples/soak target/release/modelgate "$(( ${SOAK_MINUTES:-30} * 60 ))"
