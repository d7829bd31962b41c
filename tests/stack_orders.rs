//! Every order of layers the builder accepts, checked against the device.
//!
//! [`ResourceBuilder`] takes its layers in any order, any number of times.
//! This file builds stacks one layer at a time through the builder (each
//! call wraps what was built so far, as `.a().b()` wraps `a` around `b`)
//! and drives them with random operations on a manual [`SimGpu`]. After
//! every step, each budget in the stack counts exactly what the device
//! holds for it: the bottom resource's outstanding bytes (live, cached,
//! quarantined, freed but not reaped) plus the physical memory a cache's
//! arena maps. A refusal takes nothing. After the last free and the stack's
//! drop, nothing is left: no byte outstanding or mapped, every budget at 0,
//! the device's whole capacity free, and no race between streams.
//!
//! Two tests share that check:
//! - `every_order_of_distinct_layers_holds` sweeps every order of every
//!   subset of the six layers (budget, cache, debug guard, retry, stats,
//!   tracing) that has a budget in it, 1,631 orders, once with the cache's
//!   virtual-memory arena and once with its size classes;
//! - `any_sequence_of_layers_holds` (proptest) draws sequences with
//!   repeats (two budgets, two caches, a guard above a guard), and shrinks a
//!   failure to the shortest stack and operation list.

use std::sync::Arc;

use streamalloc::CacheConfig;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{
    Access, AllocTag, Device, DeviceBlock, DeviceMemoryResource, ResourceBuilder, ResourceError,
    SimResource, StreamId, StreamPool,
};
use streamalloc::{Budget, GuardConfig};

const T: AllocTag = AllocTag("orders");
/// The device's memory.
const CAPACITY: usize = 96 << 10;
/// Each budget's limit: half the device, so that both the budget and the
/// device can be the one that refuses.
const LIMIT: usize = 48 << 10;
/// The device's mapping granularity, small enough that the cache's arena
/// maps pages inside the small device.
const PAGE: usize = 4 << 10;
/// The arena's slack over its live high-water mark.
const SLACK_PERCENT: usize = 5;
const SIZES: [usize; 8] = [0, 100, 512, 1000, 4096, 5000, 8192, 20_000];

/// One layer, as the builder adds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Budget,
    Cache,
    /// A debug guard that keeps one freed block in quarantine.
    Guard,
    Retry,
    Stats,
    Tracing,
}

const KINDS: [Kind; 6] = [
    Kind::Budget,
    Kind::Cache,
    Kind::Guard,
    Kind::Retry,
    Kind::Stats,
    Kind::Tracing,
];

/// Which cache the `Cache` layer is: the builder's default (the arena,
/// where the layer below lends the device: right on the bottom resource;
/// here with a slack of [`SLACK_PERCENT`]), or size classes everywhere.
#[derive(Debug, Clone, Copy)]
enum CacheKind {
    Arena,
    Classes,
}

impl CacheKind {
    fn config(self) -> CacheConfig {
        match self {
            CacheKind::Arena => CacheConfig::default().slack_percent(SLACK_PERCENT),
            CacheKind::Classes => CacheConfig::default().virtual_memory(false),
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: usize,
        stream: usize,
    },
    Free {
        slot: usize,
    },
    /// Prepare, a kernel on `stream` touching the block, finish.
    Use {
        slot: usize,
        stream: usize,
        write: bool,
    },
    Reap,
    /// What the futures layer does on a completion notification: read each
    /// stream's latest free number, let the device run, apply them.
    Notify,
    ReleaseIdle,
    Step,
}

/// A stack under test and what it stands on.
struct Rig {
    top: Arc<dyn DeviceMemoryResource>,
    budgets: Vec<Budget>,
    bottom: Arc<SimResource>,
    gpu: Arc<SimGpu>,
    pool: Arc<StreamPool>,
    streams: [StreamId; 2],
    /// How far past its limit a budget may count: nothing, except above
    /// the cache's arena (see `rig`).
    overshoot: usize,
}

/// Builds `kinds` (outermost first) through the builder, innermost first.
fn rig(kinds: &[Kind], cache: CacheKind) -> Rig {
    let gpu = SimGpu::builder()
        .manual()
        .capacity(CAPACITY)
        .vm_granularity(PAGE)
        .build();
    let device = Device::simulated(&gpu, 2);
    let streams = [device.stream(0).unwrap(), device.stream(1).unwrap()];
    let bottom = Arc::new(SimResource::new(&device));
    let mut budgets = Vec::new();
    let mut top: Arc<dyn DeviceMemoryResource> = bottom.clone();
    for kind in kinds.iter().rev() {
        let b = ResourceBuilder::new();
        top = match kind {
            Kind::Budget => {
                let budget = Budget::new(LIMIT);
                budgets.push(budget.clone());
                Arc::new(b.budget(&budget).build(top))
            }
            Kind::Cache => Arc::new(b.cache(cache.config()).build(top)),
            Kind::Guard => Arc::new(b.debug_guard(GuardConfig::new().max_blocks(1)).build(top)),
            Kind::Retry => Arc::new(b.retry_on_oom().build(top)),
            Kind::Stats => Arc::new(b.stats().build(top)),
            Kind::Tracing => Arc::new(b.tracing().build(top)),
        };
    }
    Rig {
        top,
        budgets,
        bottom,
        gpu,
        pool: device.streams().clone(),
        streams,
        // The arena (a cache right on the bottom resource, the builder's
        // default) guesses its cost before it places a block, then maps
        // what the block touches and may map ahead within its slack: a
        // budget above counts all of it, which may pass the limit by the
        // slack and a page or two (these runs reach two pages).
        overshoot: if kinds.last() == Some(&Kind::Cache) && matches!(cache, CacheKind::Arena) {
            LIMIT * SLACK_PERCENT / 100 + 2 * PAGE
        } else {
            0
        },
    }
}

impl Rig {
    /// What the device holds for the stack: pool allocations the bottom
    /// resource has not reaped, and physical memory behind mappings.
    fn held(&self) -> usize {
        self.bottom.bytes_outstanding() + self.gpu.physical_bytes()
    }

