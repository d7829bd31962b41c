//! Model-based tests: random sequences of allocate, deallocate, record,
//! prepare, finish, use (prepare + kernel + finish), device steps and reap
//! across several streams, checked after every step against a small
//! reference model, on a deterministic simulated device. A multi-threaded
//! variant runs one sequence per thread on a threaded device.
//!
//! A failing case shrinks to a short `Vec<Op>` printed with `Debug`.

use crate::support;

use std::collections::BTreeSet;

use proptest::prelude::*;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{
    Access, AllocTag, DeviceBlock, DeviceMemoryResource, DriverCall, ResourceError, SimResource,
    StreamPool,
};
use support::assert_quiescent_invariants;

const STREAMS: usize = 3;
const TAG: AllocTag = AllocTag("model");

/// One step of a sequence. Block slots and stream numbers are reduced modulo
/// what exists, so that every sequence is valid and shrinks well.
#[derive(Debug, Clone)]
enum Op {
    Alloc {
        stream: usize,
        size: usize,
    },
    Free {
        slot: usize,
    },
    /// prepare, a kernel, finish: a fully hooked use.
    Use {
        slot: usize,
        stream: usize,
        write: bool,
    },
    /// prepare for a read, a reading kernel, then `record_block_use`.
    Record {
        slot: usize,
        stream: usize,
    },
    /// A prepare alone (no work follows).
    Prepare {
        slot: usize,
        stream: usize,
        write: bool,
    },
    /// A prepare and a finish with no work between them.
    Finish {
        slot: usize,
        stream: usize,
        write: bool,
    },
    /// A hook on a block already freed: refused, nothing changes.
    Stale {
        slot: usize,
        stream: usize,
    },
    /// Lets the device run a few operations.
    Step {
        n: u8,
    },
    /// `reap_pending`: synchronizes every stream with pending frees.
    Reap,
    /// Notification-style reap of one stream: read `pending_free_seq`,
    /// synchronize the stream, `reap_through` that sequence number.
    ReapStream {
        stream: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let stream = 0..STREAMS;
    let slot = 0usize..16;
    prop_oneof![
        4 => (stream.clone(), prop_oneof![Just(0usize), 1usize..=1 << 20])
            .prop_map(|(stream, size)| Op::Alloc { stream, size }),
        2 => slot.clone().prop_map(|slot| Op::Free { slot }),
        4 => (slot.clone(), stream.clone(), any::<bool>())
            .prop_map(|(slot, stream, write)| Op::Use { slot, stream, write }),
        1 => (slot.clone(), stream.clone()).prop_map(|(slot, stream)| Op::Record { slot, stream }),
        1 => (slot.clone(), stream.clone(), any::<bool>())
            .prop_map(|(slot, stream, write)| Op::Prepare { slot, stream, write }),
        1 => (slot.clone(), stream.clone(), any::<bool>())
            .prop_map(|(slot, stream, write)| Op::Finish { slot, stream, write }),
        1 => (slot.clone(), stream.clone()).prop_map(|(slot, stream)| Op::Stale { slot, stream }),
        1 => (1u8..8).prop_map(|n| Op::Step { n }),
        1 => Just(Op::Reap),
        1 => stream.prop_map(|stream| Op::ReapStream { stream }),
    ]
}

/// What the model knows of one live block.
#[derive(Debug)]
struct ModelBlock {
    block: DeviceBlock,
    /// Streams with a recorded read.
    reads: BTreeSet<usize>,
    /// Whether a last-write (or allocation-point) event is attached.
    write: bool,
}

impl ModelBlock {
    fn events(&self) -> usize {
        self.reads.len() + usize::from(self.write)
    }
}

/// The reference model of one owner's blocks.
#[derive(Debug, Default)]
struct Model {
    live: Vec<ModelBlock>,
    freed: Vec<DeviceBlock>,
    live_bytes: usize,
    /// Bytes freed and not yet reaped, per stream (single-threaded model
    /// only).
    pending: [usize; STREAMS],
}

fn access(write: bool) -> Access {
    if write { Access::Write } else { Access::Read }
}

/// Runs `op`, updating `model`. `alone` tells whether no other thread uses
/// the resource (then a refused call must leave the global counters alone).
fn apply(
    op: &Op,
    r: &SimResource,
    gpu: &SimGpu,
    pool: &StreamPool,
    model: &mut Model,
    alone: bool,
) -> Result<(), TestCaseError> {
    let sid = |s: usize| pool.id(s).unwrap();
    let raw = |s: usize| pool.raw(sid(s)).unwrap();
    let n = model.live.len();
    match *op {
        Op::Alloc { stream, size } => {
            let block = r.allocate(size, sid(stream), TAG).unwrap();
            prop_assert_eq!(block.size(), size);
            prop_assert_eq!(block.ptr() == 0, size == 0);
            model.live_bytes += size;
            model.live.push(ModelBlock {
                block,
                reads: BTreeSet::new(),
                write: false,
            });
        }
        Op::Free { slot } if n > 0 => {
            let m = model.live.swap_remove(slot % n);
            model.live_bytes -= m.block.size();
            model.pending[m.block.stream().index() as usize] += m.block.size();
            r.deallocate(m.block.clone()).unwrap();
            model.freed.push(m.block);
        }
        Op::Use {
            slot,
            stream,
            write,
        } if n > 0 => {
            let m = &mut model.live[slot % n];
            let (id, home) = (m.block.id(), m.block.stream().index() as usize);
            r.prepare_block_use(id, sid(stream), access(write)).unwrap();
            if m.block.size() > 0 {
                let touch = if write {
                    MemAccess::write(&m.block)
                } else {
                    MemAccess::read(&m.block)
                };
                gpu.launch_kernel(raw(stream), &[touch]).unwrap();
            }
            r.finish_block_use(id, sid(stream), access(write)).unwrap();
            m.write |= write || stream != home;
            if !write {
                m.reads.insert(stream);
            }
        }
        Op::Record { slot, stream } if n > 0 => {
            let m = &mut model.live[slot % n];
            let home = m.block.stream().index() as usize;
            r.prepare_block_use(m.block.id(), sid(stream), Access::Read)
                .unwrap();
            if m.block.size() > 0 {
                gpu.launch_kernel(raw(stream), &[MemAccess::read(&m.block)])
                    .unwrap();
            }
            r.record_block_use(&m.block, sid(stream)).unwrap();
            m.write |= stream != home;
            m.reads.insert(stream);
        }
        Op::Prepare {
            slot,
            stream,
            write,
        } if n > 0 => {
            let m = &mut model.live[slot % n];
            let home = m.block.stream().index() as usize;
            r.prepare_block_use(m.block.id(), sid(stream), access(write))
                .unwrap();
            m.write |= stream != home;
        }
        Op::Finish {
            slot,
            stream,
            write,
        } if n > 0 => {
            let m = &mut model.live[slot % n];
            let home = m.block.stream().index() as usize;
            r.prepare_block_use(m.block.id(), sid(stream), access(write))
                .unwrap();
            r.finish_block_use(m.block.id(), sid(stream), access(write))
                .unwrap();
            m.write |= stream != home;
            if write {
                m.write = true;
            } else {
                m.reads.insert(stream);
            }
        }
        Op::Stale { slot, stream } if !model.freed.is_empty() => {
            let block = &model.freed[slot % model.freed.len()];
            let before = (r.live_bytes(), r.pending_free_bytes(), r.live_blocks());
            let err = r
                .prepare_block_use(block.id(), sid(stream), Access::Write)
                .unwrap_err();
            prop_assert_eq!(err, ResourceError::DoubleFree { block: block.id() });
            let err = r.deallocate(block.clone()).unwrap_err();
            prop_assert_eq!(err, ResourceError::DoubleFree { block: block.id() });
            if alone {
                prop_assert_eq!(
                    before,
                    (r.live_bytes(), r.pending_free_bytes(), r.live_blocks())
                );
            }
        }
        Op::Step { n } => {
            for _ in 0..n {
                gpu.step();
            }
        }
        Op::Reap => {
            r.reap_pending().unwrap();
            model.pending = [0; STREAMS];
        }
        Op::ReapStream { stream } => {
            let seq = r.pending_free_seq(sid(stream));
            gpu.stream_synchronize(raw(stream)).unwrap();
            let drained = r.reap_through(sid(stream), seq);
            if alone {
                prop_assert_eq!(drained, model.pending[stream]);
            }
            model.pending[stream] = 0;
        }
        // A block op with no block to act on.
        _ => {}
    }
    for m in &model.live {
        if m.block.ptr() != 0 {
            prop_assert_eq!(
                r.pending_use_event_count(m.block.ptr()),
                Some(m.events()),
                "events of {:?}",
                m
            );
        }
    }
    Ok(())
}

fn check_totals(r: &SimResource, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(r.pending_free_bytes(), r.pending_per_stream_total());
    prop_assert_eq!(
        r.bytes_outstanding(),
        r.live_bytes() + r.pending_free_bytes()
    );
    prop_assert_eq!(r.live_bytes(), model.live_bytes);
    prop_assert_eq!(r.live_blocks(), model.live.len());
    prop_assert_eq!(r.pending_free_bytes(), model.pending.iter().sum::<usize>());
    for (s, &bytes) in model.pending.iter().enumerate() {
        let id = r.stream_pool().id(s).unwrap();
        prop_assert_eq!(r.pending_stream_bytes(id), bytes, "stream {}", s);
    }
    Ok(())
}

/// Frees everything, reaps, and checks that nothing is left and no race
/// was seen.
fn finish(r: &SimResource, gpu: &SimGpu, models: Vec<Model>) -> Result<(), TestCaseError> {
    for model in models {
        for m in model.live {
            r.deallocate(m.block).unwrap();
        }
    }
    r.reap_pending().unwrap();
    gpu.run_until_idle();
    assert_quiescent_invariants(r);
    prop_assert_eq!(r.pending_free_bytes(), 0);
    prop_assert_eq!(r.live_blocks(), 0);
    prop_assert_eq!(r.bytes_outstanding(), 0);
    prop_assert_eq!(
        r.pooled_events() as u64,
        gpu.call_count(DriverCall::EventCreate),
        "events leaked"
    );
    let races = gpu.races();
    prop_assert!(races.is_empty(), "races: {:#?}", races);
    Ok(())
}

/// `default` cases, or `PROPTEST_CASES` when set (for a longer hunt, or a
/// shorter run under Miri).
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(256),
        max_shrink_iters: 4096,
        failure_persistence: crate::support::regressions::beside_source(),
        ..ProptestConfig::default()
    })]

    #[test]
    fn single_thread_matches_the_model(
        seed in any::<u64>(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let gpu = SimGpu::builder().manual().seed(seed).build();
        let f = support::sim_with(gpu.clone(), STREAMS);
        let r = &f.resource;
        let mut model = Model::default();
        for op in &ops {
            apply(op, r, &gpu, &f.pool, &mut model, true)?;
            check_totals(r, &model)?;
        }
        finish(r, &gpu, vec![model])?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(64),
        max_shrink_iters: 512,
        failure_persistence: crate::support::regressions::beside_source(),
        ..ProptestConfig::default()
    })]

    #[test]
    fn threads_match_their_models(
        seed in any::<u64>(),
        threads in prop::collection::vec(prop::collection::vec(op(), 1..40), 2..=4),
    ) {
        let gpu = SimGpu::builder().seed(seed).build();
        let f = support::sim_with(gpu.clone(), STREAMS);
        let r = &f.resource;
        let models = std::thread::scope(|scope| {
            let handles: Vec<_> = threads
                .iter()
                .map(|ops| {
                    let (gpu, pool) = (&gpu, &f.pool);
                    scope.spawn(move || -> Result<Model, TestCaseError> {
                        let mut model = Model::default();
                        for op in ops {
                            apply(op, r, gpu, pool, &mut model, false)?;
                            // Other threads move the totals; only the
                            // relations that hold at every instant are
                            // checked here.
                            prop_assert!(r.bytes_outstanding() >= model.live_bytes);
                            prop_assert!(r.live_bytes() >= model.live_bytes);
                        }
                        Ok(model)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a model thread panicked"))
                .collect::<Result<Vec<_>, _>>()
        })?;
        let live: usize = models.iter().map(|m| m.live_bytes).sum();
        prop_assert_eq!(r.live_bytes(), live);
        prop_assert_eq!(r.live_blocks(), models.iter().map(|m| m.live.len()).sum::<usize>());
        assert_quiescent_invariants(r);
        finish(r, &gpu, models)?;
    }
}
