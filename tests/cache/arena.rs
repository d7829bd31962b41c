//! The caching tier's virtual-memory arena on the simulated device:
//! reuse on the freeing stream with no driver call, memory moving between
//! streams only once the GPU is done with it, block-use tracking, trim,
//! out-of-memory, bad input, fault injection, and a random model check;
//! growths, kept blocks, lending and moves of memory in the files beside.

use crate::support;

use std::sync::Arc;

use proptest::prelude::*;
use streamalloc::DriverCall;
use streamalloc::gpu::sim::{MemAccess, RaceKind, SimGpu};
use streamalloc::{Access, AllocTag, BlockState, DeviceMemoryResource, ResourceError, StreamId};
use streamalloc::{CacheConfig, CachingResource};

const T: AllocTag = AllocTag::UNTAGGED;
const P: usize = 2 << 20;

use support::arena::ArenaCache as Cache;

mod growth;
mod kept;
mod lending;
mod moves;

impl Cache {
    fn new(streams: usize, config: CacheConfig) -> Self {
        Self::manual(streams, config)
    }

    fn creates(&self) -> u64 {
        self.gpu.call_count(DriverCall::MemCreate)
    }
}

#[test]
fn same_stream_reuse_needs_no_driver_call_and_outstanding_is_what_is_mapped() {
    let c = Cache::new(1, CacheConfig::default());
    let a = c.s(0);
    let block = c.cache.allocate(1000, a, T).unwrap();
    assert_eq!(c.cache.bytes_outstanding(), P, "one page mapped");
    assert_eq!(c.gpu.held_bytes(), P);
    c.kernel(a, MemAccess::write(&block));
    let (ptr, id) = (block.ptr(), block.id());
    c.cache.deallocate(block).unwrap();
    assert_eq!(c.cache.cached_bytes(), P, "the page is idle, still mapped");
    assert_eq!(c.cache.block_state(id), Some(BlockState::Retired));

    let calls = (c.creates(), c.gpu.call_count(DriverCall::AllocAsync));
    let again = c.cache.allocate(900, a, T).unwrap();
    assert_eq!(again.ptr(), ptr, "the freed range, at once, on its stream");
    assert_eq!(
        (c.creates(), c.gpu.call_count(DriverCall::AllocAsync)),
        calls
    );
    c.kernel(a, MemAccess::write(&again));
    // Small blocks share a page.
    let other = c.cache.allocate(4096, a, T).unwrap();
    assert_eq!(c.cache.bytes_outstanding(), P);
    assert!(other.ptr() >= again.ptr() + 1024 || other.ptr() + 4096 <= again.ptr());
    c.cache.deallocate(other).unwrap();
    c.cache.deallocate(again).unwrap();
    let stats = c.cache.stats();
    assert_eq!((stats.hits, stats.misses), (2, 1));
    c.assert_race_free();
}

#[test]
fn a_large_block_is_mapped_in_few_calls() {
    let c = Cache::new(1, CacheConfig::default().max_mapping_bytes(16 << 20));
    let block = c.cache.allocate(40 << 20, c.s(0), T).unwrap();
    // The last mapping also takes the free pages after the block, up to
    // the slack (7% of 40 MiB: one 2 MiB page).
    assert_eq!(c.cache.bytes_outstanding(), 42 << 20);
    assert_eq!(c.creates(), 3, "16 + 16 + 8 (and 2 ahead) MiB");
    assert_eq!(c.gpu.call_count(DriverCall::MemSetAccess), 3);
    c.cache.deallocate(block).unwrap();
    c.assert_race_free();
}

/// A workload that keeps growing grows the arena in geometric steps (each
/// growth maps the free pages after the block up to the slack over what is
/// live), never past the slack: few growths, each costing about the same
/// on the H200 whatever its size.
#[test]
fn a_growing_workload_maps_in_geometric_steps_within_the_slack() {
    for slack in [0, 7] {
        let c = Cache::new(1, CacheConfig::default().slack_percent(slack));
        let mut blocks = Vec::new();
        let mut live = 0;
        for i in 0..600 {
            // 1.5 to 4.5 MiB: blocks straddle pages.
            let bytes = (3 << 19) + (i % 5) * (1 << 20) + 4096;
            blocks.push(c.cache.allocate(bytes, c.s(0), T).unwrap());
            live += bytes;
            // The block just placed may need up to two pages past the
            // target (its own ends), never more.
            let target = (live + live / 100 * slack).max(P);
            let held = c.cache.bytes_outstanding();
            assert!(held <= target + 2 * P, "{i}: {held} held, {live} live");
        }
        let growths = c.creates();
        println!(
            "slack {slack}: {growths} growths, {} held for {live} live",
            c.cache.bytes_outstanding()
        );
        if slack == 0 {
            assert!(growths > 500, "no slack, no steps ahead: {growths}");
        } else {
            // ln(2.2 GB / 4 MB) / ln(1.07) = 93 at most; 66 here, against
            // 313 when a growth mapped at most the block's size again.
            assert!(growths <= 80, "{growths} growths for 600 blocks");
        }
        for b in blocks {
            c.cache.deallocate(b).unwrap();
        }
        c.assert_race_free();
    }
}

