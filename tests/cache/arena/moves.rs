//! Memory moved between holes: a large block past the target takes the
//! memory of its stream's holes (or another stream's, behind a wait for its
//! frees) by mapping whole idle handles again where it lies.

use crate::support;

use streamalloc::DriverCall;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::{CacheConfig, CachingResource};
use streamalloc::{DeviceMemoryResource, StreamId};

use super::{Cache, P, T};

/// Allocates `n` blocks of `pages` pages each on `stream`, each written by
/// a kernel.
fn blocks_of(c: &Cache, stream: StreamId, n: usize, pages: usize) -> Vec<streamalloc::DeviceBlock> {
    (0..n)
        .map(|_| {
            let b = c.cache.allocate(pages * P, stream, T).unwrap();
            c.kernel(stream, MemAccess::write(&b));
            b
        })
        .collect()
}

/// A block that would need new memory past the target while the stream's
/// own holes hold whole pages no block touches takes those pages' memory,
/// mapped again where the block goes (`cuMemMap` at an offset into the
/// holes' handles): no new memory, one map a hole and one set-access. The
/// holes' old addresses leave the arena until their handles go back: a
/// block placed there would be the same memory as the new block, which
/// the simulated device reports. Everything goes back in the end, once
/// every mapping of each handle is unmapped.
#[test]
fn a_large_block_takes_the_memory_of_the_streams_holes() {
    // No slack: the target is the live high-water mark.
    let c = Cache::new(1, CacheConfig::default().slack_percent(0));
    let a = c.s(0);
    let mut blocks = blocks_of(&c, a, 8, 16);
    assert_eq!(c.cache.bytes_outstanding(), 128 * P);
    // Holes of 16 pages between blocks that stay live.
    for i in [6, 4, 2, 0] {
        c.cache.deallocate(blocks.remove(i)).unwrap();
    }
    let (creates, maps) = (c.creates(), c.gpu.call_count(DriverCall::MemMap));
    let accesses = c.gpu.call_count(DriverCall::MemSetAccess);
    // No hole fits 48 pages; the GPU has run nothing, so nothing can be
    // given back either.
    let large = c.cache.allocate(48 * P, a, T).unwrap();
    c.kernel(a, MemAccess::write(&large));
    assert_eq!(c.creates(), creates, "no new memory");
    assert_eq!(
        c.gpu.call_count(DriverCall::MemMap),
        maps + 3,
        "three holes"
    );
    assert_eq!(c.gpu.call_count(DriverCall::MemSetAccess), accesses + 1);
    assert_eq!(
        c.cache.bytes_outstanding(),
        128 * P,
        "each handle counted once"
    );
    assert_eq!(c.gpu.physical_bytes(), 128 * P);
    // A snapshot's segment counts the physical memory once too (the
    // holes' old addresses stay mapped, but hold nothing of their own).
    let mut snap = streamalloc::MemorySnapshot::default();
    c.cache.snapshot_into(&mut snap);
    let mapped: usize = snap
        .segments
        .iter()
        .filter(|s| s.layer == "cache")
        .map(|s| s.mapped)
        .sum();
    assert_eq!(mapped, 128 * P, "physical memory behind the segment");
    // The fourth hole serves as it is; the next block of its size grows
    // (the three moved holes are not the arena's any more).
    let more = blocks_of(&c, a, 2, 16);
    assert_eq!(c.creates(), creates + 1);
    assert!(c.gpu.races().is_empty(), "{:#?}", c.gpu.races());
    for b in blocks.into_iter().chain(more).chain([large]) {
        c.cache.deallocate(b).unwrap();
    }
    // A first trim records fences over the frees; once they ran, the
    // second gives every handle back.
    c.cache.trim().unwrap();
    c.gpu.run_until_idle();
    c.cache.trim().unwrap();
    assert_eq!(c.cache.bytes_outstanding(), 0);
    assert_eq!((c.gpu.physical_bytes(), c.gpu.physical_handles()), (0, 0));
    c.assert_race_free();
}

