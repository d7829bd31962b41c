//! The futures layer on a real GPU (run with `--include-ignored` on the GPU
//! machine). Each test fails, rather than skips, without a device.

mod common;

use std::sync::Arc;
use std::time::Duration;

use streamalloc::{Access, AllocTag, AsyncCudaResource};
use streamalloc::{AsyncResource, Reaper};

const GUARD: Duration = Duration::from_secs(30);

fn cuda(
    streams: usize,
) -> (
    common::Fixture<streamalloc::gpu::cuda::CudaGpu>,
    AsyncResource<AsyncCudaResource>,
) {
    let f = common::cuda(streams);
    let res = AsyncResource::new(f.resource.clone()).expect("async resource on CUDA");
    (f, res)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a CUDA GPU"]
async fn cuda_points_frees_and_notifications_complete() {
    let (f, res) = cuda(2);
    let reaper = Reaper::spawn(&res);
    let (s0, s1) = (f.stream(0), f.stream(1));
    let block = res.allocate(64 << 20, s0, AllocTag("cuda")).await.unwrap();
    let raw = f.pool.raw(s0).unwrap();
    for _ in 0..50 {
        // SAFETY: a stream of this program's pool and blocks it allocated and has not freed.
        unsafe { res.gpu().memset_async(block.ptr(), 1, block.size(), raw) }.unwrap();
    }
    // Parked behind 50 fills: completes through a host-function notification.
    let point = res.finish_block_use(block.id(), s0, Access::Write).unwrap();
    assert_eq!(
        tokio::time::timeout(GUARD, point).await.expect("hang"),
        Ok(())
    );
    res.prepare_block_use(block.id(), s1, Access::Read).unwrap();
    let other = res.allocate(64 << 20, s1, AllocTag("cuda")).await.unwrap();
    // SAFETY: a stream of this program's pool and blocks it allocated and has not freed.
    unsafe {
        res.gpu().copy_async(
            other.ptr(),
            block.ptr(),
            block.size(),
            f.pool.raw(s1).unwrap(),
        )
    }
    .unwrap();
    let read = res.finish_block_use(block.id(), s1, Access::Read).unwrap();
    assert_eq!(
        tokio::time::timeout(GUARD, read).await.expect("hang"),
        Ok(())
    );
    let free = res.deallocate(block).unwrap();
    assert_eq!(
        tokio::time::timeout(GUARD, free).await.expect("hang"),
        Ok(())
    );
    drop(res.deallocate(other).unwrap());
    reaper.shutdown().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert!(res.notifications() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a CUDA GPU"]
async fn cuda_ten_thousand_concurrent_futures_complete() {
    let (f, res) = cuda(8);
    let res = Arc::new(res);
    let blocks: Vec<_> = f
        .streams
        .iter()
        .map(|&s| res.try_allocate(256, s, AllocTag("10k")).unwrap())
        .collect();
    let mut tasks = Vec::new();
    for i in 0..10_000 {
        let b = &blocks[i % 8];
        let raw = f.pool.raw(b.stream()).unwrap();
        // SAFETY: a stream of this program's pool and blocks it allocated and has not freed.
        unsafe { res.gpu().memset_async(b.ptr(), 0, 4, raw) }.unwrap();
        tasks.push(tokio::spawn(res.completion(b.stream()).unwrap()));
    }
    for t in tasks {
        let r = tokio::time::timeout(GUARD, t).await.expect("hang").unwrap();
        assert_eq!(r, Ok(()));
    }
    assert_eq!(res.parked_points(), 0);
    for b in blocks {
        drop(res.deallocate(b).unwrap());
    }
    tokio::time::timeout(GUARD, res.reap_pending())
        .await
        .expect("hang")
        .unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a CUDA GPU"]
async fn cuda_lazy_points_complete_after_their_work() {
    let (f, res) = cuda(8);
    let res = Arc::new(res);
    let gpu = res.gpu().clone();
    let s = f.stream(0);
    let raw = f.pool.raw(s).unwrap();
    let big = res.try_allocate(64 << 20, s, AllocTag("lazy")).unwrap();
    // A busy stream: the point's first query misses, and it must not
    // complete before the fills (a probe event recorded after them).
    let probe = gpu.event_create().unwrap();
    for _ in 0..20 {
        // SAFETY: a stream of this program's pool and a block it allocated and has not freed.
        unsafe { gpu.memset_async(big.ptr(), 1, big.size(), raw) }.unwrap();
    }
    // SAFETY: an event this test made on this backend, a stream of its pool.
    unsafe { gpu.event_record(probe, raw) }.unwrap();
    let point = res.completion_lazy(s).unwrap();
    assert_eq!(
        tokio::time::timeout(GUARD, point).await.expect("hang"),
        Ok(())
    );
    // SAFETY: the event made above, destroyed just below.
    assert!(
        unsafe { gpu.event_query(probe) }.unwrap(),
        "completed early"
    );
    // SAFETY: as above; not used afterwards.
    unsafe { gpu.event_destroy(probe) }.unwrap();
    // 10,000 tasks, each queuing a fill and awaiting its lazy point.
    let blocks: Vec<_> = f
        .streams
        .iter()
        .map(|&s| res.try_allocate(256, s, AllocTag("10k")).unwrap())
        .collect();
    let mut tasks = Vec::new();
    for i in 0..10_000 {
        let (b, res) = (blocks[i % 8].clone(), res.clone());
        let raw = f.pool.raw(b.stream()).unwrap();
        tasks.push(tokio::spawn(async move {
            // SAFETY: a stream of this program's pool and a block it allocated and has not freed.
            unsafe { res.gpu().memset_async(b.ptr(), 0, 4, raw) }.unwrap();
            res.completion_lazy(b.stream()).unwrap().await
        }));
    }
    for t in tasks {
        let r = tokio::time::timeout(GUARD, t).await.expect("hang").unwrap();
        assert_eq!(r, Ok(()));
    }
    assert_eq!(res.parked_points(), 0);
    for b in blocks.into_iter().chain([big]) {
        drop(res.deallocate(b).unwrap());
    }
    tokio::time::timeout(GUARD, res.reap_pending())
        .await
        .expect("hang")
        .unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
}
