#!/usr/bin/env bash
# Fuzzing (cargo-fuzz, libFuzzer, nightly): every target in fuzz/fuzz_targets for SECONDS each
# (default 180), from the checked-in seeds in fuzz/corpus/<target>; what it learns goes to
# fuzz/work/<target> and crashes to fuzz/artifacts/<target> (both ignored by git). Exits 1 if
# any target crashed. Not part of CI.
#   bash benches/fuzz.sh                 # every target, 3 minutes each
#   SECONDS_EACH=600 bash benches/fuzz.sh sse_meter json_body
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${SECONDS_EACH:-180}
bash scripts/install-deps.sh >/dev/null
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cd fuzz
cargo +nightly fuzz build -O
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
failed=()
for t in "${targets[@]}"; do
  mkdir -p "work/$t" "artifacts/$t"
  echo "== $t: ${SECONDS_EACH} s" >&2
  if cargo +nightly fuzz run -O "$t" "work/$t" "corpus/$t" -- \
      -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
      2> "work/$t.log"; then
    grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+ *DONE' "work/$t.log" | sed "s/^/  $t /" >&2 || true
  else
    failed+=("$t")
    tail -40 "work/$t.log" >&2
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== crashes in: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
echo "== no crash in: ${targets[*]}" >&2
