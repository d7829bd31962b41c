//! The adaptor stack and the launch recorder on a real CUDA device
//! (`AsyncCudaResource`), with memset and copy through the gpu seam as the
//! kernels.
//!
//! Every scenario is one generic body run on both backends: `*_sim` on the
//! simulated device everywhere, `*_cuda` on device 0 (ignored without a GPU;
//! run on the GPU machine with `--include-ignored`).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use streamalloc::LaunchRecorder;
use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, BlockState, DeviceMemoryResource, ResourceBuilder, ResourceError};
use streamalloc::{
    Budget, BudgetResource, GuardConfig, MemsetPoisonFill, RetryOnOomResource, Stats,
};

const T: AllocTag = AllocTag("gpu");
const MIB: usize = 1 << 20;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn a_full_stack_fills_copies_and_frees_across_streams<G: Gpu>(f: support::Fixture<G>) {
    let gpu = f.resource.gpu().clone();
    let (a, b) = (f.stream(0), f.stream(1));
    let budget = Budget::new(64 * MIB);
    let stats = Stats::new();
    // SAFETY: the guard is the poison's only user and fills only blocks live in a resource of this device.
    let poison = unsafe { MemsetPoisonFill::for_resource(&f.resource, 0xA5) };
    let r = ResourceBuilder::new()
        .tracing()
        .retry_on_oom()
        .budget(&budget)
        .stats_with(&stats)
        .debug_guard(GuardConfig::new().max_blocks(4).poison(poison))
        .build(f.resource.clone());
    assert!(r.supports_block_use_tracking());

    for _ in 0..8 {
        let src = r.allocate(8 * MIB, a, T).unwrap();
        let dst = r.allocate(8 * MIB, b, T).unwrap();
        // Fill src on a, copy it into dst on b, read dst back on a.
        LaunchRecorder::new(&r, a)
            .write(&src)
            .launch(&f.device, |raw| -> Result<(), BoxError> {
                // SAFETY: a stream of the device's pool; the block is live (freed later).
                Ok(unsafe { gpu.memset_async(src.ptr(), 1, src.size(), raw) }?)
            })
            .unwrap();
        LaunchRecorder::new(&r, b)
            .read(&src)
            .write(&dst)
            .launch(&f.device, |raw| -> Result<(), BoxError> {
                // SAFETY: a stream of the device's pool; both blocks are live (freed later).
                Ok(unsafe { gpu.copy_async(dst.ptr(), src.ptr(), src.size(), raw) }?)
            })
            .unwrap();
        LaunchRecorder::new(&r, a)
            .read(&dst)
            .write(&src)
            .launch(&f.device, |raw| -> Result<(), BoxError> {
                // SAFETY: a stream of the device's pool; both blocks are live (freed later).
                Ok(unsafe { gpu.copy_async(src.ptr(), dst.ptr(), dst.size(), raw) }?)
            })
            .unwrap();
        r.deallocate(src.clone()).unwrap();
        assert_eq!(r.block_state(src.id()), Some(BlockState::Quarantined));
        r.deallocate(dst).unwrap();
    }
    assert_eq!(stats.snapshot().overall.total_blocks, 16);
    assert_eq!(stats.snapshot().overall.current_bytes, 0);
    assert!(
        budget.in_use() > 0,
        "quarantined and pending bytes still count"
    );
    assert!(budget.peak() <= budget.limit());
    // 128 MiB went through a 64 MiB budget: it ran short and room was made,
    // by the budget's relief (a refusal asks the guard for its quarantine
    // and reaps it) or by a retry's reap.
    assert!(stats.snapshot().overall.total_bytes > budget.limit() as u64);
    r.inner().inner().inner().inner().flush().unwrap();
    r.reap_pending().unwrap();
    assert_eq!(budget.in_use(), 0);
    assert_eq!(f.resource.bytes_outstanding(), 0);
    if let Some(sim) = &f.sim {
        assert!(sim.races().is_empty(), "{:?}", sim.races());
    }
}