/// Memory one stream freed reaches another while the GPU may still use it
/// only in place, behind a wait on the GPU: never unmapped before the work
/// queued on it ran. Fails if the page is unmapped early or `b` is not
/// ordered after `a`'s write (the detector sees the race).
#[test]
fn another_stream_gets_memory_only_behind_the_gpu() {
    // No slack: every new page first looks for idle memory to give back.
    let c = Cache::new(2, CacheConfig::default().slack_percent(0));
    let (a, b) = (c.s(0), c.s(1));
    let block = c.cache.allocate(P, a, T).unwrap();
    let home = block.ptr();
    c.kernel(a, MemAccess::write(&block));
    c.cache.deallocate(block).unwrap();
    // Manual device: the write on a has not run.
    let waits = c.gpu.call_count(DriverCall::StreamWaitEvent);
    let on_b = c.cache.allocate(P, b, T).unwrap();
    assert_eq!(c.gpu.call_count(DriverCall::MemUnmap), 0);
    assert_eq!(on_b.ptr(), home, "a's page, in place");
    assert_eq!(c.gpu.call_count(DriverCall::StreamWaitEvent), waits + 1);
    assert_eq!(c.cache.bytes_outstanding(), P, "no new memory");
    c.kernel(b, MemAccess::write(&on_b));
    c.cache.deallocate(on_b).unwrap();
    assert!(c.gpu.races().is_empty(), "{:#?}", c.gpu.races());

    // Once the work ran, a larger block on b grows over the same page.
    c.gpu.run_until_idle();
    let held = c.gpu.held_bytes();
    let big = c.cache.allocate(3 * P, b, T).unwrap();
    assert!(c.gpu.held_bytes() <= held + 2 * P);
    c.kernel(b, MemAccess::write(&big));
    c.cache.deallocate(big).unwrap();
    c.assert_race_free();
}

