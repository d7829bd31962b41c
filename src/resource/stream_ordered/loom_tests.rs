//! Loom models of the bookkeeping core: the deallocate retiring/restore path
//! against concurrent hooks and reaps, the counters a concurrent reader
//! sees, and the pending tallies under concurrent frees and a notified reap
//! (`--cfg loom`, see `scripts/model-check.sh`).

use std::sync::Arc;

use loom::thread;

use super::*;
use crate::error::DriverCall;

const SIZE: usize = 4096;

fn fixture() -> (Arc<SimGpu>, Arc<SimResource>, DeviceBlock) {
    let gpu = SimGpu::builder().manual().build();
    let device = Device::simulated(&gpu, 2);
    let r = Arc::new(SimResource::new(&device));
    let block = r
        .allocate(SIZE, device.stream(0).unwrap(), AllocTag::UNTAGGED)
        .unwrap();
    (gpu, r, block)
}

/// Frees `block` through `r` from this thread and another at once:
/// exactly one free wins, and the loser sees the winner's free either in
/// flight (`FreeInFlight`) or done (`DoubleFree`).
pub(crate) fn race_two_frees<R: DeviceMemoryResource + 'static>(r: &Arc<R>, block: &DeviceBlock) {
    let other = {
        let (r, block) = (r.clone(), block.clone());
        thread::spawn(move || r.deallocate(block))
    };
    let mine = r.deallocate(block.clone());
    let theirs = other.join().unwrap();
    let lost = |e: &ResourceError| {
        *e == ResourceError::DoubleFree { block: block.id() }
            || *e == ResourceError::FreeInFlight { block: block.id() }
    };
    assert!(
        matches!((&mine, &theirs), (Ok(()), Err(e)) | (Err(e), Ok(())) if lost(e)),
        "{mine:?} / {theirs:?}"
    );
}

/// Events created = events pooled + events attached to live blocks.
fn no_event_lost(gpu: &SimGpu, r: &SimResource, live: &[&DeviceBlock]) {
    let attached: usize = live
        .iter()
        .map(|b| r.pending_use_event_count(b.ptr()).unwrap())
        .sum();
    assert_eq!(
        gpu.call_count(DriverCall::EventCreate) as usize,
        r.pooled_events() + attached
    );
}

/// A reader of `bytes_outstanding` while a block moves from live to
/// pending must count it (a budget built on it must not over-admit).
#[test]
fn bytes_outstanding_never_undercounts_a_free() {
    loom::model(|| {
        let (_gpu, r, block) = fixture();
        let freer = {
            let r = r.clone();
            thread::spawn(move || r.deallocate(block).unwrap())
        };
        let seen = r.bytes_outstanding();
        assert!(seen >= SIZE, "a concurrent reader saw {seen} B outstanding");
        freer.join().unwrap();
        assert_eq!(r.bytes_outstanding(), SIZE);
    });
}

/// A free that fails while a hook runs on the same block: the block is
/// live again with every event the hook attached, and no event is lost.
#[test]
fn failed_free_restores_the_uses_a_concurrent_hook_attached() {
    loom::model(|| {
        let (gpu, r, block) = fixture();
        let b = r.stream_pool().id(1).unwrap();
        gpu.fail_nth(DriverCall::FreeAsync, 1);
        let hook = {
            let (r, id) = (r.clone(), block.id());
            thread::spawn(move || {
                // The free fails, so the block is never retired: a hook
                // that raced it hears `FreeInFlight`, never `DoubleFree`.
                let out = r.finish_block_use(id, b, Access::Read);
                assert!(
                    matches!(out, Ok(()) | Err(ResourceError::FreeInFlight { .. })),
                    "{out:?}"
                );
                out.is_ok()
            })
        };
        let freed = r.deallocate(block.clone());
        assert!(matches!(freed, Err(ResourceError::Driver { .. })));
        let hooked = hook.join().unwrap();
        assert_eq!(r.block_state(block.id()), Some(BlockState::Live));
        assert_eq!(
            r.pending_use_event_count(block.ptr()),
            Some(usize::from(hooked))
        );
        assert_eq!(r.live_bytes(), SIZE);
        assert_eq!(r.pending_free_bytes(), 0);
        no_event_lost(&gpu, &r, &[&block]);
        r.deallocate(block).unwrap();
        no_event_lost(&gpu, &r, &[]);
    });
}