fn the_budget_counts_a_free_until_the_gpu_ran_it<G: Gpu>(f: support::Fixture<G>) {
    let s = f.stream(0);
    let budget = Budget::new(16 * MIB);
    let r = BudgetResource::new(f.resource.clone(), &budget);
    let block = r.allocate(12 * MIB, s, T).unwrap();
    r.deallocate(block).unwrap();
    assert_eq!(budget.in_use(), 12 * MIB);
    assert!(matches!(
        r.allocate(12 * MIB, s, T),
        Err(ResourceError::BudgetExceeded { .. })
    ));
    let seq = r.pending_free_seq(s);
    // SAFETY: a stream of the pool this code holds.
    unsafe { f.resource.gpu().stream_synchronize(f.pool.raw(s).unwrap()) }.unwrap();
    assert_eq!(r.reap_through(s, seq), 12 * MIB);
    assert_eq!(budget.in_use(), 0);
}

fn sixteen_threads_share_a_budget_without_overshoot<G: Gpu>(f: support::Fixture<G>) {
    const LIMIT: usize = 32 * MIB;
    let budget = Budget::new(LIMIT);
    let r = Arc::new(BudgetResource::new(f.resource.clone(), &budget));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (r, budget, max_seen) = (r.clone(), budget.clone(), max_seen.clone());
            let s = f.stream(t);
            std::thread::spawn(move || {
                for i in 0..200 {
                    if let Ok(b) = r.allocate(MIB + i * 4096, s, T) {
                        max_seen.fetch_max(budget.in_use(), Ordering::AcqRel);
                        r.deallocate(b).unwrap();
                    }
                    if i % 10 == 0 {
                        r.reap_pending().unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(max_seen.load(Ordering::Acquire) <= LIMIT);
    assert!(budget.peak() <= LIMIT);
    r.reap_pending().unwrap();
    assert_eq!(budget.in_use(), 0);
}

fn retry_reports_a_real_out_of_memory_and_the_stream_stays_usable<G: Gpu>(f: support::Fixture<G>) {
    let s = f.stream(0);
    let r = RetryOnOomResource::new(f.resource.clone());
    assert!(matches!(
        r.allocate(1 << 50, s, T),
        Err(ResourceError::OutOfMemory { .. })
    ));
    assert_eq!(r.retries(), 1);
    assert_eq!(f.resource.bytes_outstanding(), 0);
    let block = r.allocate(MIB, s, T).unwrap();
    r.deallocate(block).unwrap();
    r.reap_pending().unwrap();
    assert_eq!(f.resource.bytes_outstanding(), 0);
}

#[test]
fn a_full_stack_fills_copies_and_frees_across_streams_sim() {
    a_full_stack_fills_copies_and_frees_across_streams(support::sim_with(SimGpu::new(), 2));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_full_stack_fills_copies_and_frees_across_streams_cuda() {
    a_full_stack_fills_copies_and_frees_across_streams(support::cuda(2));
}

#[test]
fn the_budget_counts_a_free_until_the_gpu_ran_it_sim() {
    the_budget_counts_a_free_until_the_gpu_ran_it(support::sim_with(SimGpu::new(), 1));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_budget_counts_a_free_until_the_gpu_ran_it_cuda() {
    the_budget_counts_a_free_until_the_gpu_ran_it(support::cuda(1));
}

#[test]
fn retry_reports_a_real_out_of_memory_and_the_stream_stays_usable_sim() {
    retry_reports_a_real_out_of_memory_and_the_stream_stays_usable(support::sim_with(
        SimGpu::new(),
        1,
    ));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn retry_reports_a_real_out_of_memory_and_the_stream_stays_usable_cuda() {
    retry_reports_a_real_out_of_memory_and_the_stream_stays_usable(support::cuda(1));
}

#[test]
fn sixteen_threads_share_a_budget_without_overshoot_sim() {
    sixteen_threads_share_a_budget_without_overshoot(support::sim_with(SimGpu::new(), 16));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sixteen_threads_share_a_budget_without_overshoot_cuda() {
    sixteen_threads_share_a_budget_without_overshoot(support::cuda(16));
}