/// A backend that could not make an event when the cache was made never
/// has a stream wait for another's fence: memory another stream freed
/// serves only once the GPU is known done with it. Fails if a wait is
/// queued, or if `b` reuses the range while `a`'s write may still run.
#[test]
fn a_backend_without_events_never_waits_across_streams() {
    let gpu = SimGpu::builder().manual().capacity(64 << 30).build();
    // The tier asks for one event when it is made: that one fails.
    gpu.fail_nth(DriverCall::EventCreate, 1);
    let c = Cache::on(gpu, 2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let x = c.cache.allocate(4 * P, a, T).unwrap();
    c.kernel(a, MemAccess::write(&x));
    c.cache.deallocate(x).unwrap();
    assert_eq!(c.cache.cached_bytes(), 4 * P);
    let waits = c.gpu.call_count(DriverCall::StreamWaitEvent);
    let y = c.cache.allocate(4 * P, b, T).unwrap();
    assert_eq!(c.gpu.call_count(DriverCall::StreamWaitEvent), waits);
    c.kernel(b, MemAccess::write(&y));
    c.cache.deallocate(y).unwrap();
    c.assert_race_free();
}

/// Memory stream `a` freed serves another stream where it is, with no
/// driver call but events: while `a`'s work on it may still be queued, the
/// borrower's stream waits on the GPU for a fence recorded on `a` after the
/// free; once that fence has completed, with no wait at all. The
/// borrower's free tags the range with the borrower, so that `a`'s reuse
/// waits for the borrower's work in turn. Fails if a wait is skipped (the
/// detector sees one stream's write race another's queued write and
/// free).
#[test]
fn memory_another_stream_freed_is_lent_behind_its_fence() {
    let c = Cache::new(3, CacheConfig::default());
    let (a, b, s3) = (c.s(0), c.s(1), c.s(2));
    let block = c.cache.allocate(4 * P, a, T).unwrap();
    let home = block.ptr();
    c.kernel(a, MemAccess::write(&block));
    c.cache.deallocate(block).unwrap();
    // Asking for the idle bytes puts the last free in the arena.
    assert_eq!(c.cache.cached_bytes(), 4 * P);

    // Manual device: a's write and free have not run. b gets the range,
    // its stream waiting for a fence on a: no new memory.
    let (creates, waits) = (c.creates(), c.gpu.call_count(DriverCall::StreamWaitEvent));
    let on_b = c.cache.allocate(4 * P, b, T).unwrap();
    assert_eq!(c.cache.stats().borrows, 1);
    assert_eq!(on_b.ptr(), home, "a's range, where it is");
    assert_eq!(c.creates(), creates, "no new memory");
    assert_eq!(c.gpu.call_count(DriverCall::StreamWaitEvent), waits + 1);
    c.kernel(b, MemAccess::write(&on_b));
    assert!(c.gpu.races().is_empty(), "{:#?}", c.gpu.races());
    c.cache.deallocate(on_b).unwrap();

    // Tagged with b, it serves a behind a wait for b's fence; once a
    // fence on a has completed, it serves a third stream with no wait: no
    // new memory, nothing unmapped.
    let elsewhere = c.cache.allocate(4 * P, a, T).unwrap();
    assert_eq!(elsewhere.ptr(), home, "a reuses its range after b's free");
    assert_eq!(c.cache.stats().borrows, 2, "b's free, behind b's fence");
    c.kernel(a, MemAccess::write(&elsewhere));
    c.cache.deallocate(elsewhere).unwrap();
    // A trim records a fence over the idle range (it gives back nothing
    // the GPU may still use), and the GPU runs past it.
    c.cache.trim().unwrap();
    assert_eq!(c.cache.cached_bytes(), 4 * P);
    c.gpu.run_until_idle();
    let (creates, held) = (c.creates(), c.gpu.held_bytes());
    let waits = c.gpu.call_count(DriverCall::StreamWaitEvent);
    let lent = c.cache.allocate(4 * P, s3, T).unwrap();
    assert_eq!(c.cache.stats().borrows, 3);
    assert_eq!(lent.ptr(), home, "a's range, where it is");
    assert_eq!(
        c.gpu.call_count(DriverCall::StreamWaitEvent),
        waits,
        "the fence is done"
    );
    assert_eq!(c.creates(), creates);
    assert_eq!(c.gpu.held_bytes(), held);
    assert_eq!(c.gpu.call_count(DriverCall::MemUnmap), 0);
    assert_eq!(c.cache.cached_bytes(), 0, "a's pages in use");

    // The borrower writes and frees (nothing ran): a reuses the range,
    // its write ordered after the borrower's by a wait for its fence.
    c.kernel(s3, MemAccess::write(&lent));
    c.cache.deallocate(lent).unwrap();
    let again = c.cache.allocate(4 * P, a, T).unwrap();
    assert_eq!(again.ptr(), home, "the same range for a");
    c.kernel(a, MemAccess::write(&again));
    c.cache.deallocate(again).unwrap();
    c.assert_race_free();
    assert_eq!(c.cache.leased_bytes(), 0);
    // A trim gives back what the fences show done, and records fences
    // over the rest for the next one.
    c.cache.trim().unwrap();
    c.gpu.run_until_idle();
    c.cache.trim().unwrap();
    assert_eq!(c.cache.bytes_outstanding(), 0, "everything given back");
}

/// A block lent by another stream and used there, freed while the home
/// stream reuses its neighbours: stream after stream of small and large
/// blocks on four streams, with no synchronize, stays race free and ends
/// with nothing held.
#[test]
fn lending_between_racing_streams_stays_race_free() {
    let c = Cache::new(4, CacheConfig::default().slack_percent(0));
    let mut live: Vec<Vec<streamalloc::DeviceBlock>> = vec![Vec::new(); 4];
    let mut rng = 7u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..600 {
        let i = (next() % 4) as usize;
        let s = c.s(i);
        if live[i].len() > 6 || (!live[i].is_empty() && next() % 2 == 0) {
            let k = (next() as usize) % live[i].len();
            let block = live[i].swap_remove(k);
            c.kernel(s, MemAccess::write(&block));
            c.cache.deallocate(block).unwrap();
        } else {
            let bytes = [4096, P / 2, P, 3 * P, 5 * P][(next() % 5) as usize];
            let block = c.cache.allocate(bytes, s, T).unwrap();
            c.kernel(s, MemAccess::write(&block));
            live[i].push(block);
        }
        if round % 50 == 49 {
            // Let the GPU catch up now and then, so that fences complete.
            c.gpu.run_until_idle();
            let _ = c.cache.cached_bytes();
        }
    }
    assert!(c.cache.stats().borrows > 0, "{:?}", c.cache.stats());
    for (i, blocks) in live.into_iter().enumerate() {
        for block in blocks {
            c.kernel(c.s(i), MemAccess::read(&block));
            c.cache.deallocate(block).unwrap();
        }
    }
    c.assert_race_free();
    c.cache.trim().unwrap();
    c.gpu.run_until_idle();
    c.cache.trim().unwrap();
    assert_eq!(c.cache.bytes_outstanding(), 0);
}

#[test]
fn uses_on_other_streams_are_waited_for_before_reuse() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let block = c.cache.allocate(4096, a, T).unwrap();
    c.kernel(a, MemAccess::write(&block));
    c.cache
        .prepare_block_use(block.id(), b, Access::Read)
        .unwrap();
    c.kernel(b, MemAccess::read(&block));
    c.cache
        .finish_block_use(block.id(), b, Access::Read)
        .unwrap();
    let ptr = block.ptr();
    c.cache.deallocate(block).unwrap();
    let again = c.cache.allocate(4096, a, T).unwrap();
    assert_eq!(again.ptr(), ptr);
    // Without the wait queued at the free, this write races b's read.
    c.kernel(a, MemAccess::write(&again));
    c.cache.deallocate(again).unwrap();
    c.assert_race_free();
}

