//! Bad input found by the outside review (issue 18): each is refused with
//! its own error and changes nothing.

mod checks;
mod common;

use std::sync::Arc;

use checks::Snapshot;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    AllocTag, DeviceBlock, DeviceMemoryResource, DriverCall, ResourceError, SimResource,
};
use streamalloc::{CacheConfig, CachingResource};

const T: AllocTag = AllocTag("hostile");

/// A cache configured to cache blocks of any size: a request near
/// `usize::MAX` used to overflow its size-class arithmetic (a panic in
/// debug). It now bypasses the classes and the device refuses it.
#[test]
fn a_request_near_usize_max_through_a_cache_is_out_of_memory() {
    let f = common::sim(1);
    let cache = CachingResource::with_config(
        f.resource.clone(),
        CacheConfig::default().max_block_size(usize::MAX),
    );
    for bytes in [usize::MAX, usize::MAX - 4095, (usize::MAX >> 1) + 2] {
        let err = cache.allocate(bytes, f.stream(0), T).unwrap_err();
        assert!(
            matches!(err, ResourceError::OutOfMemory { .. }),
            "{bytes}: {err:?}"
        );
    }
    assert_eq!(cache.cached_bytes() + cache.leased_bytes(), 0);
    assert_eq!(f.resource.bytes_outstanding(), 0);
}

