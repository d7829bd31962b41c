//! When memory one stream freed serves another
//! ([`CrossStreamReuse`]): behind a wait on the GPU (the default,
//! `Wait`), or only once the host saw the GPU done with the free
//! (`Done`), which never queues a wait for memory but as the last resort
//! before out of memory. Each waits counted in the cache's
//! `cross_stream_waits`, checked against the simulated driver's own count.

use crate::support;

use streamalloc::DriverCall;
use streamalloc::gpu::CaptureMode;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{AllocTag, DeviceMemoryResource};
use streamalloc::{CacheConfig, CachingResource, CrossStreamReuse};

use support::arena::ArenaCache as Cache;

const T: AllocTag = AllocTag::UNTAGGED;
const P: usize = 2 << 20;

fn done() -> CacheConfig {
    CacheConfig::default().cross_stream(CrossStreamReuse::Done)
}

impl Cache {
    fn waits(&self) -> u64 {
        self.gpu.call_count(DriverCall::StreamWaitEvent)
    }
}

/// The default: a range stream `a` freed, its write still queued, serves
/// `b` where it is, behind one wait on the GPU, and the cache counts it.
/// Fails if the wait is not counted, or counted where none was queued.
#[test]
fn under_wait_a_borrow_behind_the_gpu_counts_its_wait() {
    let c = Cache::manual(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let x = c.cache.allocate(4 * P, a, T).unwrap();
    let home = x.ptr();
    c.kernel(a, MemAccess::write(&x));
    c.cache.deallocate(x).unwrap();
    let waits = c.waits();
    let y = c.cache.allocate(4 * P, b, T).unwrap();
    assert_eq!(y.ptr(), home, "a's range, in place");
    assert_eq!(c.waits(), waits + 1);
    assert_eq!(c.cache.stats().cross_stream_waits, 1);
    c.kernel(b, MemAccess::write(&y));
    c.cache.deallocate(y).unwrap();
    c.assert_race_free();
}

/// Under `Done`, the same program queues no wait: `b` grows instead of
/// taking the range `a`'s queued write still uses. Fails if `b` is handed
/// `a`'s range (with or without a wait) before the GPU ran `a`'s work.
#[test]
fn under_done_a_stream_never_waits_for_memory_another_freed() {
    let c = Cache::manual(2, done());
    let (a, b) = (c.s(0), c.s(1));
    let x = c.cache.allocate(4 * P, a, T).unwrap();
    let home = x.ptr();
    c.kernel(a, MemAccess::write(&x));
    c.cache.deallocate(x).unwrap();
    let (waits, creates) = (c.waits(), c.gpu.call_count(DriverCall::MemCreate));
    let y = c.cache.allocate(4 * P, b, T).unwrap();
    assert_ne!(y.ptr(), home, "a's write may still run there");
    assert_eq!(c.waits(), waits, "no wait on the GPU");
    assert!(c.gpu.call_count(DriverCall::MemCreate) > creates, "b grew");
    let stats = c.cache.stats();
    assert_eq!((stats.cross_stream_waits, stats.borrows), (0, 0));
    c.kernel(b, MemAccess::write(&y));
    c.cache.deallocate(y).unwrap();
    c.assert_race_free();
}

/// Under `Done`, memory another stream freed serves once its work
/// completed on the GPU (a fence the cache recorded past the free, queried
/// done), where it lies, with no wait and no new memory. Fails if the
/// range stays the freeing stream's for good (no fence was ever recorded
/// over it, or its completion is never queried), or if it is handed out
/// before the GPU got there.
#[test]
fn under_done_memory_another_stream_freed_serves_once_its_work_completed() {
    let c = Cache::manual(2, done());
    let (a, b) = (c.s(0), c.s(1));
    let x = c.cache.allocate(4 * P, a, T).unwrap();
    let home = x.ptr();
    c.kernel(a, MemAccess::write(&x));
    c.cache.deallocate(x).unwrap();
    // a's write is queued: b grows, and asks for a fence past a's free.
    let y = c.cache.allocate(4 * P, b, T).unwrap();
    assert_ne!(y.ptr(), home);
    c.kernel(b, MemAccess::write(&y));

    c.gpu.run_until_idle();
    let (waits, creates, held) = (
        c.waits(),
        c.gpu.call_count(DriverCall::MemCreate),
        c.gpu.held_bytes(),
    );
    let z = c.cache.allocate(4 * P, b, T).unwrap();
    assert_eq!(z.ptr(), home, "a's range, done with, where it is");
    assert_eq!(c.waits(), waits, "no wait: the host saw the free done");
    assert_eq!(c.gpu.call_count(DriverCall::MemCreate), creates);
    assert_eq!(c.gpu.held_bytes(), held, "no new memory");
    let stats = c.cache.stats();
    assert_eq!((stats.borrows, stats.cross_stream_waits), (1, 0));
    c.kernel(b, MemAccess::write(&z));
    c.cache.deallocate(z).unwrap();
    c.cache.deallocate(y).unwrap();
    c.assert_race_free();
}

/// Four streams allocating, writing and freeing blocks of varying sizes
/// while the GPU runs a few operations at a time: under `Done` not one
/// wait is queued for memory, memory still moves between streams (once
/// the GPU is past its frees), and the race detector sees nothing.
#[test]
fn under_done_racing_streams_never_wait_and_still_share() {
    let c = Cache::manual(4, done().slack_percent(0));
    let mut live: Vec<Vec<streamalloc::DeviceBlock>> = vec![Vec::new(); 4];
    let mut rng = 11u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for step in 0..3000 {
        let i = (next() % 4) as usize;
        let s = c.s(i);
        if live[i].len() < 6 && next() % 2 == 0 {
            let bytes = [64 << 10, P, 3 * P, 5 * P + 4096][(next() % 4) as usize];
            let block = c.cache.allocate(bytes, s, T).unwrap();
            c.kernel(s, MemAccess::write(&block));
            live[i].push(block);
        } else if !live[i].is_empty() {
            let k = (next() as usize) % live[i].len();
            let block = live[i].swap_remove(k);
            c.kernel(s, MemAccess::read(&block));
            c.cache.deallocate(block).unwrap();
        }
        // The GPU keeps up now and then, a few operations at a time.
        if step % 7 == 0 {
            for _ in 0..(next() % 16) {
                c.gpu.step();
            }
        }
    }
    for (i, blocks) in live.into_iter().enumerate() {
        for block in blocks {
            c.kernel(c.s(i), MemAccess::read(&block));
            c.cache.deallocate(block).unwrap();
        }
    }
    c.assert_race_free();
    let stats = c.cache.stats();
    assert_eq!(c.waits(), 0, "no stream waited on another");
    assert_eq!(stats.cross_stream_waits, 0);
    assert!(stats.borrows > 0, "memory moved between streams: {stats:?}");
}

/// Under `Done`, when the device refuses a growth and no idle mapping can
/// be given back (the freed range shares its mapping with a live block),
/// a range another stream freed serves behind a wait on the GPU rather
/// than an error: the last resort. Fails with `OutOfMemory` without it,
/// or with a race if the wait is skipped.
#[test]
fn under_done_out_of_memory_borrows_behind_a_wait_as_the_last_resort() {
    let gpu = SimGpu::builder().manual().capacity(4 * P).build();
    // Slack 100: the first growth maps a page ahead, which the second
    // block starts on: the first block's mapping stays live with it.
    let c = Cache::on(gpu, 2, done().slack_percent(100));
    let (a, b) = (c.s(0), c.s(1));
    let first = c.cache.allocate(2 * P, a, T).unwrap();
    let second = c.cache.allocate(2 * P, a, T).unwrap();
    assert_eq!(second.ptr(), first.ptr() + 2 * P as u64);
    assert_eq!(c.gpu.held_bytes(), 4 * P, "the device is full");
    let home = first.ptr();
    c.kernel(a, MemAccess::write(&first));
    c.cache.deallocate(first).unwrap();
    let waits = c.waits();
    let on_b = c.cache.allocate(2 * P, b, T).unwrap();
    assert_eq!(on_b.ptr(), home, "a's range, behind a wait");
    assert_eq!(c.waits(), waits + 1);
    assert_eq!(c.cache.stats().cross_stream_waits, 1);
    c.kernel(b, MemAccess::write(&on_b));
    c.cache.deallocate(on_b).unwrap();
    c.cache.deallocate(second).unwrap();
    c.assert_race_free();
}

/// Size classes follow the policy: under `Done` a block cached on another
/// stream is not stolen (a steal always waits on the GPU); the stream
/// takes new memory. Under `Wait` the same program steals, and counts the
/// wait.
#[test]
fn under_done_size_classes_do_not_steal() {
    for (reuse, steals) in [(CrossStreamReuse::Wait, 1), (CrossStreamReuse::Done, 0)] {
        let f = support::sim_with(SimGpu::builder().manual().build(), 2);
        let gpu = f.sim.clone().unwrap();
        let config = CacheConfig::default()
            .virtual_memory(false)
            .cross_stream(reuse);
        let cache = CachingResource::with_config(f.resource.clone(), config);
        let (a, b) = (f.streams[0], f.streams[1]);
        // b known to the cache; a block cached on a only.
        let warm = cache.allocate(64 << 10, b, T).unwrap();
        let block = cache.allocate(4096, a, T).unwrap();
        cache.deallocate(block).unwrap();
        let waits = gpu.call_count(DriverCall::StreamWaitEvent);
        let other = cache.allocate(4000, b, T).unwrap();
        let stats = cache.stats();
        assert_eq!(stats.steals, steals, "{reuse:?}");
        assert_eq!(stats.cross_stream_waits, steals, "{reuse:?}");
        if steals == 0 {
            assert_eq!(gpu.call_count(DriverCall::StreamWaitEvent), waits);
        }
        cache.deallocate(other).unwrap();
        cache.deallocate(warm).unwrap();
        gpu.run_until_idle();
        assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
    }
}

/// Stream `a`'s program that leaves a free range of its own, still in
/// use on the GPU, stretching over pages with no memory behind them:
/// `a` takes `unbacked` pages and one more, frees the first block and
/// lets the GPU finish it, so that two trims give its memory back (its
/// addresses stay tagged with `a`'s free); then `a` writes the page it
/// still holds and frees it, its kernel queued. The free range from the
/// arena's start now holds `unbacked` pages with no memory and one page
/// of `a`'s memory that its queued write uses, all tagged with that free.
/// Returns the first page's address.
fn a_range_over_unbacked_pages(c: &Cache, a: streamalloc::StreamId, unbacked: usize) -> u64 {
    let first = c.cache.allocate(unbacked * P, a, T).unwrap();
    let last = c.cache.allocate(P, a, T).unwrap();
    let home = first.ptr();
    assert_eq!(last.ptr(), home + (unbacked * P) as u64);
    c.kernel(a, MemAccess::write(&first));
    c.cache.deallocate(first).unwrap();
    c.gpu.run_until_idle();
    // The first trim records fences past the free, the second sees them
    // done and unmaps the first block's memory.
    c.cache.trim().unwrap();
    c.gpu.run_until_idle();
    c.cache.trim().unwrap();
    assert_eq!(c.gpu.held_bytes(), P, "only the page a holds is mapped");
    c.kernel(a, MemAccess::write(&last));
    c.cache.deallocate(last).unwrap();
    // Asking for the idle bytes puts a's last free in the arena, where it
    // merges with the range before it and the free tail after it.
    assert_eq!(c.cache.cached_bytes(), P);
    home
}

/// A block placed on pages with no memory behind them takes new memory,
/// which no work queued before can touch (memory is unmapped only once
/// the host saw the GPU done with it): it waits on the GPU for nobody,
/// though the free range it lies in carries the tag of a free whose
/// kernel is still queued (tags spread when free neighbours merge). Under
/// `Wait` such a wait only serialised the streams; under `Done` the block
/// is not refused the range. Fails if `b` waits for `a`'s fence, or is
/// moved off the range.
#[test]
fn a_block_on_pages_with_no_memory_waits_for_nobody() {
    for reuse in [CrossStreamReuse::Wait, CrossStreamReuse::Done] {
        let c = Cache::manual(2, CacheConfig::default().cross_stream(reuse));
        let (a, b) = (c.s(0), c.s(1));
        let home = a_range_over_unbacked_pages(&c, a, 2);
        let (waits, creates) = (c.waits(), c.gpu.call_count(DriverCall::MemCreate));
        let on_b = c.cache.allocate(2 * P, b, T).unwrap();
        assert_eq!(on_b.ptr(), home, "{reuse:?}: the pages with no memory");
        assert_eq!(c.waits(), waits, "{reuse:?}: a wait for a's free");
        assert!(
            c.gpu.call_count(DriverCall::MemCreate) > creates,
            "{reuse:?}: new memory"
        );
        let stats = c.cache.stats();
        assert_eq!(
            (stats.cross_stream_waits, stats.borrows),
            (0, 0),
            "{reuse:?}"
        );
        c.kernel(b, MemAccess::write(&on_b));
        c.cache.deallocate(on_b).unwrap();
        c.assert_race_free();
    }
}

/// The same range, with the block reaching one page of `a`'s memory that
/// `a`'s queued write uses: `b` waits on the GPU for `a`'s free, and the
/// race detector finds `b`'s write ordered after `a`'s. Fails with a race
/// if the wait is skipped because most of the block had no memory.
#[test]
fn a_block_on_one_page_of_memory_another_stream_freed_still_waits() {
    let c = Cache::manual(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let home = a_range_over_unbacked_pages(&c, a, 1);
    let waits = c.waits();
    let on_b = c.cache.allocate(2 * P, b, T).unwrap();
    assert_eq!(on_b.ptr(), home, "a page with none and a's page");
    assert_eq!(c.waits(), waits + 1, "one wait, for a's free");
    assert_eq!(c.cache.stats().cross_stream_waits, 1);
    c.kernel(b, MemAccess::write(&on_b));
    c.cache.deallocate(on_b).unwrap();
    c.assert_race_free();
}

/// Two blocks `b` places in one range `a` freed, `a`'s write still
/// queued: the first waits on the GPU for `a`'s fence past the free, the
/// second needs no wait of its own (`b` already waits for that very
/// fence: stream order puts its next work after the first wait). Fails
/// if `b` queues a second wait for the fence it waits for already, or
/// with a race if the one wait does not order both blocks.
#[test]
fn a_stream_waits_once_for_a_fence_it_already_waits_for() {
    let c = Cache::manual(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let x = c.cache.allocate(8 * P, a, T).unwrap();
    let home = x.ptr();
    c.kernel(a, MemAccess::write(&x));
    c.cache.deallocate(x).unwrap();
    let waits = c.waits();
    let first = c.cache.allocate(4 * P, b, T).unwrap();
    assert_eq!(first.ptr(), home, "a's range, in place");
    assert_eq!(c.waits(), waits + 1, "a wait for a's free");
    let second = c.cache.allocate(4 * P, b, T).unwrap();
    assert_eq!(second.ptr(), home + (4 * P) as u64, "the rest of a's range");
    assert_eq!(c.waits(), waits + 1, "a second wait for the same fence");
    assert_eq!(c.cache.stats().cross_stream_waits, 1);
    for y in [first, second] {
        c.kernel(b, MemAccess::write(&y));
        c.cache.deallocate(y).unwrap();
    }
    c.assert_race_free();
}

/// After `b` waited for `a`'s fence past one free, a later free of `a`
/// (a write queued after that fence) is covered by a newer fence: a block
/// `b` places there waits again. Fails with a race (and one wait short)
/// if the wait for the older fence excuses the newer.
#[test]
fn a_newer_fence_of_the_same_stream_is_waited_for_again() {
    let c = Cache::manual(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let x1 = c.cache.allocate(4 * P, a, T).unwrap();
    let x2 = c.cache.allocate(4 * P, a, T).unwrap();
    let (home1, home2) = (x1.ptr(), x2.ptr());
    c.kernel(a, MemAccess::write(&x1));
    c.cache.deallocate(x1).unwrap();
    let waits = c.waits();
    let y1 = c.cache.allocate(4 * P, b, T).unwrap();
    assert_eq!(y1.ptr(), home1);
    assert_eq!(c.waits(), waits + 1, "a wait for a's first free");
    c.kernel(a, MemAccess::write(&x2));
    c.cache.deallocate(x2).unwrap();
    let y2 = c.cache.allocate(4 * P, b, T).unwrap();
    assert_eq!(y2.ptr(), home2);
    assert_eq!(c.waits(), waits + 2, "a wait for a's second free");
    assert_eq!(c.cache.stats().cross_stream_waits, 2);
    for y in [y1, y2] {
        c.kernel(b, MemAccess::write(&y));
        c.cache.deallocate(y).unwrap();
    }
    c.assert_race_free();
}

/// A capture on `b` between `a`'s free and `b`'s block on it excuses no
/// wait: told of the capture (`capture_aware`, the default), the cache
/// places `b`'s block in it with no wait (only ranges no queued work
/// touches); not told, it tries one for `a`'s free, which the driver
/// refuses (an event recorded outside the capture), spoiling the capture.
/// Either way, once the capture is over, a block `b` places on `a`'s
/// range waits. Fails with a race (and no wait) if what the capture did
/// counts as a wait of `b`'s.
#[test]
fn a_capture_does_not_excuse_a_wait_after_it() {
    for aware in [true, false] {
        let c = Cache::manual(2, CacheConfig::default().capture_aware(aware));
        let (a, b) = (c.s(0), c.s(1));
        let x = c.cache.allocate(8 * P, a, T).unwrap();
        let home = x.ptr();
        c.kernel(a, MemAccess::write(&x));
        c.cache.deallocate(x).unwrap();
        let raw_b = c.pool.raw(b).unwrap();
        c.gpu.begin_capture(raw_b, CaptureMode::Relaxed).unwrap();
        let before = c.waits();
        let captured = c.cache.allocate(4 * P, b, T);
        assert_eq!(c.waits() > before, !aware, "capture_aware({aware}): tried");
        let ended = c.gpu.end_capture(raw_b);
        assert_eq!(ended.is_ok(), aware, "capture_aware({aware}): invalidated");
        if let Ok(block) = &captured {
            assert_ne!(block.ptr(), home, "capture_aware({aware}): a's range");
        }
        let waits = c.waits();
        let after = c.cache.allocate(4 * P, b, T).unwrap();
        assert_eq!(after.ptr(), home, "capture_aware({aware}): a's range");
        assert_eq!(c.waits(), waits + 1, "capture_aware({aware}): no wait");
        c.kernel(b, MemAccess::write(&after));
        c.cache.deallocate(after).unwrap();
        // Not told of the capture, the cache grew new memory for the block
        // once the wait was refused: mapped memory of its own, valid on
        // `b` after the spoilt capture as any block.
        let captured = match aware {
            false => {
                let block = captured.expect("new memory, after the refused wait");
                c.kernel(b, MemAccess::write(&block));
                c.cache.deallocate(block).unwrap();
                None
            }
            true => captured.ok(),
        };
        c.assert_race_free();
        if let Ok(graph) = ended {
            c.gpu.graph_destroy(graph).unwrap();
        }
        if let Some(block) = captured {
            let _ = c.cache.deallocate(block);
        }
    }
}

/// Where the cache does not ask whether a stream captures
/// (`capture_aware(false)`), a wait `b` made before does not spare one
/// while `b` captures unbeknown to it: the wait is tried (and refused,
/// spoiling the capture) rather than the block handed into a graph whose
/// replays nothing orders after `a`'s free. Fails if the wait made before
/// the capture spares the one in it.
#[test]
fn a_cache_blind_to_captures_never_spares_a_wait() {
    let c = Cache::manual(2, CacheConfig::default().capture_aware(false));
    let (a, b) = (c.s(0), c.s(1));
    let x = c.cache.allocate(8 * P, a, T).unwrap();
    let home = x.ptr();
    c.kernel(a, MemAccess::write(&x));
    c.cache.deallocate(x).unwrap();
    let waits = c.waits();
    let first = c.cache.allocate(4 * P, b, T).unwrap();
    assert_eq!(first.ptr(), home, "a's range, in place");
    assert_eq!(c.waits(), waits + 1, "a wait for a's free");
    let raw_b = c.pool.raw(b).unwrap();
    c.gpu.begin_capture(raw_b, CaptureMode::Relaxed).unwrap();
    let captured = c.cache.allocate(4 * P, b, T);
    assert_eq!(c.waits(), waits + 2, "the wait made before spared this one");
    assert!(c.gpu.end_capture(raw_b).is_err(), "the capture was spoilt");
    // New memory once the wait was refused: valid on `b` after the capture.
    let captured = captured.expect("new memory, after the refused wait");
    assert_ne!(
        captured.ptr(),
        home + (4 * P) as u64,
        "a's range, in a graph"
    );
    for block in [first, captured] {
        c.kernel(b, MemAccess::write(&block));
        c.cache.deallocate(block).unwrap();
    }
    c.assert_race_free();
}