#[test]
fn record_block_use_is_waited_for_too() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let block = c.cache.allocate(4096, a, T).unwrap();
    c.cache
        .prepare_block_use(block.id(), b, Access::Read)
        .unwrap();
    c.kernel(b, MemAccess::read(&block));
    c.cache.record_block_use(&block, b).unwrap();
    c.cache.deallocate(block).unwrap();
    let again = c.cache.allocate(4096, a, T).unwrap();
    c.kernel(a, MemAccess::write(&again));
    c.cache.deallocate(again).unwrap();
    c.assert_race_free();
}

#[test]
fn a_missing_hook_is_still_reported() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let block = c.cache.allocate(4096, a, T).unwrap();
    c.kernel(b, MemAccess::write(&block));
    c.gpu.run_until_idle();
    assert!(
        c.gpu.races().iter().any(|r| r.kind == RaceKind::Unordered),
        "{:#?}",
        c.gpu.races()
    );
    c.cache.deallocate(block).unwrap();
}

#[test]
fn a_use_after_free_is_reported() {
    let c = Cache::new(1, CacheConfig::default());
    let a = c.s(0);
    let block = c.cache.allocate(4096, a, T).unwrap();
    let stale = MemAccess::read(&block);
    c.cache.deallocate(block).unwrap();
    c.kernel(a, stale);
    assert_eq!(c.gpu.races()[0].kind, RaceKind::UseAfterFree);
}

#[test]
fn trim_gives_back_what_the_gpu_is_done_with_without_waiting() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let x = c.cache.allocate(3 * P, a, T).unwrap();
    let y = c.cache.allocate(P, b, T).unwrap();
    c.kernel(a, MemAccess::write(&x));
    c.cache.deallocate(x).unwrap();
    c.cache.deallocate(y).unwrap();
    assert_eq!(c.cache.bytes_outstanding(), 4 * P);
    // Nothing has run: trim records fences, gives nothing back, waits for
    // nothing.
    assert_eq!(c.cache.trim().unwrap(), 0);
    assert_eq!(c.cache.bytes_outstanding(), 4 * P);
    c.gpu.run_until_idle();
    assert_eq!(c.cache.trim().unwrap(), 4 * P);
    assert_eq!(c.cache.bytes_outstanding(), 0);
    assert_eq!(c.gpu.held_bytes(), 0);
    c.assert_race_free();
}