/// A stream of device 1 put in a pool of device 0 (by `StreamPool::from_raw`):
/// the simulated device refuses the allocation on it, as it refuses every
/// other call on a stream it does not own, instead of handing out a block no
/// free can return.
#[test]
fn an_allocation_on_another_devices_stream_is_refused() {
    let gpus = SimGpu::builder().manual().build_host(2);
    let stranger = gpus[1].create_stream();
    // SAFETY: a stream of a simulated device; nothing is dereferenced.
    let pool =
        Arc::new(unsafe { streamalloc::StreamPool::from_raw(0, vec![stranger], Vec::new()) });
    let r = SimResource::new(&streamalloc::Device::new(gpus[0].clone(), pool.clone()).unwrap());
    let s = pool.id(0).unwrap();
    let before = Snapshot::of(&r, &[]);
    let err = r.allocate(4096, s, T).unwrap_err();
    assert!(
        matches!(
            err,
            // The first call on the stream (whether it is capturing, asked
            // before allocating) is refused.
            ResourceError::Driver {
                call: DriverCall::StreamGetCaptureInfo | DriverCall::AllocAsync,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(Snapshot::of(&r, &[]), before);
    assert_eq!(gpus[0].free_bytes(), 16 << 30);
    assert_eq!(gpus[1].free_bytes(), 16 << 30);
}

/// A hand-built descriptor with the right id, address and size but another
/// stream is not the block: refused, and the block stays live.
#[test]
fn a_descriptor_with_the_wrong_stream_is_refused() {
    let f = common::sim(2);
    let r = &f.resource;
    let block = r.allocate(4096, f.stream(0), T).unwrap();
    let forged = DeviceBlock::new(block.id(), block.ptr(), block.size(), f.stream(1), T);
    let before = Snapshot::of(r, &[&block]);
    assert_eq!(
        r.deallocate(forged),
        Err(ResourceError::UnknownBlock { block: block.id() })
    );
    assert_eq!(Snapshot::of(r, &[&block]), before);
    r.deallocate(block).unwrap();
    r.reap_pending().unwrap();
    assert_eq!(r.bytes_outstanding(), 0);
}

/// Two pools of the same device: a stream id of one is refused by a
/// resource of the other, rather than resolved to its stream of the same
/// index.
#[test]
fn another_pools_stream_on_the_same_device_is_refused() {
    let gpu = SimGpu::builder().manual().build();
    let (mine, theirs) = (gpu.stream_pool(2), gpu.stream_pool(2));
    let r = SimResource::new(&streamalloc::Device::new(gpu.clone(), mine.clone()).unwrap());
    let foreign = theirs.id(0).unwrap();
    let before = Snapshot::of(&r, &[]);
    let err = r.allocate(4096, foreign, T).unwrap_err();
    assert_eq!(err, ResourceError::ForeignStream { stream: foreign });
    assert_eq!(
        mine.raw(foreign),
        Err(ResourceError::ForeignStream { stream: foreign })
    );
    assert_eq!(r.pending_free_seq(foreign), 0);
    assert_eq!(r.reap_through(foreign, 1), 0);
    assert_eq!(Snapshot::of(&r, &[]), before);
    // The pool's own ids still work; a hand-built id (no pool named) is
    // refused like another pool's: it could name either pool's stream.
    let block = r.allocate(64, mine.id(1).unwrap(), T).unwrap();
    r.deallocate(block).unwrap();
    let hand = streamalloc::StreamId::new(0, 1);
    assert_eq!(
        mine.raw(hand),
        Err(ResourceError::ForeignStream { stream: hand })
    );
}

/// `reap_through` with a sequence number the stream never handed out
/// (`u64::MAX`) drains nothing: those frees may not have run.
#[test]
fn reap_through_a_number_never_handed_out_drains_nothing() {
    let f = common::sim(1);
    let r = &f.resource;
    let s = f.stream(0);
    let block = r.allocate(4096, s, T).unwrap();
    r.deallocate(block).unwrap();
    assert_eq!(r.pending_free_bytes(), 4096);
    assert_eq!(r.reap_through(s, u64::MAX), 0);
    assert_eq!(r.reap_through(s, 2), 0, "one past the last free");
    assert_eq!(r.pending_free_bytes(), 4096);
    assert_eq!(r.bytes_outstanding(), 4096);
    let seq = r.pending_free_seq(s);
    assert_eq!(seq, 1);
    r.reap_pending().unwrap();
    assert_eq!(r.bytes_outstanding(), 0);
}

/// Sizes whose rounding overflows somewhere: to a size class, to the
/// arena's unit, to a 2 MiB page, to a block across a page boundary.
const HUGE: [usize; 6] = [
    usize::MAX,
    usize::MAX - 4095,
    usize::MAX - (2 << 20) + 1,
    usize::MAX - (2 << 20) - 4095,
    (usize::MAX >> 1) + 2,
    1 << 62,
];

/// One layer of a stack in [`every_stack_refuses_every_huge_size`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Budget,
    Arena,
    Classes,
    Guard,
    Retry,
    Stats,
    Tracing,
}

/// Every order of every subset of `kinds`, outermost first.
fn orders(kinds: &[Kind]) -> Vec<Vec<Kind>> {
    let mut out = vec![Vec::new()];
    let mut grow = vec![Vec::new()];
    for _ in 0..kinds.len() {
        let mut next = Vec::new();
        for stack in &grow {
            for &k in kinds {
                if !stack.contains(&k) {
                    let mut s: Vec<Kind> = stack.clone();
                    s.push(k);
                    next.push(s);
                }
            }
        }
        out.extend(next.iter().cloned());
        grow = next;
    }
    out
}

/// A stack of `kinds` over a fresh simulated device, the budgets in it, and
/// what it stands on.
struct SizeRig {
    top: Arc<dyn DeviceMemoryResource>,
    budgets: Vec<streamalloc::Budget>,
    bottom: Arc<SimResource>,
    gpu: Arc<SimGpu>,
    stream: streamalloc::StreamId,
}

fn size_rig(kinds: &[Kind], budget_limit: usize) -> SizeRig {
    use streamalloc::ResourceBuilder;
    use streamalloc::{Budget, GuardConfig};
    let gpu = SimGpu::builder().manual().capacity(1 << 30).build();
    let device = streamalloc::Device::simulated(&gpu, 2);
    let stream = device.stream(0).unwrap();
    let bottom = Arc::new(SimResource::new(&device));
    let mut budgets = Vec::new();
    let mut top: Arc<dyn DeviceMemoryResource> = bottom.clone();
    for kind in kinds.iter().rev() {
        let b = ResourceBuilder::new();
        top = match kind {
            Kind::Budget => {
                let budget = Budget::new(budget_limit);
                budgets.push(budget.clone());
                Arc::new(b.budget(&budget).build(top))
            }
            Kind::Arena => Arc::new(b.cache(CacheConfig::default()).build(top)),
            Kind::Classes => Arc::new(
                b.cache(
                    CacheConfig::default()
                        .max_block_size(usize::MAX)
                        .virtual_memory(false),
                )
                .build(top),
            ),
            Kind::Guard => Arc::new(b.debug_guard(GuardConfig::new().max_blocks(1)).build(top)),
            Kind::Retry => Arc::new(b.retry_on_oom().build(top)),
            Kind::Stats => Arc::new(b.stats().build(top)),
            Kind::Tracing => Arc::new(b.tracing().build(top)),
        };
    }
    SizeRig {
        top,
        budgets,
        bottom,
        gpu,
        stream,
    }
}

impl SizeRig {
    /// What the device holds for the stack, and what each budget counts.
    fn held(&self) -> (usize, usize, Vec<usize>) {
        (
            self.bottom.bytes_outstanding(),
            self.gpu.physical_bytes(),
            self.budgets.iter().map(|b| b.in_use()).collect(),
        )
    }
}

/// Runs `kinds` against every huge size; the error says what went wrong.
fn refuses_every_huge_size(kinds: &[Kind], budget_limit: usize) -> Result<(), String> {
    let rig = size_rig(kinds, budget_limit);
    // A block held across the refusals, so that a cache has state to lose.
    let held = rig
        .top
        .allocate(4096, rig.stream, T)
        .map_err(|e| format!("4096: {e:?}"))?;
    for bytes in HUGE {
        let before = rig.held();
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rig.top.allocate(bytes, rig.stream, T)
        }));
        match out {
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                return Err(format!("{bytes}: panicked: {msg}"));
            }
            Ok(Ok(b)) => return Err(format!("{bytes}: allocated {b:?}")),
            Ok(Err(ResourceError::OutOfMemory { requested, .. })) if requested >= bytes => {}
            // The numbers it compared: `in_use + requested` passes `limit`.
            Ok(Err(ResourceError::BudgetExceeded {
                requested,
                limit,
                in_use,
            })) if requested >= bytes
                && in_use.checked_add(requested).is_none_or(|n| n > limit) => {}
            Ok(Err(e)) => return Err(format!("{bytes}: {e:?}")),
        }
        if rig.held() != before {
            return Err(format!(
                "{bytes}: the refusal changed the books: {before:?} -> {:?}",
                rig.held()
            ));
        }
    }
    // Zero bytes is a request like any other: served or refused, it takes
    // nothing that a free does not give back.
    if let Ok(zero) = rig.top.allocate(0, rig.stream, T) {
        rig.top
            .deallocate(zero)
            .map_err(|e| format!("free 0: {e:?}"))?;
    }
    rig.top
        .deallocate(held)
        .map_err(|e| format!("free: {e:?}"))?;
    rig.top
        .release_idle()
        .map_err(|e| format!("release: {e:?}"))?;
    rig.gpu.run_until_idle();
    rig.top.reap_pending().map_err(|e| format!("reap: {e:?}"))?;
    drop(rig.top);
    if rig.bottom.bytes_outstanding() != 0 || rig.budgets.iter().any(|b| b.in_use() != 0) {
        return Err(format!(
            "left behind: {} B outstanding, budgets {:?}",
            rig.bottom.bytes_outstanding(),
            rig.budgets
        ));
    }
    if let Some(race) = rig.gpu.races().first() {
        return Err(format!("race: {race:?}"));
    }
    Ok(())
}