    fn budgets_count_what_the_device_holds(
        &self,
        after: &dyn std::fmt::Debug,
    ) -> Result<(), String> {
        let held = self.held();
        for (i, budget) in self.budgets.iter().enumerate() {
            if budget.in_use() != held {
                return Err(format!(
                    "after {after:?}: budget {i} counts {} B, the device holds {held} B",
                    budget.in_use()
                ));
            }
            if budget.in_use() > budget.limit() + self.overshoot {
                return Err(format!(
                    "after {after:?}: budget {i} counts {} B past its limit {}",
                    budget.in_use(),
                    budget.limit()
                ));
            }
        }
        Ok(())
    }

    fn raw(&self, stream: usize) -> streamalloc::RawStream {
        self.pool.raw(self.streams[stream]).unwrap()
    }
}

/// Runs `ops` on the stack `kinds`; the error says which step broke what.
fn run(kinds: &[Kind], cache: CacheKind, ops: &[Op]) -> Result<(), String> {
    let rig = rig(kinds, cache);
    let r = &rig.top;
    let mut live: Vec<DeviceBlock> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let before: Vec<usize> = rig.budgets.iter().map(Budget::in_use).collect();
        match *op {
            Op::Alloc { size, stream } => match r.allocate(size, rig.streams[stream], T) {
                Ok(block) => live.push(block),
                Err(
                    e @ (ResourceError::BudgetExceeded { .. } | ResourceError::OutOfMemory { .. }),
                ) => {
                    // Every size fits a fresh stack: a refusal of the first
                    // request would make the whole run vacuous.
                    if step == 0 {
                        return Err(format!("the first request was refused: {e:?}"));
                    }
                    let after: Vec<usize> = rig.budgets.iter().map(Budget::in_use).collect();
                    if after.iter().zip(&before).any(|(a, b)| a > b) {
                        return Err(format!(
                            "{op:?} was refused ({e:?}) and took memory: {before:?} -> {after:?}"
                        ));
                    }
                }
                Err(e) => return Err(format!("{op:?}: {e:?}")),
            },
            Op::Free { slot } => {
                if !live.is_empty() {
                    let block = live.swap_remove(slot % live.len());
                    r.deallocate(block).map_err(|e| format!("{op:?}: {e:?}"))?;
                }
            }
            Op::Use {
                slot,
                stream,
                write,
            } => {
                // A kernel cannot touch a 0-byte block (address 0).
                let sized: Vec<&DeviceBlock> = live.iter().filter(|b| b.size() > 0).collect();
                if let Some(block) = sized.get(slot % sized.len().max(1)) {
                    let (access, touch) = if write {
                        (Access::Write, MemAccess::write(block))
                    } else {
                        (Access::Read, MemAccess::read(block))
                    };
                    let s = rig.streams[stream];
                    r.prepare_block_use(block.id(), s, access)
                        .map_err(|e| format!("{op:?}: prepare: {e:?}"))?;
                    rig.gpu.launch_kernel(rig.raw(stream), &[touch]).unwrap();
                    r.finish_block_use(block.id(), s, access)
                        .map_err(|e| format!("{op:?}: finish: {e:?}"))?;
                }
            }
            Op::Reap => r.reap_pending().map_err(|e| format!("{op:?}: {e:?}"))?,
            Op::Notify => {
                let seqs = rig.streams.map(|s| r.pending_free_seq(s));
                rig.gpu.run_until_idle();
                for (s, seq) in rig.streams.into_iter().zip(seqs) {
                    r.reap_through(s, seq);
                }
            }
            Op::ReleaseIdle => {
                r.release_idle().map_err(|e| format!("{op:?}: {e:?}"))?;
            }
            Op::Step => {
                rig.gpu.step();
            }
        }
        rig.budgets_count_what_the_device_holds(&(step, op))?;
    }
    for block in live.drain(..) {
        r.deallocate(block)
            .map_err(|e| format!("last frees: {e:?}"))?;
    }
    r.reap_pending().map_err(|e| format!("last reap: {e:?}"))?;
    rig.budgets_count_what_the_device_holds(&"the last free")?;
    let Rig {
        top,
        budgets,
        bottom,
        gpu,
        ..
    } = rig;
    drop(top);
    bottom
        .reap_pending()
        .map_err(|e| format!("reap after drop: {e:?}"))?;
    gpu.run_until_idle();
    let left = (
        bottom.bytes_outstanding(),
        gpu.physical_bytes(),
        budgets.iter().map(Budget::in_use).collect::<Vec<_>>(),
        CAPACITY - gpu.free_bytes(),
    );
    if left != (0, 0, vec![0; budgets.len()], 0) {
        return Err(format!(
            "left after the stack's drop (outstanding, mapped, budgets, device): {left:?}"
        ));
    }
    if !gpu.races().is_empty() {
        return Err(format!("races: {:?}", gpu.races()));
    }
    Ok(())
}

