//! Captures and other streams: ranges borrowed, used or freed across
//! streams while one of them is captured.

use super::{MIB, fixture};

use streamalloc::gpu::CaptureStatus;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::{Access, AllocTag, DeviceMemoryResource, SimResource};
use streamalloc::{CacheConfig, CachingResource};

/// A range another stream freed, taken behind a wait and freed while the
/// borrower is being captured: the graph's replays free it, so it stays
/// the graph's, out of use (the first stream never gets it while the
/// graph may replay the free), until the graph's release puts it back in
/// the arena behind the last replay. Fails with a race if the first stream gets it before its wait
/// for the replays, and on the final count if it is never handed back.
#[test]
fn a_borrowed_range_freed_in_a_capture_is_the_graphs_until_its_release() {
    let f = fixture();
    let cache = CachingResource::new(SimResource::new(&f.device));
    let home = cache.allocate(4 * MIB, f.l, AllocTag::UNTAGGED).unwrap();
    let home_ptr = home.ptr();
    f.write(f.l, &home);
    cache.deallocate(home).unwrap();
    // Asking for the idle bytes puts the last free in the arena.
    assert_eq!(cache.cached_bytes(), 4 * MIB);
    // The request borrows it, behind a wait for a fence on the home stream.
    let lent = cache.allocate(4 * MIB, f.s, AllocTag::UNTAGGED).unwrap();
    assert_eq!(cache.stats().borrows, 1, "{:?}", cache.stats());
    assert_eq!(lent.ptr(), home_ptr);
    f.write(f.s, &lent);

    let capture = f.begin(f.s);
    f.write(f.s, &lent);
    cache.deallocate(lent).unwrap();
    let graph = f.end(f.s);
    assert_eq!(cache.graph_bytes(), 4 * MIB, "the graph's");
    f.replay(graph.1, f.s, 2);

    let again = cache.allocate(4 * MIB, f.l, AllocTag::UNTAGGED).unwrap();
    assert_ne!(again.ptr(), home_ptr, "kept from the first stream");
    f.write(f.l, &again);
    cache.deallocate(again).unwrap();

    // Released behind the replays: the first stream gets it back, ordered
    // after them, and nothing stays outstanding.
    cache.release_capture(capture, f.s).unwrap();
    assert_eq!(cache.graph_bytes(), 0);
    let mut back = Vec::new();
    for _ in 0..2 {
        let b = cache.allocate(4 * MIB, f.l, AllocTag::UNTAGGED).unwrap();
        f.write(f.l, &b);
        back.push(b);
    }
    assert!(
        back.iter().any(|b| b.ptr() == home_ptr),
        "in the arena again"
    );
    for b in back {
        cache.deallocate(b).unwrap();
    }
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    f.destroy(graph);
    cache.release_idle().unwrap();
    f.gpu.run_until_idle();
    cache.release_idle().unwrap();
    assert_eq!(cache.bytes_outstanding(), 0);
}

/// A range taken by another stream, freed there while the stream that
/// freed it first is being captured: that stream's wait for the borrower's
/// work would be refused (an event recorded outside the capture) and would
/// invalidate the capture, so the capture never gets the range; its next
/// allocation outside the capture does, behind the wait. Fails with
/// STREAM_CAPTURE_ISOLATION if a wait is queued in the capture, and with a
/// race if the range is reused without it.
#[test]
fn a_range_freed_while_its_first_stream_is_captured_serves_it_after() {
    let f = fixture();
    let cache = CachingResource::new(SimResource::new(&f.device));
    let home = cache.allocate(4 * MIB, f.s, AllocTag::UNTAGGED).unwrap();
    let home_ptr = home.ptr();
    f.write(f.s, &home);
    cache.deallocate(home).unwrap();
    assert_eq!(cache.cached_bytes(), 4 * MIB);
    let lent = cache.allocate(4 * MIB, f.l, AllocTag::UNTAGGED).unwrap();
    assert_eq!((lent.ptr(), cache.stats().borrows), (home_ptr, 1));
    f.write(f.l, &lent);

    f.begin(f.s);
    cache.deallocate(lent).unwrap();
    let during = cache.allocate(4 * MIB, f.s, AllocTag::UNTAGGED).unwrap();
    assert_ne!(during.ptr(), home_ptr, "kept out of use during the capture");
    cache.deallocate(during).unwrap();
    // Ending fails if the capture was invalidated.
    let graph = f.end(f.s);

    let after = cache.allocate(4 * MIB, f.s, AllocTag::UNTAGGED).unwrap();
    f.write(f.s, &after);
    let again = cache.allocate(4 * MIB, f.s, AllocTag::UNTAGGED).unwrap();
    f.write(f.s, &again);
    assert!(
        [after.ptr(), again.ptr()].contains(&home_ptr),
        "the range again, behind the wait"
    );
    cache.deallocate(after).unwrap();
    cache.deallocate(again).unwrap();
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    f.destroy(graph);
}