/// Two threads free clones of one block: exactly one free wins, the
/// other is a `DoubleFree` or `FreeInFlight`, and the bytes are pending
/// once.
#[test]
fn racing_double_free_frees_once() {
    loom::model(|| {
        let (gpu, r, block) = fixture();
        race_two_frees(&r, &block);
        assert_eq!(r.pending_free_bytes(), SIZE);
        assert_eq!(r.pending_per_stream_total(), SIZE);
        assert_eq!(r.live_bytes(), 0);
        assert_eq!(gpu.call_count(DriverCall::FreeAsync), 1);
    });
}

/// A second free racing a free that fails: never told `DoubleFree`
/// while the block ends up live (its handle would be lost).
#[test]
fn a_free_racing_a_failing_free_is_not_a_double_free() {
    loom::model(|| {
        let (gpu, r, block) = fixture();
        gpu.fail_nth(DriverCall::FreeAsync, 1);
        let other = {
            let (r, block) = (r.clone(), block.clone());
            thread::spawn(move || r.deallocate(block))
        };
        let mine = r.deallocate(block.clone());
        let theirs = other.join().unwrap();
        let live = r.block_state(block.id()) == Some(BlockState::Live);
        for out in [&mine, &theirs] {
            assert!(
                !(live && matches!(out, Err(ResourceError::DoubleFree { .. }))),
                "{mine:?} / {theirs:?}, block live"
            );
        }
    });
}

/// A successful free racing a cross-stream use (prepare + finish) and a
/// reap: the counters agree at the end, and nothing is lost.
#[test]
fn free_races_hooks_and_reap() {
    loom::model(|| {
        let (gpu, r, block) = fixture();
        let b = r.stream_pool().id(1).unwrap();
        let hook = {
            let (r, id) = (r.clone(), block.id());
            thread::spawn(move || {
                let out = r
                    .prepare_block_use(id, b, Access::Write)
                    .and_then(|()| r.finish_block_use(id, b, Access::Write));
                assert!(
                    matches!(
                        out,
                        Ok(())
                            | Err(ResourceError::DoubleFree { .. })
                            | Err(ResourceError::FreeInFlight { .. })
                    ),
                    "{out:?}"
                );
            })
        };
        let freer = {
            let r = r.clone();
            thread::spawn(move || r.deallocate(block).unwrap())
        };
        r.reap_pending().unwrap();
        hook.join().unwrap();
        freer.join().unwrap();
        assert_eq!(r.pending_free_bytes(), r.pending_per_stream_total());
        assert_eq!(
            r.bytes_outstanding(),
            r.live_bytes() + r.pending_free_bytes()
        );
        assert_eq!(r.live_blocks(), 0);
        r.reap_pending().unwrap();
        assert_eq!(r.bytes_outstanding(), 0);
        no_event_lost(&gpu, &r, &[]);
    });
}

/// Frees on two streams racing a notification-style reap of one (read
/// `pending_free_seq`, then `reap_through` it): the shard tallies and the
/// per-stream tallies agree at the end, the reap drains exactly the
/// frees at or below its cut, and `bytes_outstanding` matches.
#[test]
fn frees_and_a_notified_reap_keep_the_tallies_together() {
    loom::model(|| {
        let gpu = SimGpu::builder().manual().build();
        let r = Arc::new(SimResource::new(&Device::simulated(&gpu, 2)));
        let (a, b) = (
            r.stream_pool().id(0).unwrap(),
            r.stream_pool().id(1).unwrap(),
        );
        let x = r.allocate(10, a, AllocTag::UNTAGGED).unwrap();
        let y = r.allocate(20, b, AllocTag::UNTAGGED).unwrap();
        let z = r.allocate(5, a, AllocTag::UNTAGGED).unwrap();
        let freer = {
            let r = r.clone();
            thread::spawn(move || {
                r.deallocate(x).unwrap();
                r.deallocate(y).unwrap();
            })
        };
        let reaper = {
            let r = r.clone();
            thread::spawn(move || {
                let seq = r.pending_free_seq(a);
                (seq, r.reap_through(a, seq))
            })
        };
        r.deallocate(z).unwrap();
        freer.join().unwrap();
        let (seq, drained) = reaper.join().unwrap();
        assert_eq!(r.pending_free_bytes(), r.pending_per_stream_total());
        assert_eq!(r.pending_free_bytes() + drained, 35);
        assert_eq!(r.bytes_outstanding(), 35 - drained);
        assert_eq!(r.live_bytes(), 0);
        assert!(seq <= 2);
        assert!(matches!(drained, 0 | 5 | 10 | 15), "drained {drained}");
        assert_eq!(drained == 0, seq == 0);
        assert_eq!(r.pending_stream_bytes(b), 20);
    });
}
