//! Lending between streams: where a block goes does not depend on the
//! GPU's timing, and a borrower waits for the work before the free and no
//! later work.

use streamalloc::CacheConfig;
use streamalloc::DeviceMemoryResource;
use streamalloc::DriverCall;
use streamalloc::gpu::sim::MemAccess;

use super::{Cache, P, T};

/// One program of allocations, kernels and frees on three streams, with
/// blocks of 32 MiB (never kept by a stream) and the slack target out of
/// reach (no growth gives memory back): every pointer handed out, in
/// order, and the bytes held at the end.
fn three_streams_program(drain_every_op: bool) -> (Vec<u64>, usize) {
    let c = Cache::new(3, CacheConfig::default().slack_percent(1_000));
    let mut live: Vec<Vec<streamalloc::DeviceBlock>> = vec![Vec::new(); 3];
    let mut ptrs = Vec::new();
    let mut rng = 11u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for _ in 0..300 {
        let i = (next() % 3) as usize;
        let s = c.s(i);
        if live[i].len() > 3 || (!live[i].is_empty() && next() % 2 == 0) {
            let k = (next() as usize) % live[i].len();
            let block = live[i].swap_remove(k);
            c.kernel(s, MemAccess::write(&block));
            c.cache.deallocate(block).unwrap();
        } else {
            let bytes = [16 * P, 17 * P, 24 * P][(next() % 3) as usize];
            let block = c.cache.allocate(bytes, s, T).unwrap();
            ptrs.push(block.ptr());
            c.kernel(s, MemAccess::write(&block));
            live[i].push(block);
        }
        if drain_every_op {
            c.gpu.run_until_idle();
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
    (ptrs, c.gpu.held_bytes())
}

/// Where a block goes does not depend on how far the GPU is behind the
/// host: the same program places every block at the same address, and
/// holds the same bytes, whether the GPU never ran its work before the end
/// or ran it after every operation (race free both ways). Only the waits
/// differ: a range another stream freed serves behind a GPU-side wait,
/// spared where the host saw the work before the free done. Fails where a
/// fence seen complete makes a range usable "as it is" for placement (the
/// simulated replay then predicts a GPU that keeps up differently from
/// one that does not).
#[test]
fn where_a_block_goes_does_not_depend_on_the_gpus_timing() {
    let (lagging, held_lagging) = three_streams_program(false);
    let (keeping_up, held_keeping_up) = three_streams_program(true);
    assert_eq!(lagging.len(), keeping_up.len());
    let first_difference = lagging.iter().zip(&keeping_up).position(|(a, b)| a != b);
    assert_eq!(first_difference, None, "placements differ");
    assert_eq!(held_lagging, held_keeping_up);
}

/// A range freed on `a` serves `b` behind a wait for a fence recorded on
/// `a` right after the free, not after the work `a` queued since: `b`'s
/// work is not held up by `a`'s later kernels. The probe: `b` reads a
/// block `a` writes after the free, unordered on purpose; the detector
/// must report that race (`b` was not made to wait for `a`'s later write)
/// and none on the lent range (`b` waited for `a`'s write before the
/// free). Fails if the fence is recorded when `b` asks (after `a`'s later
/// write: no race reported) or if the wait is skipped (a race on the lent
/// range).
#[test]
fn a_borrower_waits_for_the_work_before_the_free_and_no_later_work() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let later = c.cache.allocate(P, a, T).unwrap();
    // A first borrow while `a` is busy: from now on `a` fences its frees.
    let x = c.cache.allocate(16 * P, a, T).unwrap();
    c.kernel(a, MemAccess::write(&x));
    c.cache.deallocate(x).unwrap();
    let y = c.cache.allocate(16 * P, b, T).unwrap();
    assert_eq!(c.cache.stats().borrows, 1);
    c.kernel(b, MemAccess::write(&y));
    c.cache.deallocate(y).unwrap();
    c.assert_race_free();

    // Nothing runs from here on until the end (manual device).
    let x = c.cache.allocate(16 * P, a, T).unwrap();
    let home = x.ptr();
    c.kernel(a, MemAccess::write(&x));
    c.cache.deallocate(x).unwrap();
    c.kernel(a, MemAccess::write(&later));
    let waits = c.gpu.call_count(DriverCall::StreamWaitEvent);
    let lent = c.cache.allocate(16 * P, b, T).unwrap();
    assert_eq!(lent.ptr(), home, "a's range, where it is");
    assert_eq!(c.gpu.call_count(DriverCall::StreamWaitEvent), waits + 1);
    c.kernel(b, MemAccess::write(&lent));
    c.kernel(b, MemAccess::read(&later));
    c.gpu.run_until_idle();
    let races = c.gpu.take_races();
    assert_eq!(races.len(), 1, "{races:#?}");
    assert_eq!(
        races[0].addr,
        later.ptr(),
        "the race is on the block written after the free: {races:#?}"
    );
    c.cache.deallocate(lent).unwrap();
    // The probe's read, declared now, so that the free waits for it.
    c.cache.record_block_use(&later, b).unwrap();
    c.cache.deallocate(later).unwrap();
    c.assert_race_free();
}
