#!/usr/bin/env bash
# The whole-API randomized test (tests/api_model.rs) with as many cases as
# you like: `scripts/api-fuzz.sh [CASES] [CLASSES]`.
# CASES defaults to 10000. CLASSES names the known-open bug classes to
# drive too (comma-separated, or `all`; see OPEN in tests/api_model.rs):
# without it the run steers around them and must pass on the current code.
# A failure shrinks to a minimal case and its seed is saved to
# tests/api_model.proptest-regressions (commit it).
set -euo pipefail
cd "$(dirname "$0")/.."
export PROPTEST_CASES=${1:-10000}
export API_FUZZ_OPEN=${2:-}
exec cargo test -p streamalloc --release --test api_model -- --nocapture
