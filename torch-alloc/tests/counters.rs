//! The counters the comparison script reads, on the simulated device: the
//! peak of bytes held from the device, read only after allocations that
//! may have grown them, and the allocator's time, estimated from one call
//! in eight.
//!
//! A process of its own (the backend is chosen once per process): device
//! 1 has no virtual memory management (size classes over the driver's
//! pool), the others have it (the cache's arena); each test takes devices
//! of its own, as the tests run at once.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use streamalloc::gpu::sim::SimGpu;
use torch_alloc::*;

const MIB: isize = 1 << 20;

fn host() -> &'static [Arc<SimGpu>] {
    static HOST: OnceLock<Vec<Arc<SimGpu>>> = OnceLock::new();
    HOST.get_or_init(|| {
        let host: Vec<_> = (0..5)
            .map(|n| {
                let builder = SimGpu::builder().ordinal(n).capacity(4 << 30).manual();
                match n {
                    1 => builder.vm_granularity(0).build(),
                    _ => builder.build(),
                }
            })
            .collect();
        simulate(host.clone()).expect("the first call of this process");
        host
    })
}

/// `streamalloc_torch_empty_cache` empties every device's cache, as
/// PyTorch's `empty_cache` does: the test that empties and the one that
/// counts how its device's cache served (hits, borrows, misses) hold this
/// lock, so that one does not run in the middle of the other.
fn whole_process() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn stream(device: usize) -> *mut c_void {
    let pool = host()[device].stream_pool(1);
    let id = pool.ids().next().unwrap();
    pool.raw(id).unwrap().get() as usize as *mut c_void
}

fn stats(device: i32) -> TorchAllocStats {
    let mut out = TorchAllocStats::default();
    // SAFETY: `out` is a writable TorchAllocStats.
    assert_eq!(unsafe { streamalloc_torch_stats(device, &mut out) }, 0);
    out
}

/// Allocations that grow the held bytes, frees, an `empty_cache` that
/// gives them back, and growth again: the peak is the most held after any
/// allocation, read in full after each, on both kinds of device.
#[test]
fn the_peak_reserved_is_the_most_held_after_any_allocation() {
    let _alone = whole_process();
    for device in [0usize, 1] {
        let dev = device as i32;
        let s = stream(device);
        let mut most = 0;
        let mut live = Vec::new();
        // Allocates, and notes the most held after an allocation.
        let alloc = |size: isize, live: &mut Vec<(*mut c_void, isize)>, most: &mut u64| {
            let ptr = streamalloc_torch_alloc(size, dev, s);
            assert!(!ptr.is_null(), "device {device}: {size} B refused");
            live.push((ptr, size));
            *most = (*most).max(streamalloc_torch_reserved_bytes(dev));
        };
        for size in [3 * MIB, 40 * MIB, MIB, 100 * MIB, 7 * MIB] {
            alloc(size, &mut live, &mut most);
        }
        for (ptr, size) in live.drain(..) {
            streamalloc_torch_free(ptr, size, dev, s);
        }
        // The arena unmaps what the GPU is done with. (On size classes the
        // blocks go back to the driver's pool as stream-ordered frees, held
        // until a later call reaps them: the growth below follows them.)
        host()[device].run_until_idle();
        streamalloc_torch_empty_cache();
        if device == 0 {
            assert!(
                streamalloc_torch_reserved_bytes(dev) < most,
                "empty_cache gave the arena's memory back"
            );
        }
        // Growth again, past the first peak, and reuse under it.
        for size in [60 * MIB, 90 * MIB, 2 * MIB, 64 * MIB] {
            alloc(size, &mut live, &mut most);
        }
        let st = stats(dev);
        assert!(most > 0);
        assert_eq!(
            st.peak_reserved_bytes, most,
            "device {device}: the peak is the most held after an allocation"
        );
        assert_eq!(streamalloc_torch_max_reserved_bytes(dev), most);
        for (ptr, size) in live.drain(..) {
            streamalloc_torch_free(ptr, size, dev, s);
        }
        streamalloc_torch_reset_peaks(dev);
        assert_eq!(
            stats(dev).peak_reserved_bytes,
            streamalloc_torch_reserved_bytes(dev),
            "device {device}: a reset starts from what is held"
        );
        assert_eq!(stats(dev).failures, 0);
    }
}

