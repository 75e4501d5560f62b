#!/usr/bin/env bash
# Runs the demo gateway on a fresh machine: installs what is missing, then
# `cargo run --release` with conf/modelgate.toml. Extra arguments go to `modelgate serve`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install-deps.sh
exec cargo run --release -- serve --config conf/modelgate.toml "$@"
