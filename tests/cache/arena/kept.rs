//! Kept blocks: a stream takes back the blocks it freed last, and gives
//! every free back to the arena while its sizes do not repeat.

use streamalloc::CacheConfig;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::{DeviceMemoryResource, StreamId};

use super::{Cache, P, T};

/// The block a stream freed last stays in its slot (its next allocation
/// of that size takes it back with no shared lock), but a growth of
/// another stream takes it first: `b` gets `a`'s memory behind a wait on
/// the GPU instead of new memory. Fails if kept blocks are invisible to
/// other streams (a second 4-page mapping), or if `b` skips the wait (a
/// race with `a`'s queued write).
#[test]
fn a_growth_takes_the_block_another_stream_freed_last() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let block = c.cache.allocate(4 * P, a, T).unwrap();
    let ptr = block.ptr();
    c.kernel(a, MemAccess::write(&block));
    c.cache.deallocate(block).unwrap();

    let creates = c.creates();
    let on_b = c.cache.allocate(4 * P, b, T).unwrap();
    assert_eq!(on_b.ptr(), ptr, "a's block, where it is");
    assert_eq!(c.creates(), creates, "no new memory");
    assert_eq!(c.cache.stats().borrows, 1);
    c.kernel(b, MemAccess::write(&on_b));
    c.cache.deallocate(on_b).unwrap();

    // a's next allocation of that size no longer finds it kept, and
    // places it again, behind a wait for b.
    let again = c.cache.allocate(4 * P, a, T).unwrap();
    assert_eq!(again.ptr(), ptr);
    c.kernel(a, MemAccess::write(&again));
    c.cache.deallocate(again).unwrap();
    c.assert_race_free();
}

/// Each stream keeps the last blocks it freed (`src/cache/arena/kept.rs`): an
/// allocation of any of their sizes takes one back where it is, with no
/// placement in the arena. Placed in the arena, the second size would go
/// where the first was (the three ranges merge into one, and the best fit
/// starts at its start).
/// A stream keeps blocks once its sizes repeat: here after a loop of one
/// size (14 of its last 32 allocations).
#[test]
fn a_stream_takes_back_any_of_the_blocks_it_freed_last() {
    let c = Cache::new(1, CacheConfig::default());
    let a = c.s(0);
    repeat_a_size(&c, a, 16);
    let sizes = [P / 2, P, 3 * P / 2];
    let blocks: Vec<_> = sizes
        .iter()
        .map(|&s| c.cache.allocate(s, a, T).unwrap())
        .collect();
    let ptrs: Vec<u64> = blocks.iter().map(|b| b.ptr()).collect();
    for block in blocks {
        c.kernel(a, MemAccess::write(&block));
        c.cache.deallocate(block).unwrap();
    }
    let creates = c.creates();
    for i in [1, 2, 0] {
        let block = c.cache.allocate(sizes[i], a, T).unwrap();
        assert_eq!(block.ptr(), ptrs[i], "size {} where it was", sizes[i]);
        c.kernel(a, MemAccess::write(&block));
        c.cache.deallocate(block).unwrap();
    }
    assert_eq!(c.creates(), creates, "no new memory");
    c.assert_race_free();
}

/// Allocates and frees one size `times` + 1 times on `stream`: `times`
/// allocations of a size it freed just before.
fn repeat_a_size(c: &Cache, stream: StreamId, times: usize) {
    for _ in 0..=times {
        let block = c.cache.allocate(4096, stream, T).unwrap();
        c.cache.deallocate(block).unwrap();
    }
}

/// A stream whose sizes do not repeat (requests of drawn sizes) keeps
/// nothing: every free goes back to the arena, where the next block is
/// placed with it in view. The same steps keep blocks once a loop showed
/// that the stream's sizes repeat.
#[test]
fn a_stream_whose_sizes_do_not_repeat_gives_every_free_back() {
    for repeating in [false, true] {
        let c = Cache::new(1, CacheConfig::default());
        let a = c.s(0);
        if repeating {
            repeat_a_size(&c, a, 16);
        }
        let sizes = [P / 2, P, 3 * P / 2];
        let blocks: Vec<_> = sizes
            .iter()
            .map(|&s| c.cache.allocate(s, a, T).unwrap())
            .collect();
        let first = blocks.iter().map(|b| b.ptr()).min().unwrap();
        for block in blocks {
            c.kernel(a, MemAccess::write(&block));
            c.cache.deallocate(block).unwrap();
        }
        // A size none of them had: placed at the start of the merged
        // range when they are all in the arena.
        let block = c.cache.allocate(2 * P, a, T).unwrap();
        assert_eq!(
            block.ptr() == first,
            !repeating,
            "repeating {repeating}: placed at {:#x}, the freed blocks start at {first:#x}",
            block.ptr()
        );
        c.cache.deallocate(block).unwrap();
        c.assert_race_free();
    }
}