/// Memory another stream freed moves to a new address only behind an
/// ordering: the work that stream queued before the free has not run,
/// so the new block's stream waits on the GPU for a fence recorded past
/// the frees (once: one fence covers them all) before the block is handed
/// out, and the block takes the
/// holes' memory (no new memory). Fails if an alias takes another
/// stream's holes with no ordering: the simulated device then sees the
/// same memory written on two streams unordered (through its two
/// addresses).
#[test]
fn holes_of_another_stream_move_behind_a_wait_for_its_frees() {
    let c = Cache::new(2, CacheConfig::default().slack_percent(0));
    let (a, b) = (c.s(0), c.s(1));
    let mut blocks = blocks_of(&c, b, 8, 16);
    for i in [6, 4, 2, 0] {
        c.cache.deallocate(blocks.remove(i)).unwrap();
    }
    // The writes on b have not run.
    let (creates, waits) = (c.creates(), c.gpu.call_count(DriverCall::StreamWaitEvent));
    let maps = c.gpu.call_count(DriverCall::MemMap);
    let large = c.cache.allocate(48 * P, a, T).unwrap();
    c.kernel(a, MemAccess::write(&large));
    assert!(c.gpu.races().is_empty(), "{:#?}", c.gpu.races());
    assert_eq!(c.creates(), creates, "no new memory");
    assert_eq!(
        c.gpu.call_count(DriverCall::MemMap),
        maps + 3,
        "three holes"
    );
    // One fence, recorded when the first hole moved, covers the three
    // frees: `a` waits for it once (a wait for each hole queued the same
    // wait three times).
    assert_eq!(
        c.gpu.call_count(DriverCall::StreamWaitEvent),
        waits + 1,
        "a waits once for the fence past the holes' frees"
    );
    assert_eq!(c.cache.bytes_outstanding(), 128 * P);
    for x in blocks.into_iter().chain([large]) {
        c.cache.deallocate(x).unwrap();
    }
    c.assert_race_free();
}

/// With [`CacheConfig::move_memory`] off, the block of
/// `a_large_block_takes_the_memory_of_the_streams_holes` grows: one
/// handle, one map, and the holes stay where they are. Fails if memory
/// moves anyway, or if the growth does not come.
#[test]
fn with_moves_off_a_block_past_the_target_grows() {
    let c = Cache::new(
        1,
        CacheConfig::default().slack_percent(0).move_memory(false),
    );
    let a = c.s(0);
    let mut blocks = blocks_of(&c, a, 8, 16);
    for i in [6, 4, 2, 0] {
        c.cache.deallocate(blocks.remove(i)).unwrap();
    }
    let (creates, maps) = (c.creates(), c.gpu.call_count(DriverCall::MemMap));
    let large = c.cache.allocate(48 * P, a, T).unwrap();
    c.kernel(a, MemAccess::write(&large));
    assert_eq!(c.creates(), creates + 1, "new memory");
    assert_eq!(
        c.gpu.call_count(DriverCall::MemMap),
        maps + 1,
        "its one map"
    );
    assert_eq!(c.cache.bytes_outstanding(), (128 + 48) * P);
    for x in blocks.into_iter().chain([large]) {
        c.cache.deallocate(x).unwrap();
    }
    c.assert_race_free();
}

