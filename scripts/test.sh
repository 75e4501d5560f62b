#!/usr/bin/env bash
# The one test command: the Rust tests, then the official OpenAI SDK against the real binary.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install-deps.sh --test

echo "== cargo test" >&2
cargo test --all-targets

echo "== OpenAI SDK tests (tests/sdk)" >&2
cargo build
MODELGATE_BIN=target/debug/modelgate .venv/bin/python -m pytest -q -p no:cacheprovider tests/sdk