/// A block of another stream used on, or freed from, a capturing stream:
/// ordering after its uses would make the capture wait on events recorded
/// outside it, which the driver refuses (STREAM_CAPTURE_ISOLATION) and
/// which invalidates the capture. With either tier, the use is refused or
/// the capture stays valid.
#[test]
fn a_block_of_another_stream_used_in_a_capture_keeps_the_capture_valid() {
    for arena in [true, false] {
        let f = fixture();
        let config = CacheConfig::default().virtual_memory(arena);
        let cache = CachingResource::with_config(SimResource::new(&f.device), config);
        let other = f.device.stream(2).unwrap();
        let block = cache.allocate(MIB, other, AllocTag("other")).unwrap();
        f.write(other, &block);
        f.begin(f.s);
        let used = cache.prepare_block_use(block.id(), f.s, Access::Write);
        let raw = f.device.raw(f.s).unwrap();
        assert!(
            matches!(f.gpu.capture_status(raw).unwrap(), CaptureStatus::Active(_)),
            "arena {arena}: the capture was invalidated ({used:?})"
        );
        if used.is_ok() {
            f.write(f.s, &block);
            cache
                .finish_block_use(block.id(), f.s, Access::Write)
                .unwrap();
        }
        let graph = f.end(f.s);
        f.destroy(graph);
        cache.deallocate(block).unwrap();
        f.gpu.run_until_idle();
        assert!(
            f.gpu.races().is_empty(),
            "arena {arena}: {:?}",
            f.gpu.races()
        );
    }
}

/// Freeing, on a capturing stream, a block used on another stream before
/// the capture: the free would wait on that use's event from inside the
/// capture. With either tier the capture stays valid and nothing races.
#[test]
fn freeing_in_a_capture_a_block_used_on_another_stream_keeps_the_capture_valid() {
    for arena in [true, false] {
        let f = fixture();
        let config = CacheConfig::default().virtual_memory(arena);
        let cache = CachingResource::with_config(SimResource::new(&f.device), config);
        let other = f.device.stream(2).unwrap();
        let block = cache.allocate(MIB, f.s, AllocTag("home")).unwrap();
        cache
            .prepare_block_use(block.id(), other, Access::Read)
            .unwrap();
        f.write(other, &block);
        cache
            .finish_block_use(block.id(), other, Access::Read)
            .unwrap();
        f.begin(f.s);
        let freed = cache.deallocate(block.clone());
        let raw = f.device.raw(f.s).unwrap();
        assert!(
            matches!(f.gpu.capture_status(raw).unwrap(), CaptureStatus::Active(_)),
            "arena {arena}: the capture was invalidated ({freed:?})"
        );
        let graph = f.end(f.s);
        f.destroy(graph);
        if freed.is_err() {
            cache.deallocate(block).unwrap();
        }
        f.gpu.run_until_idle();
        assert!(
            f.gpu.races().is_empty(),
            "arena {arena}: {:?}",
            f.gpu.races()
        );
    }
}

