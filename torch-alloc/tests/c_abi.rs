//! The C functions PyTorch calls, called from Rust on the simulated device
//! with "PyTorch's" streams made outside the allocator: what a kernel
//! touches goes through the simulator's race detector.
//!
//! The backend is chosen once per process, so every test of this file
//! shares one simulated host and takes a device of its own (the counters of
//! a device are that test's alone).

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{Access, RawStream};
use torch_alloc::*;

const MIB: isize = 1 << 20;

/// The process's simulated devices: five, 1 GiB each, each built alone so
/// that each has its own race detector (one test's deliberate race is not
/// another's).
fn host() -> &'static [Arc<SimGpu>] {
    static HOST: OnceLock<Vec<Arc<SimGpu>>> = OnceLock::new();
    HOST.get_or_init(|| {
        let host: Vec<_> = (0..5)
            .map(|n| {
                SimGpu::builder()
                    .ordinal(n)
                    .capacity(1 << 30)
                    .manual()
                    .build()
            })
            .collect();
        simulate(host.clone()).expect("the first call of this process");
        host
    })
}

/// `count` streams of device `device` made outside the allocator, as
/// PyTorch makes its own: their raw handles, and as `cudaStream_t`.
/// `streamalloc_torch_empty_cache` empties every device's cache, as
/// PyTorch's `empty_cache` does: a test that counts how its device's cache
/// served (hits, borrows) holds this lock, and so does the one that
/// empties (run alongside, it turned a borrow into a hit in 3 of 40 runs
/// of this file on a loaded machine).
fn whole_process() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn torch_streams(device: usize, count: usize) -> Vec<(RawStream, *mut c_void)> {
    let pool = host()[device].stream_pool(count);
    pool.ids()
        .map(|id| {
            let raw = pool.raw(id).unwrap();
            (raw, raw.get() as usize as *mut c_void)
        })
        .collect()
}

fn stats(device: i32) -> TorchAllocStats {
    let mut out = TorchAllocStats::default();
    // SAFETY: `out` is a writable TorchAllocStats.
    assert_eq!(unsafe { streamalloc_torch_stats(device, &mut out) }, 0);
    out
}

