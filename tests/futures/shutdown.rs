//! One handle for a built stack: its layers by type, a type-erased clone a
//! struct can hold, `close()`, and `shutdown()` to zero, on the simulator.

use std::time::Duration;

use streamalloc::ResourceBuilder;
use streamalloc::{AllocTag, Device, ResourceError, Tag, gpu::sim::SimGpu};
use streamalloc::{AnyResource, AsyncResource, Reaper};
use streamalloc::{Budget, Stats};
use streamalloc::{CacheConfig, CacheStats};

const MIB: usize = 1 << 20;
const HANG: Duration = Duration::from_secs(20);

/// What a service keeps: the stack, type-erased, in a plain field.
#[derive(Clone)]
struct Service {
    res: AnyResource,
}

fn service(device: &Device, budget: &Budget) -> Service {
    let layers = ResourceBuilder::new()
        .stats()
        .tracing()
        .cache(CacheConfig::default())
        .retry_on_oom()
        .budget(budget);
    Service {
        res: AsyncResource::build(device, &layers).unwrap().into_any(),
    }
}

#[test]
fn layers_are_found_by_type_in_either_order() {
    let device = Device::sim(&SimGpu::new(), 1);
    let budget = Budget::new(64 * MIB);
    let stats = Stats::new();
    let outer_first = ResourceBuilder::new()
        .stats_with(&stats)
        .budget(&budget)
        .cache(CacheConfig::default());
    let cache_first = ResourceBuilder::new()
        .cache(CacheConfig::default())
        .budget(&budget)
        .stats_with(&stats);
    let a = AsyncResource::build(&device, &outer_first)
        .unwrap()
        .into_any();
    let b = AsyncResource::build(&device, &cache_first)
        .unwrap()
        .into_any();
    for res in [a, b] {
        let s = device.stream(0).unwrap();
        let block = res.try_allocate(MIB, s, AllocTag("x")).unwrap();
        assert_eq!(res.layer::<Budget>().unwrap().in_use(), budget.in_use());
        assert!(budget.in_use() >= MIB);
        let snap = res.layer::<Stats>().unwrap().snapshot();
        assert_eq!(snap.overall.current_bytes, MIB);
        let cache = res.layer::<CacheStats>().unwrap();
        assert_eq!(cache.hits + cache.misses + cache.bypasses, 1, "{cache:?}");
        assert!(res.layer::<String>().is_none());
        drop(res.deallocate(block).unwrap());
    }
    let plain = AsyncResource::on(&device).unwrap();
    assert!(plain.layer::<Stats>().is_none() && plain.layer::<CacheStats>().is_none());
}

