#!/usr/bin/env bash
# The whole-API randomized test (tests/model/api_model.rs) with as many cases as
# you like: `scripts/api-fuzz.sh [CASES]` (default 10000). A failure
# shrinks to a minimal case and its seed is saved to
# tests/model/api_model.proptest-regressions (commit it, and write the case out
# in the test's `regressions` module).
set -euo pipefail
cd "$(dirname "$0")/.."
export PROPTEST_CASES=${1:-10000}
exec cargo test -p streamalloc --release --test model api_model:: -- --nocapture