/// Sizes near `usize::MAX` through every order of every layer (the budget
/// with a limit that admits anything, so that what is below it is reached,
/// and with an ordinary one), with both cache tiers: each request is
/// refused with `OutOfMemory` or `BudgetExceeded` reporting at least the
/// bytes asked, nothing panics (a budget over the arena used to overflow
/// rounding to pages, "attempt to multiply with overflow" in debug and a
/// cost of 0 in release), and nothing changes.
#[test]
fn every_stack_refuses_every_huge_size() {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let kinds = [
        Kind::Budget,
        Kind::Guard,
        Kind::Retry,
        Kind::Stats,
        Kind::Tracing,
    ];
    let mut failures = Vec::new();
    let mut cases = 0;
    for cache in [None, Some(Kind::Arena), Some(Kind::Classes)] {
        for mut stack in orders(&kinds) {
            if !stack.contains(&Kind::Budget) && stack.len() > 2 {
                continue;
            }
            // The cache at every depth of the stack.
            let depths = match cache {
                None => 0..=0,
                Some(_) => 0..=stack.len(),
            };
            for depth in depths {
                let mut s = std::mem::take(&mut stack);
                if let Some(c) = cache {
                    s.insert(depth, c);
                }
                for limit in [usize::MAX, 1 << 30] {
                    cases += 1;
                    if let Err(e) = refuses_every_huge_size(&s, limit) {
                        failures.push(format!("{s:?} (limit {limit}): {e}"));
                    }
                }
                if cache.is_some() {
                    s.remove(depth);
                }
                stack = s;
            }
        }
    }
    std::panic::set_hook(hook);
    assert!(cases > 1000, "{cases} cases");
    let mut kinds_of_failure: Vec<&str> = failures
        .iter()
        .map(|f| f.split_once("): ").map_or(f.as_str(), |(_, e)| e))
        .collect();
    kinds_of_failure.sort();
    kinds_of_failure.dedup();
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed, the first: {:#?}\nall kinds: {kinds_of_failure:#?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
}

/// The futures layer and the buffers over stacks of every kind: huge
/// sizes and element counts are refused at once (a request no budget or
/// device could ever hold does not wait), with `SizeOverflow` where the
/// element count does not fit in bytes, and take nothing.
#[test]
fn the_futures_layer_refuses_every_huge_size_and_element_count() {
    use streamalloc::{
        AsyncResource, Device, FaithfulLayer, ResourceBuilder, StreamOrderedResource,
    };
    use streamalloc::{Budget, GuardConfig};

    fn check<L, R>(name: &str, layers: impl Fn(&Budget) -> L)
    where
        L: FaithfulLayer<StreamOrderedResource<SimGpu>, Resource = R>,
        R: DeviceMemoryResource + 'static,
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let gpu = SimGpu::builder().capacity(1 << 30).build();
        let device = Device::simulated(&gpu, 2);
        let s = device.stream(0).unwrap();
        let budget = Budget::new(1 << 29);
        let res = AsyncResource::build(&device, &layers(&budget)).unwrap();
        let held = || (budget.in_use(), gpu.free_bytes(), gpu.physical_bytes());
        let before = held();
        for bytes in HUGE {
            let err = res.try_allocate(bytes, s, T).unwrap_err();
            assert!(
                matches!(
                    err,
                    ResourceError::OutOfMemory { .. } | ResourceError::BudgetExceeded { .. }
                ),
                "{name}: try {bytes}: {err:?}"
            );
            let err = rt
                .block_on(async {
                    tokio::time::timeout(common::guard(10), res.allocate(bytes, s, T)).await
                })
                .unwrap_or_else(|_| panic!("{name}: {bytes} waited"))
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    ResourceError::OutOfMemory { .. } | ResourceError::BudgetExceeded { .. }
                ),
                "{name}: {bytes}: {err:?}"
            );
            assert_eq!(held(), before, "{name}: {bytes}");
        }
        // Element counts: bytes that overflow, and bytes near the top.
        for len in [usize::MAX, usize::MAX / 4 + 1] {
            let err = res.try_allocate_buffer::<u32>(len, s, T).unwrap_err();
            assert_eq!(
                err,
                ResourceError::SizeOverflow { len, elem_size: 4 },
                "{name}"
            );
            let err = rt
                .block_on(res.allocate_buffer::<u32>(len, s, T))
                .unwrap_err();
            assert_eq!(
                err,
                ResourceError::SizeOverflow { len, elem_size: 4 },
                "{name}"
            );
        }
        for len in [usize::MAX / 4, (usize::MAX - 4095) / 4, 1 << 60] {
            let err = res.try_allocate_buffer::<u32>(len, s, T).unwrap_err();
            assert!(
                matches!(
                    err,
                    ResourceError::OutOfMemory { .. } | ResourceError::BudgetExceeded { .. }
                ),
                "{name}: {len}: {err:?}"
            );
        }
        assert_eq!(held(), before, "{name}");
        drop(res);
        assert!(gpu.races().is_empty(), "{name}");
    }

    check("plain", |_| ResourceBuilder::new());
    check("budget(arena)", |b| {
        ResourceBuilder::new()
            .budget(b)
            .cache(CacheConfig::default())
    });
    check("arena(budget)", |b| {
        ResourceBuilder::new()
            .cache(CacheConfig::default())
            .budget(b)
    });
    check("budget(classes)", |b| {
        ResourceBuilder::new().budget(b).cache(
            CacheConfig::default()
                .virtual_memory(false)
                .max_block_size(usize::MAX),
        )
    });
    check("everything", |b| {
        ResourceBuilder::new()
            .tracing()
            .retry_on_oom()
            .stats()
            .budget(b)
            .debug_guard(GuardConfig::new().max_blocks(1))
            .cache(CacheConfig::default())
    });
}