fn last_error() -> String {
    let mut buf = vec![0u8; 512];
    // SAFETY: `buf` has 512 writable bytes.
    let len = unsafe { streamalloc_torch_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(len.min(511));
    String::from_utf8(buf).unwrap()
}

fn touch(sim: &SimGpu, stream: RawStream, ptr: *mut c_void, access: Access) {
    let at = MemAccess {
        ptr: ptr as u64,
        access,
    };
    sim.launch_kernel(stream, &[at]).unwrap();
}

/// Orders `later` after the work queued on `earlier` so far, as
/// `later.wait_stream(earlier)` does in PyTorch.
fn wait_stream(sim: &SimGpu, later: RawStream, earlier: RawStream) {
    let event = sim.event_create().unwrap();
    sim.event_record(event, earlier).unwrap();
    sim.stream_wait_event(later, event).unwrap();
}

/// A block freed on one of PyTorch's streams serves another stream only
/// once the GPU is done with it (the allocator's `done` policy): while the
/// first stream's write is queued the second grows instead, with no wait
/// on the GPU; once the write ran, the range serves the second stream
/// where it is. Fails if the second stream is made to wait, or is handed
/// the range while the write may still run (the race detector sees it).
#[test]
fn a_block_freed_on_one_torch_stream_serves_another_once_the_gpu_is_done() {
    let _alone = whole_process();
    let sim = &host()[0];
    let s = torch_streams(0, 2);
    let first = streamalloc_torch_alloc(4 * MIB, 0, s[0].1);
    assert!(!first.is_null(), "{}", last_error());
    assert_eq!(first as u64 % 512, 0, "PyTorch's alignment");
    touch(sim, s[0].0, first, Access::Write);
    streamalloc_torch_free(first, 4 * MIB, 0, s[0].1);
    let waits = sim.call_count(streamalloc::DriverCall::StreamWaitEvent);
    let second = streamalloc_torch_alloc(4 * MIB, 0, s[1].1);
    assert_ne!(second, first, "stream 0's write may still run there");
    touch(sim, s[1].0, second, Access::Write);
    sim.run_until_idle();
    let third = streamalloc_torch_alloc(4 * MIB, 0, s[1].1);
    assert_eq!(third, first, "the range freed on stream 0, done with");
    touch(sim, s[1].0, third, Access::Write);
    sim.run_until_idle();
    assert!(sim.races().is_empty(), "{:?}", sim.races());
    assert_eq!(
        sim.call_count(streamalloc::DriverCall::StreamWaitEvent),
        waits,
        "no stream waited on another"
    );
    let st = stats(0);
    assert_eq!((st.allocs, st.frees, st.failures), (3, 1, 0));
    assert_eq!((st.cross_stream_done, st.cache_cross_stream_waits), (1, 0));
    assert_eq!(st.cache_borrows, 1, "{st:?}");
    assert_eq!(st.allocated_bytes, 8 << 20);
    assert!(
        st.peak_reserved_bytes >= 8 << 20 && st.reserved_bytes >= 8 << 20,
        "{st:?}"
    );
    assert_eq!(
        streamalloc_torch_max_reserved_bytes(0),
        st.peak_reserved_bytes
    );
    assert_eq!(streamalloc_torch_max_allocated_bytes(0), 8 << 20);
    streamalloc_torch_free(second, 4 * MIB, 0, s[1].1);
    streamalloc_torch_free(third, 4 * MIB, 0, s[1].1);
    assert_eq!(stats(0).allocated_bytes, 0);
}

/// A tensor read on a side stream and freed with `record_stream`: the free
/// waits for the side stream, so the allocating stream's next block, on
/// the same range, races with nothing. Without the hook (device 2), the
/// same program races: what a pluggable allocator that PyTorch's
/// `record_stream` cannot reach costs.
#[test]
fn record_stream_orders_the_free_after_the_side_stream() {
    for (device, record) in [(1, true), (2, false)] {
        let sim = &host()[device];
        let s = torch_streams(device, 2);
        let (main, side) = (s[0], s[1]);
        let dev = device as i32;
        let tensor = streamalloc_torch_alloc(MIB, dev, main.1);
        assert!(!tensor.is_null(), "{}", last_error());
        touch(sim, main.0, tensor, Access::Write);
        wait_stream(sim, side.0, main.0);
        touch(sim, side.0, tensor, Access::Read);
        if record {
            streamalloc_torch_record_stream(tensor, side.1);
        }
        streamalloc_torch_free(tensor, MIB, dev, main.1);
        let next = streamalloc_torch_alloc(MIB, dev, main.1);
        assert_eq!(next, tensor, "same stream, same range");
        touch(sim, main.0, next, Access::Write);
        sim.run_until_idle();
        assert_eq!(
            sim.races().is_empty(),
            record,
            "record_stream {record}: {:?}",
            sim.races()
        );
        streamalloc_torch_free(next, MIB, dev, main.1);
        assert_eq!(stats(dev).failures, 0, "{}", last_error());
    }
}

/// Bad input gets null or nothing, a reason, a count, and changes nothing.
#[test]
fn refused_calls_return_null_and_keep_the_reason() {
    let s = torch_streams(3, 1);
    let before = stats(3);
    assert!(
        streamalloc_torch_alloc(0, 3, s[0].1).is_null(),
        "size 0: null"
    );
    assert!(streamalloc_torch_alloc(-1, 3, s[0].1).is_null());
    assert!(last_error().contains("negative"), "{}", last_error());
    let per_thread = 0x2 as *mut c_void;
    assert!(streamalloc_torch_alloc(MIB, 3, per_thread).is_null());
    assert!(
        last_error().contains("cudaStreamPerThread"),
        "{}",
        last_error()
    );
    assert!(
        streamalloc_torch_alloc(2 << 30, 3, s[0].1).is_null(),
        "past the device's 1 GiB"
    );
    streamalloc_torch_free(0x1000 as *mut c_void, MIB, 3, s[0].1);
    assert!(
        last_error().contains("not a live allocation"),
        "{}",
        last_error()
    );
    let after = stats(3);
    assert_eq!(after.failures, before.failures + 4);
    assert_eq!(
        (after.allocs, after.allocated_bytes),
        (before.allocs, before.allocated_bytes)
    );

    assert!(streamalloc_torch_alloc(MIB, 99, s[0].1).is_null());
    assert!(last_error().contains("out of range"), "{}", last_error());
    assert!(streamalloc_torch_alloc(MIB, 5, s[0].1).is_null());
    assert!(last_error().contains("5 devices"), "{}", last_error());
    let mut out = TorchAllocStats::default();
    // SAFETY: `out` is writable; the device cannot be opened.
    assert_eq!(unsafe { streamalloc_torch_stats(5, &mut out) }, -1);
    // SAFETY: null is allowed (and refused).
    let refused = unsafe { streamalloc_torch_stats(3, std::ptr::null_mut()) };
    assert_eq!(refused, -1);
}

/// A memory fraction refuses what would pass it once idle memory is back;
/// `empty_cache` gives idle memory back; 1.0 lifts the limit.
#[test]
fn memory_fraction_and_empty_cache() {
    let _alone = whole_process();
    let s = torch_streams(4, 1);
    let held = streamalloc_torch_alloc(64 * MIB, 4, s[0].1);
    assert!(!held.is_null(), "{}", last_error());
    streamalloc_torch_free(held, 64 * MIB, 4, s[0].1);
    host()[4].run_until_idle();
    streamalloc_torch_empty_cache();
    streamalloc_torch_set_memory_fraction(0.25, 4);
    assert!(streamalloc_torch_alloc(512 * MIB, 4, s[0].1).is_null());
    assert!(last_error().contains("memory fraction"), "{}", last_error());
    let fits = streamalloc_torch_alloc(128 * MIB, 4, s[0].1);
    assert!(!fits.is_null(), "{}", last_error());
    streamalloc_torch_set_memory_fraction(1.0, 4);
    let big = streamalloc_torch_alloc(512 * MIB, 4, s[0].1);
    assert!(!big.is_null(), "{}", last_error());
    streamalloc_torch_free(big, 512 * MIB, 4, s[0].1);
    streamalloc_torch_free(fits, 128 * MIB, 4, s[0].1);
    host()[4].run_until_idle();
    assert!(host()[4].races().is_empty(), "{:?}", host()[4].races());
}
