//! Seeded soak: many tasks allocate (some giving up while queued), use
//! blocks across streams, await or drop completions and frees. Whatever the
//! interleaving: every kept task finishes, the race detector stays silent,
//! and every byte comes back.

use crate::support;

use std::sync::Arc;

use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{Access, AllocTag, ResourceResult};

const BLOCK: usize = 4096;
const TAG: AllocTag = AllocTag("soak");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_soak_keeps_every_invariant() {
    for seed in 0..support::scaled(4, 1) as u64 {
        let gpu = SimGpu::builder().capacity(6 * BLOCK).seed(seed).build();
        let f = support::sim_with(gpu, 3);
        let gpu = f.sim.clone().unwrap();
        let res = Arc::new(support::async_resource(&f));
        let streams = f.streams.clone();
        let mut tasks = Vec::new();
        for t in 0..support::scaled(48, 12) as u64 {
            let (res, gpu, pool) = (res.clone(), gpu.clone(), f.pool.clone());
            let streams = streams.clone();
            tasks.push(tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(seed * 1000 + t);
                let s = streams[rng.usize(..streams.len())];
                let alloc = res.allocate(BLOCK * rng.usize(1..=2), s, TAG);
                // Some tasks give up on the wait after one yield.
                let block = if rng.bool() {
                    tokio::select! {
                        b = alloc => b?,
                        _ = tokio::task::yield_now() => return ResourceResult::Ok(false),
                    }
                } else {
                    alloc.await?
                };
                gpu.launch_kernel(pool.raw(s)?, &[MemAccess::write(&block)])
                    .unwrap();
                let done = res.finish_block_use(block.id(), s, Access::Write)?;
                if rng.bool() {
                    done.await?;
                }
                // A read on another stream, ordered by the hooks.
                let other = streams[rng.usize(..streams.len())];
                res.prepare_block_use(block.id(), other, Access::Read)?;
                gpu.launch_kernel(pool.raw(other)?, &[MemAccess::read(&block)])
                    .unwrap();
                let read = res.finish_block_use(block.id(), other, Access::Read)?;
                if rng.bool() {
                    read.await?;
                }
                let free = res.deallocate(block)?;
                if rng.bool() {
                    free.await?;
                }
                Ok(true)
            }));
        }
        let mut served = 0;
        for t in tasks {
            let r = tokio::time::timeout(support::guard(30), t)
                .await
                .expect("hang guard")
                .unwrap();
            served += usize::from(r.unwrap());
        }
        eprintln!("seed {seed}: {served} of 48 tasks served");
        assert!(served > 0);
        res.reap_pending().await.unwrap();
        assert_eq!(res.bytes_outstanding(), 0, "seed {seed}");
        assert_eq!(res.waiting_allocations(), 0);
        assert_eq!(res.parked_points(), 0);
        assert!(gpu.races().is_empty(), "seed {seed}: {:?}", gpu.races());
    }
}