#[test]
fn idle_memory_is_given_back_before_out_of_memory() {
    let gpu = SimGpu::builder().manual().capacity(8 * P).build();
    let c = Cache::on(gpu, 2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let x = c.cache.allocate(6 * P, a, T).unwrap();
    c.kernel(a, MemAccess::write(&x));
    c.cache.deallocate(x).unwrap();
    // b needs 6 pages; a's are idle but its write has not run: the cache
    // waits for it as a last resort rather than failing.
    let y = c.cache.allocate(6 * P, b, T).unwrap();
    assert_eq!(c.cache.bytes_outstanding(), 6 * P);
    c.kernel(b, MemAccess::write(&y));
    // And the inner pool gets idle memory back too.
    c.cache.deallocate(y).unwrap();
    let big = c.cache.allocate(7 * P, a, T).unwrap();
    c.cache.deallocate(big).unwrap();
    c.assert_race_free();
}

#[test]
fn out_of_memory_changes_nothing() {
    let gpu = SimGpu::builder().manual().capacity(4 * P).build();
    let c = Cache::on(gpu, 1, CacheConfig::default());
    let a = c.s(0);
    let x = c.cache.allocate(3 * P, a, T).unwrap();
    let before = (c.cache.bytes_outstanding(), c.cache.leased_bytes());
    let err = c.cache.allocate(2 * P, a, T).unwrap_err();
    assert!(matches!(err, ResourceError::OutOfMemory { .. }), "{err}");
    assert_eq!(
        (c.cache.bytes_outstanding(), c.cache.leased_bytes()),
        before
    );
    let fits = c.cache.allocate(P - 512, a, T).unwrap();
    c.cache.deallocate(fits).unwrap();
    c.cache.deallocate(x).unwrap();
    c.assert_race_free();
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let c = Cache::new(1, CacheConfig::default());
    let other = Cache::new(1, CacheConfig::default());
    let a = c.s(0);
    let block = c.cache.allocate(4096, a, T).unwrap();
    let foreign = other.cache.allocate(4096, other.s(0), T).unwrap();
    let before = (c.cache.bytes_outstanding(), c.cache.leased_bytes());
    assert!(matches!(
        c.cache.deallocate(foreign.clone()),
        Err(ResourceError::ForeignBlock { .. })
    ));
    assert!(matches!(
        c.cache.allocate(1, StreamId::new(7, 0), T),
        Err(ResourceError::WrongDevice { .. })
    ));
    assert!(
        c.cache
            .prepare_block_use(block.id(), StreamId::new(0, 99), Access::Read)
            .is_err()
    );
    assert_eq!(
        (c.cache.bytes_outstanding(), c.cache.leased_bytes()),
        before
    );
    c.cache.deallocate(block.clone()).unwrap();
    assert!(matches!(
        c.cache.deallocate(block),
        Err(ResourceError::DoubleFree { .. })
    ));
    other.cache.deallocate(foreign).unwrap();
}

#[test]
fn a_failed_mapping_leaves_nothing_behind() {
    let c = Cache::new(1, CacheConfig::default());
    let a = c.s(0);
    for call in [
        DriverCall::MemCreate,
        DriverCall::MemMap,
        DriverCall::MemSetAccess,
    ] {
        c.gpu.fail_nth(call, 1);
        let err = c.cache.allocate(P, a, T).unwrap_err();
        assert!(
            matches!(err, ResourceError::Driver { call: c2, .. } if c2 == call),
            "{err}"
        );
        assert_eq!(c.cache.leased_bytes(), 0);
        assert_eq!(c.gpu.held_bytes(), c.cache.bytes_outstanding());
    }
    let ok = c.cache.allocate(P, a, T).unwrap();
    c.cache.deallocate(ok).unwrap();
    c.assert_race_free();
}

#[test]
fn without_virtual_memory_the_cache_uses_size_classes() {
    let gpu = SimGpu::builder().manual().vm_granularity(0).build();
    let c = Cache::on(gpu, 1, CacheConfig::default());
    let block = c.cache.allocate(1000, c.s(0), T).unwrap();
    c.cache.deallocate(block).unwrap();
    assert_eq!(c.cache.cached_bytes(), 1024, "1000 B in its class");
    assert_eq!(c.gpu.call_count(DriverCall::MemCreate), 0);
}

#[test]
fn dropping_the_cache_gives_everything_back() {
    let c = Cache::new(2, CacheConfig::default());
    for (i, bytes) in [(0, 5 * P + 7), (1, 100), (0, 3000)] {
        let b = c.cache.allocate(bytes, c.s(i), T).unwrap();
        c.kernel(c.s(i), MemAccess::write(&b));
        c.cache.deallocate(b).unwrap();
    }
    let Cache { gpu, cache, .. } = c;
    drop(cache);
    assert_eq!(gpu.physical_handles(), 0);
    assert_eq!(gpu.held_bytes(), 0);
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
}

#[test]
fn threads_on_their_own_streams_share_one_cache() {
    let gpu = SimGpu::builder().capacity(64 << 30).build();
    let c = Arc::new(Cache::on(gpu, 4, CacheConfig::default()));
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let c = c.clone();
            std::thread::spawn(move || {
                let s = c.s(i);
                for n in 0..200 {
                    let b = c.cache.allocate(1 + (n * 7919) % (3 << 20), s, T).unwrap();
                    c.kernel(s, MemAccess::write(&b));
                    c.cache.deallocate(b).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(c.cache.leased_bytes(), 0);
    c.assert_race_free();
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: crate::support::regressions::beside_source(),
        ..ProptestConfig::with_cases(48)
    })]

    /// Random allocations and frees on three streams against a model:
    /// live blocks never overlap, what is held covers what is live and
    /// stays within the slack (plus what could not be given back yet), and
    /// the simulated device sees no race.
    #[test]
    fn random_traffic_matches_the_model(
        ops in proptest::collection::vec((0usize..3, 1usize..(6 << 20), any::<bool>()), 1..120),
        slack in 0usize..20,
    ) {
        let c = Cache::new(3, CacheConfig::default().slack_percent(slack).max_mapping_bytes(4 * P));
        let mut live: Vec<streamalloc::DeviceBlock> = Vec::new();
        for (stream, bytes, free) in ops {
            if free && !live.is_empty() {
                let b = live.swap_remove(bytes % live.len());
                c.cache.deallocate(b).unwrap();
            } else {
                let s = c.s(stream);
                let b = c.cache.allocate(bytes, s, T).unwrap();
                prop_assert_eq!(b.ptr() % 512, 0);
                for o in &live {
                    let disjoint = b.ptr() + b.size() as u64 <= o.ptr() || o.ptr() + o.size() as u64 <= b.ptr();
                    prop_assert!(disjoint, "overlap");
                }
                c.kernel(s, MemAccess::write(&b));
                live.push(b);
            }
            let live_bytes: usize = live.iter().map(|b| b.size()).sum();
            prop_assert!(c.cache.bytes_outstanding() >= live_bytes);
            prop_assert_eq!(c.cache.bytes_outstanding(), c.gpu.held_bytes());
            if stream == 0 {
                c.gpu.run_until_idle();
            }
        }
        for b in live.drain(..) {
            c.cache.deallocate(b).unwrap();
        }
        c.gpu.run_until_idle();
        prop_assert!(c.gpu.races().is_empty(), "{:#?}", c.gpu.races());
        c.cache.trim().unwrap();
        c.gpu.run_until_idle();
        c.cache.trim().unwrap();
        prop_assert_eq!(c.cache.bytes_outstanding(), 0);
    }
}

/// `Budget(Cache(R))`: the budget counts the pages the arena maps, and a
/// request the arena serves from idle mapped memory costs it nothing.
#[test]
fn a_budget_above_the_arena_counts_mapped_pages() {
    use streamalloc::{Budget, BudgetResource};
    let f = support::sim(1);
    let s = f.stream(0);
    let budget = Budget::new(2 * P);
    let r = BudgetResource::new(CachingResource::new(f.resource.clone()), &budget);
    let a = r.allocate(1000, s, T).unwrap();
    assert_eq!(budget.in_use(), P);
    let b = r.allocate(P / 2, s, T).unwrap();
    assert_eq!(budget.in_use(), P, "the same page");
    r.deallocate(a).unwrap();
    r.deallocate(b).unwrap();
    let c = r
        .allocate(P, s, T)
        .expect("idle mapped memory fits a full budget");
    assert!(budget.in_use() <= 2 * P);
    assert_eq!(budget.in_use(), r.inner().bytes_outstanding());
    r.deallocate(c).unwrap();
}

/// On a real GPU: blocks of the arena are written by the device (a memset
/// through the resource's backend), reused on their stream, used and
/// freed across streams, and everything goes back to the device on trim
/// and drop; the backend counts the physical memory it holds.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_the_arena_maps_reuses_and_gives_back() {
    use streamalloc::gpu::Gpu;
    let f = support::cuda(2);
    let gpu = f.resource.gpu().clone();
    let cache = CachingResource::new(f.resource.clone());
    let (a, b) = (f.stream(0), f.stream(1));
    let (raw_a, raw_b) = (f.pool.raw(a).unwrap(), f.pool.raw(b).unwrap());
    let held_before = gpu.memory_held().unwrap().current;

    let small = cache.allocate(1000, a, T).unwrap();
    let big = cache.allocate(40 << 20, a, T).unwrap();
    assert!(cache.bytes_outstanding() >= (40 << 20) + 1000);
    assert!(gpu.memory_held().unwrap().current >= held_before + (40 << 20));
    // SAFETY: a stream of the fixture's pool, which it holds; blocks live in the cache.
    unsafe { gpu.memset_async(big.ptr(), 7, big.size(), raw_a) }.unwrap();
    // SAFETY: a stream of the fixture's pool, which it holds; blocks live in the cache.
    unsafe { gpu.memset_async(small.ptr(), 1, small.size(), raw_a) }.unwrap();
    let (ptr, creates) = (big.ptr(), cache.stats().misses);
    cache.deallocate(big).unwrap();
    let again = cache.allocate(40 << 20, a, T).unwrap();
    assert_eq!(again.ptr(), ptr, "reused on its stream");
    assert_eq!(cache.stats().misses, creates, "without new memory");

    // Used on b behind the hooks, then freed: a waits for b.
    cache
        .prepare_block_use(again.id(), b, Access::Write)
        .unwrap();
    // SAFETY: a stream of the fixture's pool, which it holds; blocks live in the cache.
    unsafe { gpu.memset_async(again.ptr(), 3, again.size(), raw_b) }.unwrap();
    cache
        .finish_block_use(again.id(), b, Access::Write)
        .unwrap();
    cache.deallocate(again).unwrap();
    cache.deallocate(small).unwrap();

    // SAFETY: a stream of the fixture's pool, which it holds; blocks live in the cache.
    unsafe { gpu.stream_synchronize(raw_a) }.unwrap();
    // SAFETY: a stream of the fixture's pool, which it holds; blocks live in the cache.
    unsafe { gpu.stream_synchronize(raw_b) }.unwrap();
    cache.trim().unwrap(); // records fences
    // SAFETY: a stream of the fixture's pool, which it holds; blocks live in the cache.
    unsafe { gpu.stream_synchronize(raw_a) }.unwrap();
    // SAFETY: a stream of the fixture's pool, which it holds; blocks live in the cache.
    unsafe { gpu.stream_synchronize(raw_b) }.unwrap();
    cache.trim().unwrap(); // they are complete: everything goes
    assert_eq!(cache.bytes_outstanding(), f.resource.bytes_outstanding());
    drop(cache);
    assert_eq!(gpu.memory_held().unwrap().current, held_before);
}

