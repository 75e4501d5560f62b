#!/usr/bin/env bash
# Refreshes the book's screenshots (docs/src/images) from the browser tests.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install-deps.sh --test
[ -x target/debug/modelgate ] || cargo build
MODELGATE_SCREENSHOTS="$ROOT/docs/src/images" MODELGATE_BIN=target/debug/modelgate \
  .venv/bin/python -m pytest -q -p no:cacheprovider tests/sdk/test_usage_page.py tests/sdk/test_console_page.py