/// Class `capture-reuse` of the whole-API harness: a block freed on the
/// capturing stream just before the capture, its last kernel still queued,
/// was handed to the capture (stream order makes that safe on the
/// capturing stream only), and a replay on another stream raced the
/// kernel. With either tier a capture takes no memory queued work may
/// still touch.
#[test]
fn a_capture_takes_no_memory_queued_work_still_touches() {
    for arena in [true, false] {
        let f = fixture();
        let config = CacheConfig::default().virtual_memory(arena);
        let cache = CachingResource::with_config(SimResource::new(&f.device), config);
        let before = cache.allocate(MIB, f.s, AllocTag("before")).unwrap();
        f.write(f.s, &before);
        let before_ptr = before.ptr();
        cache.deallocate(before).unwrap();

        let capture = f.begin(f.s);
        let tmp = cache.allocate(MIB, f.s, AllocTag("tmp")).unwrap();
        assert_ne!(
            tmp.ptr(),
            before_ptr,
            "arena {arena}: the capture got memory a queued kernel writes"
        );
        f.write(f.s, &tmp);
        cache.deallocate(tmp).unwrap();
        let graph = f.end(f.s);
        // Replayed on a stream ordered after nothing on the capture's.
        f.replay(graph.1, f.l, 2);
        f.gpu.run_until_idle();
        assert!(
            f.gpu.races().is_empty(),
            "arena {arena}: {:?}",
            f.gpu.races()
        );
        f.destroy(graph);
        cache.release_capture(capture, f.l).unwrap();
        assert_eq!(cache.graph_bytes(), 0, "arena {arena}");
        assert_eq!(cache.leased_bytes(), 0, "arena {arena}");
    }
}

/// Class `capture-refused` of the whole-API harness: a size-class block
/// read on another stream, then freed into the cache; a capture's
/// temporary was served that block, and its first use in the capture was
/// refused (`StreamCapturing`): ordering it after the read would join
/// outside work to the capture. With either tier, the capture's
/// temporary is one it can use, and the capture stays valid.
#[test]
fn a_capture_is_not_served_a_block_used_on_another_stream() {
    for arena in [false, true] {
        let f = fixture();
        let config = CacheConfig::default().virtual_memory(arena);
        let cache = CachingResource::with_config(SimResource::new(&f.device), config);
        let other = f.device.stream(2).unwrap();
        let block = cache.allocate(512, f.s, AllocTag("read")).unwrap();
        f.write(f.s, &block);
        cache
            .prepare_block_use(block.id(), other, Access::Read)
            .unwrap();
        f.gpu
            .launch_kernel(f.device.raw(other).unwrap(), &[MemAccess::read(&block)])
            .unwrap();
        cache
            .finish_block_use(block.id(), other, Access::Read)
            .unwrap();
        cache.deallocate(block).unwrap();

        let capture = f.begin(f.s);
        let tmp = cache.allocate(100, f.s, AllocTag("tmp")).unwrap();
        let used = cache.prepare_block_use(tmp.id(), f.s, Access::Write);
        assert_eq!(used, Ok(()), "arena {arena}: the capture's own block");
        let raw = f.device.raw(f.s).unwrap();
        assert!(
            matches!(f.gpu.capture_status(raw).unwrap(), CaptureStatus::Active(_)),
            "arena {arena}: the capture was invalidated"
        );
        f.write(f.s, &tmp);
        cache
            .finish_block_use(tmp.id(), f.s, Access::Write)
            .unwrap();
        cache.deallocate(tmp).unwrap();
        let graph = f.end(f.s);
        f.replay(graph.1, f.l, 1);
        f.gpu.run_until_idle();
        assert!(
            f.gpu.races().is_empty(),
            "arena {arena}: {:?}",
            f.gpu.races()
        );
        f.destroy(graph);
        cache.release_capture(capture, f.l).unwrap();
        assert_eq!(cache.graph_bytes(), 0, "arena {arena}");
    }
}