/// On the GPU: a range stream `a` freed while 50 fills of it are still
/// queued there is lent to stream `b` at once, behind a wait of `b` on the
/// GPU for a fence on `a`; `b`'s fill lands after all of `a`'s. Fails
/// (the range reads `a`'s last value) if the borrower does not wait.
#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_a_lent_range_is_written_after_the_home_streams_queued_work() {
    use streamalloc::gpu::Gpu;
    const N: usize = 64 << 20;
    let f = support::cuda(2);
    let gpu = f.resource.gpu().clone();
    let cache = CachingResource::new(f.resource.clone());
    let (a, b) = (f.stream(0), f.stream(1));
    let (raw_a, raw_b) = (f.pool.raw(a).unwrap(), f.pool.raw(b).unwrap());
    let x = cache.allocate(N, a, T).unwrap();
    let home = x.ptr();
    for value in 1..=50u8 {
        // SAFETY: a stream of the fixture's pool; the block is live.
        unsafe { gpu.memset_async(x.ptr(), value, N, raw_a) }.unwrap();
    }
    cache.deallocate(x).unwrap();
    // Asking for the idle bytes gives the last free back to a's arena
    // (with what the arena mapped ahead of it).
    assert!(cache.cached_bytes() >= N, "the free is back in a's arena");
    let y = cache.allocate(N, b, T).unwrap();
    assert_eq!((y.ptr(), cache.stats().borrows), (home, 1), "lent in place");
    // SAFETY: a stream of the fixture's pool; the block is live.
    unsafe { gpu.memset_async(y.ptr(), 0xab, N, raw_b) }.unwrap();
    // SAFETY: a stream of the fixture's pool, which it holds.
    unsafe { gpu.stream_synchronize(raw_b) }.unwrap();
    let mut host = vec![0u8; N];
    gpu.context().bind_to_thread().unwrap();
    // SAFETY: `y` is a live device range of `N` bytes, and every write to
    // it (queued on `b`, which waited for `a`'s) has completed.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, y.ptr()) }.unwrap();
    let wrong = host.iter().filter(|&&v| v != 0xab).count();
    assert_eq!(wrong, 0, "bytes left by a's fills after b's");
    cache.deallocate(y).unwrap();
    // SAFETY: streams of the fixture's pool, which it holds.
    unsafe { gpu.stream_synchronize(raw_a) }.unwrap();
    // SAFETY: as above.
    unsafe { gpu.stream_synchronize(raw_b) }.unwrap();
}

