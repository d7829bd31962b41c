//! The Reaper: frees nobody awaits reach the accounting; shutdown drains.

mod common;

use common::bounded::BoundedExt;

use std::time::Duration;

use streamalloc::AllocTag;
use streamalloc::Reaper;
use streamalloc::gpu::sim::{MemAccess, SimGpu};

const BLOCK: usize = 4096;
const TAG: AllocTag = AllocTag("reaper");
const GUARD: Duration = common::guard(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_frees_nobody_awaited() {
    let gpu = SimGpu::builder()
        // Under Miri fewer, longer kernels: the frees must still wait when
        // the loop ends.
        .op_latency(if cfg!(miri) {
            Duration::from_secs(1)
        } else {
            Duration::from_micros(200)
        })
        .build();
    let f = common::sim_with(gpu, 4);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let reaper = Reaper::spawn(&res);
    for i in 0..common::scaled(200, 16) {
        let s = f.stream(i % 4);
        let b = res.try_allocate(BLOCK, s, TAG).unwrap();
        gpu.launch_kernel(f.pool.raw(s).unwrap(), &[MemAccess::write(&b)])
            .unwrap();
        drop(res.deallocate(b).unwrap());
    }
    assert!(
        res.bytes_outstanding() > 0,
        "frees wait behind slow kernels"
    );
    let r = tokio::time::timeout(GUARD, reaper.shutdown()).await;
    assert_eq!(r.expect("hang"), Ok(()));
    assert_eq!(res.bytes_outstanding(), 0);
    assert_eq!(
        res.inner().pending_free_bytes(),
        res.inner().pending_per_stream_total()
    );
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_serves_allocations_waiting_on_other_streams() {
    let gpu = SimGpu::builder().capacity(4 * BLOCK).build();
    let f = common::sim_with(gpu, 2);
    let res = common::async_resource(&f);
    let reaper = Reaper::spawn(&res);
    let (s0, s1) = (f.stream(0), f.stream(1));
    let mut served = 0;
    let rounds = common::scaled(20, 3);
    for _round in 0..rounds {
        let held: Vec<_> = (0..4)
            .map(|_| res.try_allocate(BLOCK, s0, TAG).unwrap())
            .collect();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let res = res.clone();
                tokio::spawn(async move { res.allocate(BLOCK, s1, TAG).bounded("allocate").await })
            })
            .collect();
        for b in held {
            drop(res.deallocate(b).unwrap());
        }
        for w in waiters {
            let b = tokio::time::timeout(GUARD, w)
                .await
                .expect("hang")
                .unwrap()
                .unwrap();
            served += 1;
            drop(res.deallocate(b).unwrap());
        }
        res.reap_pending().bounded("reap_pending").await.unwrap();
    }
    assert_eq!(served, 4 * rounds);
    assert_eq!(res.bytes_outstanding(), 0);
    reaper.shutdown().await.unwrap();
}
