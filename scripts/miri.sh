#!/usr/bin/env bash
# Miri over everything that runs on the simulated device: the simulator and
# the resource bookkeeping (core), the adaptors, the cache and their stacks
# (layers), and the futures layer (futures). No CUDA: the cudarc backend
# loads libcuda at run time, which Miri cannot do, and no test run here
# touches it (the CUDA tests are `#[ignore]`d).
# Needs the nightly toolchain with miri:
#   rustup component add --toolchain nightly miri rust-src
#
# Miri interprets the code a hundred times or more slower, so under
# `cfg(miri)` the tests do less of the same (the list is exact):
# - proptest runs 4 cases (PROPTEST_CASES) and the stress tests 1 s
#   (STREAMALLOC_SOAK_SECS) or 50 iterations a thread;
# - loops that only repeat work are cut with `support::scaled`: futures_event
#   10,000 -> 100 concurrent futures, futures_reaper 200 -> 16 frees and 20
#   -> 3 rounds, futures_stress 4 x 48 -> 1 x 12 tasks, cache 4 x 500 -> 4 x
#   50 thread rounds and 300 -> 30 pipeline items, adaptor_stats 8 x 200 ->
#   8 x 20 thread rounds; the simulated
#   kernels of futures_fault (20 ms -> 500 ms), futures_reaper (200 us ->
#   1 s) and futures_nonblocking (100 ms -> 2 s) are slower, so that work is
#   still in flight when a waiter queues; the yield budget of
#   futures_event's `a_yielding_point_behind_parks_when_its_budget_ends`
#   is 2 s (5 ms), so that one poll ends inside it; hang guards are 30 times longer
#   (`support::guard`);
# - the poll-time harness (tests/support/bounded.rs) does not time polls: the
#   interpreter's time says nothing about blocking, and Miri cannot read
#   /proc; `SimGpu::blocking_calls_in_polls` is still asserted;
# - ignored (`#[cfg_attr(miri, ignore = "...")]`):
#   `sim` binary, `regressions::async_resources_built_and_dropped_leave_no_stream_behind`
#   (5,000 resources, each with a watchdog thread),
#   `stack_orders::every_order_of_distinct_layers_holds` (3,262 stacks; the
#   proptest of the same file runs) and
#   `drop::points_dropped_behind_an_unpolled_one_do_not_pile_up`
#   (5,000 points to pass the notifier's long span: over 6 minutes), and
#   `nonblocking::a_current_thread_timeout_returns_at_once_with_cache_retry_and_budget`
#   and `a_budget_bound_full_stack_never_blocks_a_current_thread_runtime`
#   (they tell a blocking poll from a free one by wall time, which the
#   interpreter's pace swamps).
# Isolation is off because proptest reads the working directory and the
# futures tests the clock.
#   scripts/miri.sh          all three phases
#   scripts/miri.sh core     sim, resource, cache units; the SimGpu suites
#   scripts/miri.sh layers   adaptors, cache, compositions, panics
#   scripts/miri.sh futures  the futures layer (unit tests and suites)
set -euo pipefail
cd "$(dirname "$0")/.."
phase="${1:-all}"
export PROPTEST_CASES=4 STREAMALLOC_SOAK_SECS=1
export MIRIFLAGS="${MIRIFLAGS:-} -Zmiri-disable-isolation"
miri() { cargo +nightly miri test -p streamalloc --no-fail-fast "$@"; }
if [ "$phase" = all ] || [ "$phase" = core ]; then
  miri --lib -- sim:: resource:: cache::
  miri --test resource -- smoke:: resource:: bad_input stress:: fault_sweep::
  miri --test model -- resource_model::
  miri --test sim -- regressions::
fi
if [ "$phase" = all ] || [ "$phase" = layers ]; then
  miri --test adaptors -- compose:: stack_orders:: budget:: debug_guard:: retry:: stats::
  miri --test resource -- panics::
  miri --test cache -- size_class::
fi
if [ "$phase" = all ] || [ "$phase" = futures ]; then
  miri --lib -- futures:: poll_scope::
  miri --test futures -- traits:: alloc:: event:: drop:: fault:: reaper:: stress:: \
    nonblocking:: capture::
fi