/// Under the futures layer, an allocation that needs memory the GPU still
/// uses does not wait for it inside a poll (no synchronize in a poll); the
/// same allocation outside a poll waits as the last resort.
#[test]
fn an_async_allocation_never_synchronizes_in_a_poll() {
    use std::time::Duration;
    use streamalloc::AsyncResource;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let gpu = SimGpu::builder()
            .capacity(8 * P)
            .op_latency(Duration::from_millis(100))
            .build();
        let f = support::sim_with(gpu.clone(), 2);
        let (s0, s1) = (f.stream(0), f.stream(1));
        // One handle per page: the simulated device's physical memory is
        // one contiguous space, which CUDA's is not.
        let config = CacheConfig::default().max_mapping_bytes(P);
        let cache = CachingResource::with_config(f.resource.clone(), config);
        // SAFETY: the stack's bottom resource was made on this device.
        let res = unsafe { AsyncResource::with_device(cache, &f.device) }.unwrap();
        // Freed on s0 and still used there: one byte too small for the
        // block on s1 (a live block on s0 sits after it), which needs its
        // memory given back to the device.
        let x = res.try_allocate(4 * P, s0, T).unwrap();
        let z = res.try_allocate(P, s0, T).unwrap();
        for _ in 0..3 {
            gpu.launch_kernel(f.pool.raw(s0).unwrap(), &[MemAccess::write(&x)])
                .unwrap();
        }
        drop(res.deallocate(x).unwrap());
        let early =
            tokio::time::timeout(Duration::from_millis(1), res.allocate(4 * P + 1, s1, T)).await;
        assert!(
            early.is_err(),
            "the allocation waits for the GPU, not in the poll"
        );
        assert_eq!(gpu.blocking_calls_in_polls(), 0);
        // Outside a poll the last resort waits for the GPU and succeeds.
        let y = res.try_allocate(4 * P + 1, s1, T).unwrap();
        drop(res.deallocate(y).unwrap());
        drop(res.deallocate(z).unwrap());
    });
}