/// A block that ends inside a page whose memory moved leaves the rest of
/// that page free at its new address: a block placed there later uses
/// the moved memory too, so it must be ordered after the frees the old
/// uses end with, as the moving block was. Fails if that rest keeps the
/// tags its address had (clean here: a third stream would take it with
/// no wait while the first stream's writes to that memory still queue).
#[test]
fn the_rest_of_a_moved_page_is_ordered_after_the_old_frees() {
    let c = Cache::new(3, CacheConfig::default().slack_percent(0));
    let (a, b, d) = (c.s(0), c.s(1), c.s(2));
    // Holes of 16 pages (each one handle) between live blocks, each two
    // blocks of b: 15.5 pages, then half a page.
    let mut live = Vec::new();
    let mut freed = Vec::new();
    for _ in 0..4 {
        for halves in [31, 1] {
            let x = c.cache.allocate(halves * P / 2, b, T).unwrap();
            c.kernel(b, MemAccess::write(&x));
            freed.push(x);
        }
        live.extend(blocks_of(&c, b, 1, 16));
    }
    for x in freed {
        c.cache.deallocate(x).unwrap();
    }
    let creates = c.creates();
    // Fits no hole, and ends half a page into its last page, whose memory
    // comes from the end of a hole: under the rest of that page lies the
    // memory of a half-page block of b, whose write has not run.
    let large = c.cache.allocate(48 * P - P / 2, a, T).unwrap();
    c.kernel(a, MemAccess::write(&large));
    assert_eq!(c.creates(), creates, "no new memory");
    // Fits the rest of that page.
    let small = c.cache.allocate(P / 4, d, T).unwrap();
    c.kernel(d, MemAccess::write(&small));
    assert!(c.gpu.races().is_empty(), "{:#?}", c.gpu.races());
    for x in live.into_iter().chain([large, small]) {
        c.cache.deallocate(x).unwrap();
    }
    c.assert_race_free();
}

/// Once the host saw the other stream's frees done (its work ran), its
/// holes move with no wait: the same holes as behind a wait (which memory
/// moves does not depend on the GPU's progress), only the ordering
/// differs. Fails if a wait is queued for work the host saw done, or if
/// the placement changes with the GPU's timing.
#[test]
fn holes_of_another_stream_whose_frees_ran_move_with_no_wait() {
    let held = |run_first: bool| {
        let c = Cache::new(2, CacheConfig::default().slack_percent(0));
        let (a, b) = (c.s(0), c.s(1));
        let mut blocks = blocks_of(&c, b, 8, 16);
        for i in [6, 4, 2, 0] {
            c.cache.deallocate(blocks.remove(i)).unwrap();
        }
        if run_first {
            c.gpu.run_until_idle();
        }
        let (creates, waits) = (c.creates(), c.gpu.call_count(DriverCall::StreamWaitEvent));
        let large = c.cache.allocate(48 * P, a, T).unwrap();
        c.kernel(a, MemAccess::write(&large));
        assert_eq!(c.creates(), creates, "no new memory");
        let queued = c.gpu.call_count(DriverCall::StreamWaitEvent) - waits;
        let at = large.ptr();
        for x in blocks.into_iter().chain([large]) {
            c.cache.deallocate(x).unwrap();
        }
        c.assert_race_free();
        (at, queued)
    };
    let (ran, behind) = (held(true), held(false));
    assert_eq!(ran.1, 0, "no wait once the frees ran");
    assert!(behind.1 > 0, "a wait while they may still run");
    assert_eq!(ran.0, behind.0, "the same placement either way");
}

/// On a real GPU: a large block takes the memory of its stream's holes,
/// mapped again at its own address (`cuMemMap` at an offset into the
/// holes' handles), written there by the device with no new memory; and
/// every handle goes back on trim and drop, each once its last mapping is
/// unmapped. Run by hand with the lead's GPU calls.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_a_large_block_takes_the_memory_of_the_streams_holes() {
    use streamalloc::gpu::Gpu;
    let f = support::cuda(1);
    let gpu = f.resource.gpu().clone();
    let page = gpu.vm_granularity().unwrap();
    let cache =
        CachingResource::with_config(f.resource.clone(), CacheConfig::default().slack_percent(0));
    let a = f.stream(0);
    let raw = f.pool.raw(a).unwrap();
    let held_before = gpu.memory_held().unwrap().current;
    let mut blocks: Vec<_> = (0..8)
        .map(|i| {
            let b = cache.allocate(16 * page, a, T).unwrap();
            // SAFETY: a stream of the fixture's pool, which it holds; the
            // block lives in the cache.
            unsafe { gpu.memset_async(b.ptr(), i, b.size(), raw) }.unwrap();
            b
        })
        .collect();
    for i in [6, 4, 2, 0] {
        cache.deallocate(blocks.remove(i)).unwrap();
    }
    let outstanding = cache.bytes_outstanding();
    let large = cache.allocate(48 * page, a, T).unwrap();
    assert_eq!(cache.bytes_outstanding(), outstanding, "no new memory");
    // SAFETY: as above.
    unsafe { gpu.memset_async(large.ptr(), 9, large.size(), raw) }.unwrap();
    // SAFETY: a stream of the fixture's pool, which it holds.
    unsafe { gpu.stream_synchronize(raw) }.unwrap();
    for b in blocks.into_iter().chain([large]) {
        cache.deallocate(b).unwrap();
    }
    // SAFETY: as above.
    unsafe { gpu.stream_synchronize(raw) }.unwrap();
    cache.trim().unwrap(); // records fences
    // SAFETY: as above.
    unsafe { gpu.stream_synchronize(raw) }.unwrap();
    cache.trim().unwrap();
    assert_eq!(cache.bytes_outstanding(), f.resource.bytes_outstanding());
    drop(cache);
    assert_eq!(gpu.memory_held().unwrap().current, held_before);
}