#[tokio::test]
async fn close_refuses_new_and_queued_allocations() {
    let device = Device::sim(&SimGpu::new(), 1);
    let budget = Budget::new(2 * MIB);
    let svc = service(&device, &budget);
    let s = device.stream(0).unwrap();
    let held = svc
        .res
        .allocate_buffer::<u8>(2 * MIB, s, AllocTag("held"))
        .await
        .unwrap();
    let queued = tokio::spawn({
        let svc = svc.clone();
        async move {
            svc.res
                .reserve(&[MIB, MIB], s, Tag::for_request("r", "late"))
                .await
        }
    });
    tokio::time::timeout(HANG, async {
        while svc.res.waiting_allocations() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap();

    svc.res.close();
    let queued = tokio::time::timeout(HANG, queued).await.unwrap().unwrap();
    assert!(matches!(queued, Err(ResourceError::Closed)), "{queued:?}");
    assert!(matches!(
        svc.res.allocate(MIB, s, AllocTag("new")).await,
        Err(ResourceError::Closed)
    ));
    assert!(matches!(
        svc.res.try_allocate(MIB, s, AllocTag("new")),
        Err(ResourceError::Closed)
    ));
    assert!(matches!(
        svc.res
            .allocate_buffers::<f32>(&[16], s, AllocTag("new"))
            .await,
        Err(ResourceError::Closed)
    ));
    let q = svc.res.queue_stats();
    assert_eq!((q.waiting, q.failed), (0, 1));
    // What was served still works, and frees.
    drop(held);
    let report = svc.res.shutdown().await.unwrap();
    assert_eq!(report.bytes_outstanding, 0, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_everything_to_zero_in_one_call() {
    let device = Device::sim(&SimGpu::new(), 4);
    let budget = Budget::new(24 * MIB);
    let svc = service(&device, &budget);
    let reaper = Reaper::spawn(&svc.res);
    let mut tasks = Vec::new();
    for i in 0..32usize {
        let svc = svc.clone();
        let s = device.stream(i % 4).unwrap();
        tasks.push(tokio::spawn(async move {
            let tag = Tag::for_request("request", format!("req-{i}"));
            let mut r = svc.res.reserve(&[MIB, 4 * MIB, MIB], s, tag).await?;
            let input = r.allocate_buffer::<f32>(MIB / 4)?;
            let activations = r.allocate_buffer::<u8>(4 * MIB)?;
            tokio::task::yield_now().await;
            let output = r.allocate_buffer::<f32>(MIB / 4)?;
            drop((input, activations, output));
            Ok::<_, ResourceError>(())
        }));
    }
    for t in tasks {
        tokio::time::timeout(HANG, t)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    assert!(
        svc.res.bytes_outstanding() > 0,
        "the cache keeps idle memory"
    );
    let report = tokio::time::timeout(HANG, svc.res.shutdown())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.bytes_outstanding, 0, "{report:?}");
    assert_eq!(report.budget_in_use, Some(0));
    assert!(report.released_idle > 0);
    let stats = report.stats.unwrap();
    assert_eq!(stats.overall.current_bytes, 0);
    // 96 served, and the blocks of tries that failed part way (all or
    // nothing: given back within their poll).
    assert!(stats.overall.total_blocks >= 96, "{stats}");
    assert_eq!(stats.overall.failed_allocations, 0, "{stats}");
    assert!(report.cache.is_some());
    assert!(matches!(
        svc.res
            .try_allocate(MIB, device.stream(0).unwrap(), AllocTag("after")),
        Err(ResourceError::Closed)
    ));
    reaper.shutdown().await.unwrap();
    assert_eq!(budget.in_use(), 0);
    assert!(device.simulator().unwrap().races().is_empty());
}

/// A shutdown called right after the last free, while the GPU still runs
/// the last kernels on cached blocks: the cache's idle memory rests on that
/// work, so the shutdown awaits each stream's end before asking for it. It
/// used to return at once with the blocks' pages held (`bytes_outstanding`
/// 8 MiB, `released_idle` 0) although every block was freed.
#[test]
fn a_shutdown_right_after_the_last_free_awaits_the_gpu_and_drains_to_zero() {
    use streamalloc::gpu::sim::MemAccess;
    let gpu = SimGpu::builder().manual().build();
    let device = Device::sim(&gpu, 2);
    let layers = ResourceBuilder::new().cache(CacheConfig::default());
    let res = AsyncResource::build(&device, &layers).unwrap().into_any();
    for i in 0..2 {
        let s = device.stream(i).unwrap();
        let block = res.try_allocate(8 * MIB, s, AllocTag("last")).unwrap();
        let raw = device.streams().raw(s).unwrap();
        gpu.launch_kernel(raw, &[MemAccess::write(&block)]).unwrap();
        drop(res.deallocate(block).unwrap());
    }
    let report = crate::support::drive(&gpu, &mut Box::pin(res.shutdown())).unwrap();
    assert_eq!(report.bytes_outstanding, 0, "{report:?}");
    assert!(report.released_idle >= 8 * MIB, "{report:?}");
    assert_eq!(gpu.physical_bytes(), 0, "the arena's pages went back");
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
}
