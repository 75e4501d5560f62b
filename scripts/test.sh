#!/usr/bin/env bash
# The one test command: formatting and clippy, the Rust tests, the official SDKs and the pages
# in Chromium against the real binary, and the book's build.
# Runs every stage it can and exits non-zero if any failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/install-deps.sh --test

failed=()
# Tests that need Postgres or Redis fail here when those are missing, instead of skipping.
export MODELGATE_TEST_REQUIRE_ALL=1

echo "== cargo fmt --check; cargo clippy --all-targets -- -D warnings" >&2
cargo fmt --check || failed+=("cargo fmt")
cargo clippy --all-targets --quiet -- -D warnings || failed+=("cargo clippy")

echo "== cargo test --all-targets --no-fail-fast" >&2
cargo test --all-targets --no-fail-fast || failed+=("cargo test")

echo "== OpenAI SDK and the pages in Chromium against target/debug/modelgate (tests/sdk)" >&2
# `cargo test` has just built the binary for the integration tests; a separate `cargo build`
# would rebuild much of the tree with other feature sets (minutes in CI) for the same code.
if [ -x target/debug/modelgate ] || cargo build; then
  MODELGATE_BIN=target/debug/modelgate .venv/bin/python -m pytest -q -p no:cacheprovider tests/sdk \
    || failed+=("pytest tests/sdk")
else
  failed+=("cargo build")
fi

echo "== the book: mdbook build docs (its links are checked by tests/docs.rs)" >&2
PATH="$HOME/.cargo/bin:$PATH" mdbook build docs || failed+=("mdbook build")

if [ "${#failed[@]}" -gt 0 ]; then
  echo "== FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "== all tests passed" >&2