/// On a real GPU: a block on one stream takes the memory of another
/// stream's holes, mapped again at its own address, behind a wait for the
/// frees (or none where the host saw them done); the device writes it
/// there and the host reads back what it wrote, with no new memory; every
/// handle goes back on trim and drop. Run by hand with the lead's GPU
/// calls.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_a_block_takes_the_memory_of_another_streams_holes() {
    use streamalloc::gpu::Gpu;
    let f = support::cuda(2);
    let gpu = f.resource.gpu().clone();
    let page = gpu.vm_granularity().unwrap();
    let cache =
        CachingResource::with_config(f.resource.clone(), CacheConfig::default().slack_percent(0));
    let (a, b) = (f.stream(0), f.stream(1));
    let (raw_a, raw_b) = (f.pool.raw(a).unwrap(), f.pool.raw(b).unwrap());
    let held_before = gpu.memory_held().unwrap().current;
    let mut blocks: Vec<_> = (0..8)
        .map(|i| {
            let x = cache.allocate(16 * page, b, T).unwrap();
            // SAFETY: a stream of the fixture's pool, which it holds; the
            // block lives in the cache.
            unsafe { gpu.memset_async(x.ptr(), i, x.size(), raw_b) }.unwrap();
            x
        })
        .collect();
    for i in [6, 4, 2, 0] {
        cache.deallocate(blocks.remove(i)).unwrap();
    }
    let outstanding = cache.bytes_outstanding();
    let large = cache.allocate(48 * page, a, T).unwrap();
    assert_eq!(cache.bytes_outstanding(), outstanding, "no new memory");
    // SAFETY: as above.
    unsafe { gpu.memset_async(large.ptr(), 9, large.size(), raw_a) }.unwrap();
    let mut host = vec![0u8; large.size()];
    // SAFETY: a stream of the fixture's pool; `host` is a live host range
    // of that length, read only after the synchronize below.
    unsafe { gpu.copy_to_host_async(host.as_mut_ptr() as u64, large.ptr(), large.size(), raw_a) }
        .unwrap();
    // SAFETY: a stream of the fixture's pool, which it holds.
    unsafe { gpu.stream_synchronize(raw_a) }.unwrap();
    assert!(host.iter().all(|&x| x == 9), "the block reads what a wrote");
    for x in blocks.into_iter().chain([large]) {
        cache.deallocate(x).unwrap();
    }
    for raw in [raw_a, raw_b] {
        // SAFETY: as above.
        unsafe { gpu.stream_synchronize(raw) }.unwrap();
    }
    cache.trim().unwrap(); // records fences
    for raw in [raw_a, raw_b] {
        // SAFETY: as above.
        unsafe { gpu.stream_synchronize(raw) }.unwrap();
    }
    cache.trim().unwrap();
    assert_eq!(cache.bytes_outstanding(), f.resource.bytes_outstanding());
    drop(cache);
    assert_eq!(gpu.memory_held().unwrap().current, held_before);
}
