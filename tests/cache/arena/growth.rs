//! Growths in their driver calls: the tier's lock released over them, two
//! at once on different pages, a failed one leaving nothing pending.

use crate::support;

use streamalloc::CacheConfig;
use streamalloc::DriverCall;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::{DeviceMemoryResource, ResourceError};

use super::{Cache, P, T};

/// Runs `f` on a thread of `scope` and waits up to `secs` for its result:
/// `None` when it did not come (it waits on something: the test fails
/// instead of hanging).
fn within<'s, R: Send + 's>(
    scope: &'s std::thread::Scope<'s, '_>,
    secs: u64,
    f: impl FnOnce() -> R + Send + 's,
) -> Option<R> {
    let (tx, rx) = std::sync::mpsc::channel();
    scope.spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(support::guard(secs)).ok()
}

/// The pages `[ptr, ptr + len)` touches.
fn pages_of(ptr: u64, len: usize) -> std::ops::Range<u64> {
    ptr / P as u64..(ptr + len as u64).div_ceil(P as u64)
}

#[test]
fn a_growth_in_its_driver_calls_holds_up_no_other_stream() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    // Stream b has two pages mapped, the first freed (b's to use again).
    let x = c.cache.allocate(P, b, T).unwrap();
    let y = c.cache.allocate(P, b, T).unwrap();
    c.cache.deallocate(x).unwrap();
    let c = &c;
    std::thread::scope(|scope| {
        // Inside the scope: a failing assertion drops (opens) it before
        // the scope waits for the grower.
        let gate = c.gpu.gate_nth(DriverCall::MemMap, 1);
        let grower = scope.spawn(move || c.cache.allocate(8 * P, a, T));
        assert!(gate.wait_entered(support::guard(10)), "a's growth maps");
        let creates = c.creates();
        // A size b keeps no block of: placed in the arena, under the
        // tier's lock, on the page b freed (mapped already).
        let other = within(scope, 5, move || {
            let block = c.cache.allocate(P / 4, b, T)?;
            let ptr = block.ptr();
            c.cache.deallocate(block)?;
            Ok::<_, ResourceError>(ptr)
        });
        let still_held = !grower.is_finished();
        gate.open();
        let other = other.expect("b's allocation waited for a's growth");
        assert!(other.is_ok(), "{other:?}");
        assert!(still_held, "a's growth was inside mem_map meanwhile");
        assert_eq!(c.creates(), creates, "b used mapped memory");
        let big = grower.join().unwrap().unwrap();
        c.kernel(a, MemAccess::write(&big));
        c.cache.deallocate(big).unwrap();
    });
    c.kernel(b, MemAccess::write(&y));
    c.cache.deallocate(y).unwrap();
    assert_eq!(c.gpu.held_bytes(), c.cache.bytes_outstanding());
    c.assert_race_free();
}

#[test]
fn two_growths_at_once_map_different_pages() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let c = &c;
    std::thread::scope(|scope| {
        // Inside the scope: a failing assertion drops (opens) it before
        // the scope waits for the grower.
        let gate = c.gpu.gate_nth(DriverCall::MemMap, 1);
        let grower = scope.spawn(move || c.cache.allocate(3 * P + 5, a, T));
        assert!(gate.wait_entered(support::guard(10)), "a's growth maps");
        // b grows too (its mem_map is not held) while a's is in flight.
        let other = within(scope, 5, move || c.cache.allocate(3 * P, b, T))
            .expect("b's growth waited for a's");
        gate.open();
        let other = other.unwrap();
        let first = grower.join().unwrap().unwrap();
        let (pa, pb) = (
            pages_of(first.ptr(), first.size()),
            pages_of(other.ptr(), other.size()),
        );
        assert!(
            pa.end <= pb.start || pb.end <= pa.start,
            "pages {pa:?} and {pb:?} overlap"
        );
        assert_eq!(c.gpu.physical_handles(), 2, "one growth each");
        c.kernel(a, MemAccess::write(&first));
        c.kernel(b, MemAccess::write(&other));
        c.cache.deallocate(first).unwrap();
        c.cache.deallocate(other).unwrap();
    });
    assert_eq!(c.gpu.held_bytes(), c.cache.bytes_outstanding());
    c.assert_race_free();
}

#[test]
fn a_growth_that_fails_in_its_driver_calls_leaves_no_page_pending() {
    for call in [DriverCall::MemMap, DriverCall::MemSetAccess] {
        let c = Cache::new(2, CacheConfig::default());
        let (a, b) = (c.s(0), c.s(1));
        let first = c.cache.allocate(P, a, T).unwrap();
        let c = &c;
        let other = std::thread::scope(|scope| {
            let gate = c.gpu.gate_nth(call, 1);
            let grower = scope.spawn(move || c.cache.allocate(4 * P, a, T));
            assert!(gate.wait_entered(support::guard(10)), "a's growth is held");
            // b's call of that kind comes first, a's held one second: that
            // one fails.
            c.gpu.fail_nth(call, 2);
            let other = within(scope, 5, move || c.cache.allocate(4 * P, b, T))
                .expect("b's growth waited for a's")
                .unwrap();
            gate.open();
            let err = grower.join().unwrap().unwrap_err();
            assert!(
                matches!(err, ResourceError::Driver { call: c2, .. } if c2 == call),
                "{err}"
            );
            other
        });
        assert_eq!(c.gpu.held_bytes(), c.cache.bytes_outstanding());
        // The pages the failed growth had pending serve the next block, as
        // if it had never been: right after the first one.
        let again = c.cache.allocate(4 * P, a, T).unwrap();
        assert_eq!(again.ptr(), first.ptr() + P as u64, "{call:?}");
        for (s, block) in [(a, first), (b, other), (a, again)] {
            c.kernel(s, MemAccess::write(&block));
            c.cache.deallocate(block).unwrap();
        }
        assert_eq!(c.gpu.held_bytes(), c.cache.bytes_outstanding());
        c.assert_race_free();
    }
}