/// The cap on idle memory: past it, a free gives back the stream's idle
/// mappings the GPU is done with (and records a fence for the others).
#[test]
fn the_cap_gives_idle_memory_back_once_the_gpu_is_done() {
    let config = CacheConfig::default()
        .max_cached_bytes(P)
        .max_mapping_bytes(P)
        .slack_percent(0);
    let c = Cache::new(1, config);
    let a = c.s(0);
    let x = c.cache.allocate(4 * P, a, T).unwrap();
    c.kernel(a, MemAccess::write(&x));
    c.cache.deallocate(x).unwrap();
    assert_eq!(c.cache.bytes_outstanding(), 4 * P, "the GPU still uses it");
    c.gpu.run_until_idle();
    let y = c.cache.allocate(1000, a, T).unwrap();
    c.kernel(a, MemAccess::write(&y));
    c.cache.deallocate(y).unwrap();
    assert_eq!(
        c.cache.bytes_outstanding(),
        P,
        "three idle pages went back; the one y used is newer than the fence"
    );
    c.assert_race_free();
}

/// `in_arena` tells a block of the arena from one of the inner resource
/// without a lock: an arena placement is in the reservation, a block of
/// the size classes (no virtual memory) or a stream past the cache's
/// shards is not. Fails if either answer is wrong.
#[test]
fn in_arena_tells_arena_blocks_from_the_inner_resources() {
    let c = Cache::new(3, CacheConfig::default().streams(2));
    let placed = c.cache.allocate(3 * P, c.s(0), T).unwrap();
    assert!(c.cache.in_arena(&placed));
    assert_eq!(c.cache.inner_block_id(placed.id()), None);
    // Stream 2 has no shard: its block bypasses the cache.
    let bypass = c.cache.allocate(P, c.s(2), T).unwrap();
    assert!(!c.cache.in_arena(&bypass));
    assert!(c.cache.inner_block_id(bypass.id()).is_some());
    c.cache.deallocate(placed).unwrap();
    c.cache.deallocate(bypass).unwrap();

    let classes = Cache::new(1, CacheConfig::default().virtual_memory(false));
    let block = classes.cache.allocate(P, classes.s(0), T).unwrap();
    assert!(!classes.cache.in_arena(&block));
    classes.cache.deallocate(block).unwrap();
    c.assert_race_free();
    classes.assert_race_free();
}