/// One call in eight is timed and counted eight times: over many calls
/// both times grow, by multiples of eight.
#[test]
fn the_allocator_time_is_estimated_from_one_call_in_eight() {
    let s = stream(2);
    let before = stats(2);
    for _ in 0..1_000 {
        let ptr = streamalloc_torch_alloc(MIB, 2, s);
        assert!(!ptr.is_null());
        streamalloc_torch_free(ptr, MIB, 2, s);
    }
    let after = stats(2);
    let (alloc, free) = (
        after.alloc_nanos - before.alloc_nanos,
        after.free_nanos - before.free_nanos,
    );
    assert!(alloc > 0 && free > 0, "{after:?}");
    assert_eq!(
        (after.alloc_nanos % 8, after.free_nanos % 8),
        (0, 0),
        "{after:?}"
    );
}

/// Each allocation the cache serves counts once: from the stream's own
/// memory, by memory another stream freed, or by new memory.
#[test]
fn each_allocation_is_a_hit_a_borrow_or_a_miss() {
    let _alone = whole_process();
    let (sim, dev) = (&host()[3], 3);
    let pool = sim.stream_pool(2);
    let s: Vec<*mut c_void> = pool
        .ids()
        .map(|id| pool.raw(id).unwrap().get() as usize as *mut c_void)
        .collect();
    let sum = |st: &TorchAllocStats| st.cache_hits + st.cache_borrows + st.cache_misses;
    let before = stats(dev);
    // New memory, then the same size again on the same stream: a hit.
    for _ in 0..2 {
        let ptr = streamalloc_torch_alloc(5 * MIB, dev, s[0]);
        assert!(!ptr.is_null());
        streamalloc_torch_free(ptr, 5 * MIB, dev, s[0]);
    }
    let mid = stats(dev);
    assert!(mid.cache_hits > before.cache_hits, "{mid:?}");
    // Freed on one stream, taken on the other with the GPU not run: the
    // other stream is ordered behind the free, or gets other memory.
    let first = streamalloc_torch_alloc(9 * MIB, dev, s[0]);
    streamalloc_torch_free(first, 9 * MIB, dev, s[0]);
    let second = streamalloc_torch_alloc(9 * MIB, dev, s[1]);
    assert!(!first.is_null() && !second.is_null());
    streamalloc_torch_free(second, 9 * MIB, dev, s[1]);
    let after = stats(dev);
    // The same range (a borrow, under `wait`), or memory no queued work
    // touches (under `done`): mapped ahead by an earlier growth (a hit) or
    // new (a miss). Either way one count, beside the first block's.
    if second == first {
        assert_eq!(after.cache_borrows, mid.cache_borrows + 1, "{after:?}");
    } else {
        assert_eq!(after.cache_borrows, mid.cache_borrows, "{after:?}");
        assert_eq!(
            after.cache_hits + after.cache_misses,
            mid.cache_hits + mid.cache_misses + 2,
            "{after:?}"
        );
    }
    assert_eq!(
        sum(&after) - sum(&before),
        after.allocs - before.allocs,
        "one count per allocation: {after:?}"
    );
}

/// Threads count their calls in shards of their own, summed by the stats:
/// four threads, each allocating and freeing on a stream of its own, give
/// every call once (a count lost between threads, or a shard left out of
/// the sum, fails it), and the bytes PyTorch holds come back to 0.
#[test]
fn calls_from_many_threads_are_each_counted_once() {
    let dev = 4;
    let pool = host()[dev as usize].stream_pool(4);
    let streams: Vec<usize> = pool
        .ids()
        .map(|id| pool.raw(id).unwrap().get() as usize)
        .collect();
    let before = stats(dev);
    std::thread::scope(|scope| {
        for &s in &streams {
            scope.spawn(move || {
                let s = s as *mut c_void;
                for i in 0..500 {
                    let size = MIB * (1 + i % 3);
                    let ptr = streamalloc_torch_alloc(size, dev, s);
                    assert!(!ptr.is_null());
                    streamalloc_torch_free(ptr, size, dev, s);
                }
            });
        }
    });
    let after = stats(dev);
    assert_eq!(after.allocs - before.allocs, 2_000, "{after:?}");
    assert_eq!(after.frees - before.frees, 2_000, "{after:?}");
    assert_eq!((after.failures, after.allocated_bytes), (0, 0));
    assert!(after.alloc_nanos > before.alloc_nanos, "{after:?}");
}