/// A random operation; the first one is always an allocation.
fn random_op(rng: &mut fastrand::Rng) -> Op {
    match rng.u32(0..13) {
        0..=3 => Op::Alloc {
            size: SIZES[rng.usize(..SIZES.len())],
            stream: rng.usize(..2),
        },
        4..=6 => Op::Free {
            slot: rng.usize(..16),
        },
        7 | 8 => Op::Use {
            slot: rng.usize(..16),
            stream: rng.usize(..2),
            write: rng.bool(),
        },
        9 => Op::Reap,
        10 => Op::Notify,
        11 => Op::ReleaseIdle,
        _ => Op::Step,
    }
}

/// Every order of every subset of `KINDS` that holds a budget.
fn orders() -> Vec<Vec<Kind>> {
    fn extend(prefix: &mut Vec<Kind>, out: &mut Vec<Vec<Kind>>) {
        if prefix.contains(&Kind::Budget) {
            out.push(prefix.clone());
        }
        for kind in KINDS {
            if !prefix.contains(&kind) {
                prefix.push(kind);
                extend(prefix, out);
                prefix.pop();
            }
        }
    }
    let mut out = Vec::new();
    extend(&mut Vec::new(), &mut out);
    out
}

#[test]
#[cfg_attr(miri, ignore = "3,262 stacks: the proptest below runs under Miri")]
fn every_order_of_distinct_layers_holds() {
    let orders = orders();
    assert_eq!(orders.len(), 1 + 5 * 2 + 10 * 6 + 10 * 24 + 5 * 120 + 720);
    for cache in [CacheKind::Arena, CacheKind::Classes] {
        for (i, kinds) in orders.iter().enumerate() {
            let seed = i as u64;
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut ops = vec![Op::Alloc {
                size: 4096,
                stream: 0,
            }];
            ops.extend((0..40).map(|_| random_op(&mut rng)));
            if let Err(e) = run(kinds, cache, &ops) {
                panic!("{kinds:?} with the {cache:?} cache, seed {seed}: {e}\nops: {ops:?}");
            }
        }
    }
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0..SIZES.len(), 0..2usize).prop_map(|(i, stream)| Op::Alloc { size: SIZES[i], stream }),
        3 => (0..16usize).prop_map(|slot| Op::Free { slot }),
        2 => (0..16usize, 0..2usize, proptest::bool::ANY)
            .prop_map(|(slot, stream, write)| Op::Use { slot, stream, write }),
        1 => Just(Op::Reap),
        1 => Just(Op::Notify),
        1 => Just(Op::ReleaseIdle),
        1 => Just(Op::Step),
    ]
}

fn kinds() -> impl proptest::strategy::Strategy<Value = Vec<Kind>> {
    use proptest::prelude::*;
    proptest::collection::vec(proptest::sample::select(KINDS.to_vec()), 0..7).prop_map(|mut k| {
        if !k.contains(&Kind::Budget) {
            k.push(Kind::Budget);
        }
        k
    })
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: if cfg!(miri) { 4 } else { 256 },
        failure_persistence: None,
        .. proptest::test_runner::Config::default()
    })]

    /// Sequences of layers with repeats, random operations: the same check
    /// as the sweep.
    #[test]
    fn any_sequence_of_layers_holds(
        kinds in kinds(),
        arena in proptest::bool::ANY,
        first in 0..SIZES.len(),
        ops in proptest::collection::vec(op(), 0..48),
    ) {
        let cache = if arena { CacheKind::Arena } else { CacheKind::Classes };
        let mut all = vec![Op::Alloc { size: SIZES[first], stream: 0 }];
        all.extend(ops);
        if let Err(e) = run(&kinds, cache, &all) {
            proptest::prop_assert!(false, "{:?} with the {:?} cache: {}", kinds, cache, e);
        }
    }
}
