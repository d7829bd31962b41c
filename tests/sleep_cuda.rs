//! Sleep and wake on a real GPU: 1.5 GiB of "weights" (offloaded) and
//! 512 MiB of a KV-cache-like region (discarded) put to sleep give their
//! memory back to the device (`cuMemGetInfo`), and after the wake the
//! weights read back bit for bit, three times: first with the offloads
//! pinned per block (the sleep pins, the wake unpins), then twice
//! borrowing from a `HostPool` (the last sleep pins nothing, and no wake
//! unpins). Prints the times of each sleep and wake, then the last ones
//! beside the same memory freed, allocated again and copied in again.
//! Run on the GPU machine with `--include-ignored --nocapture`
//! (`scripts/gpu-run.sh sleep DIR`, then `sleep-run DIR` there).

#![cfg(all(feature = "cuda", feature = "tokio"))]

use std::time::Instant;

use streamalloc::AsyncResource;
use streamalloc::{AllocTag, Device, ResourceBuilder, ResourceError};
use streamalloc::{CacheConfig, SleepMode, SleepPlan};
use streamalloc::{HostPool, HostPoolConfig};

const WEIGHTS: AllocTag = AllocTag("weights");
const KV: AllocTag = AllocTag("kv");
const MIB: usize = 1 << 20;
/// One block of weights, in `u32`s (256 MiB).
const BLOCK: usize = 64 * MIB;
const WEIGHT_BLOCKS: usize = 6;
const KV_BLOCKS: usize = 2;

fn pattern(block: usize, i: usize) -> u32 {
    (i as u32).wrapping_mul(2_654_435_761) ^ (block as u32) << 28
}

fn free_bytes(res: &AsyncResource<impl streamalloc::DeviceMemoryResource + 'static>) -> usize {
    res.gpu().mem_info().expect("cuMemGetInfo").0
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU"]
async fn weights_and_kv_sleep_give_memory_back_and_wake_restores_the_weights() {
    let device = Device::open_cuda(0, 1).expect("a CUDA device");
    let res = AsyncResource::build(
        &device,
        &ResourceBuilder::new().cache(CacheConfig::default()),
    )
    .unwrap();
    let pool = HostPool::new(&device, HostPoolConfig::new());
    let s = device.stream(0).unwrap();
    let bytes = |n: usize| n * BLOCK * 4;

    let mut staging = pool.allocate::<u32>(BLOCK, WEIGHTS).unwrap();
    let mut weights = Vec::new();
    for b in 0..WEIGHT_BLOCKS {
        for (i, v) in staging.as_mut_slice().unwrap().iter_mut().enumerate() {
            *v = pattern(b, i);
        }
        let mut w = res.allocate_buffer::<u32>(BLOCK, s, WEIGHTS).await.unwrap();
        res.copy_to_device(&staging, &mut w, s)
            .unwrap()
            .await
            .unwrap();
        weights.push(w);
    }
    let mut kv = Vec::new();
    for _ in 0..KV_BLOCKS {
        let mut k = res.allocate_buffer::<u32>(BLOCK, s, KV).await.unwrap();
        k.fill_bytes_on(s, 0x5A).unwrap();
        kv.push(k);
    }
    res.completion(s).unwrap().await.unwrap();
    let slept_bytes = bytes(WEIGHT_BLOCKS + KV_BLOCKS);

    // Cycle 0 pins the offloads per block at the sleep and unpins them in
    // the wake (no lender); cycles 1 and 2 borrow them from the pool: the
    // first of those pins, the second reuses what it gave back, and
    // neither wake unpins.
    let per_block = SleepPlan::new()
        .tag(WEIGHTS, SleepMode::Offload)
        .tag(KV, SleepMode::Discard);
    let pooled = per_block.clone().offload_to(pool.clone());
    let mut out = pool.allocate::<u32>(BLOCK, WEIGHTS).unwrap();
    let (mut sleep_time, mut wake_time) = (Default::default(), Default::default());
    for (cycle, plan) in [&per_block, &pooled, &pooled].into_iter().enumerate() {
        let pins = pool.stats().pins;
        let (free_awake, held_awake) = (free_bytes(&res), res.inner().physical_bytes());
        let t = Instant::now();
        res.sleep(plan).await.unwrap();
        sleep_time = t.elapsed();
        let (free_asleep, held_asleep) = (free_bytes(&res), res.inner().physical_bytes());
        println!(
            "cycle {cycle} ({}): sleep: {:.1} ms for {:.2} GiB ({:.2} GiB offloaded, {:.2} GiB discarded, \
             {} new pool pins); cuMemGetInfo free {:.2} -> {:.2} GiB (+{:.2}), arena holds \
             {:.2} -> {:.2} GiB",
            if cycle == 0 {
                "pinned per block"
            } else {
                "host pool"
            },
            sleep_time.as_secs_f64() * 1e3,
            gib(slept_bytes),
            gib(bytes(WEIGHT_BLOCKS)),
            gib(bytes(KV_BLOCKS)),
            pool.stats().pins - pins,
            gib(free_awake),
            gib(free_asleep),
            gib(free_asleep.saturating_sub(free_awake)),
            gib(held_awake),
            gib(held_asleep),
        );
        assert!(
            free_asleep >= free_awake + slept_bytes * 9 / 10,
            "the device got {} B back of {slept_bytes} B",
            free_asleep.saturating_sub(free_awake)
        );
        if cycle == 2 {
            assert_eq!(
                pool.stats().pins,
                pins,
                "the second pooled sleep pins nothing"
            );
        }
        assert!(matches!(
            res.copy_to_host(&weights[0], &mut out, s),
            Err(ResourceError::BlockAsleep { .. })
        ));

        let t = Instant::now();
        res.wake().await.unwrap();
        wake_time = t.elapsed();
        let free_woken = free_bytes(&res);
        println!(
            "cycle {cycle}: wake: {:.1} ms (maps {:.2} GiB, copies {:.2} GiB back); \
             cuMemGetInfo free {:.2} GiB; host pool idle {:.2} GiB",
            wake_time.as_secs_f64() * 1e3,
            gib(slept_bytes),
            gib(bytes(WEIGHT_BLOCKS)),
            gib(free_woken),
            gib(pool.stats().idle_bytes),
        );
        assert!(free_woken + slept_bytes * 9 / 10 <= free_asleep);
        for (b, w) in weights.iter().enumerate() {
            res.copy_to_host(w, &mut out, s).unwrap().await.unwrap();
            let got = out.as_slice().unwrap();
            let bad = (0..BLOCK).find(|&i| got[i] != pattern(b, i));
            assert_eq!(bad, None, "weights block {b} differs after wake {cycle}");
        }
        for k in &mut kv {
            // Usable again (its contents are undefined).
            k.fill_bytes_on(s, 0).unwrap();
        }
        res.completion(s).unwrap().await.unwrap();
    }

    // The same without sleep, beside the second cycle: copy the weights
    // out into the pool's pinned memory (warm, as the sleep's was), free
    // everything and give it back to the device; then allocate again and
    // copy back in.
    let t = Instant::now();
    let mut host: Vec<_> = (0..WEIGHT_BLOCKS)
        .map(|_| pool.allocate::<u32>(BLOCK, WEIGHTS).unwrap())
        .collect();
    for (w, h) in weights.iter().zip(host.iter_mut()) {
        res.copy_to_host(w, h, s).unwrap().await.unwrap();
    }
    drop(weights);
    drop(kv);
    res.reap_pending().await.unwrap();
    res.completion(s).unwrap().await.unwrap();
    res.inner().trim().unwrap();
    res.completion(s).unwrap().await.unwrap();
    res.inner().trim().unwrap();
    let free_time = t.elapsed();
    let free_freed = free_bytes(&res);
    let t = Instant::now();
    let mut again = Vec::new();
    for h in &host {
        let mut w = res.allocate_buffer::<u32>(BLOCK, s, WEIGHTS).await.unwrap();
        res.copy_to_device(h, &mut w, s).unwrap().await.unwrap();
        again.push(w);
    }
    for _ in 0..KV_BLOCKS {
        again.push(res.allocate_buffer::<u32>(BLOCK, s, KV).await.unwrap());
    }
    res.completion(s).unwrap().await.unwrap();
    let realloc_time = t.elapsed();
    println!(
        "baseline: copy out (pooled) + free + trim {:.1} ms (cuMemGetInfo free {:.2} GiB); \
         allocate + copy in {:.1} ms",
        free_time.as_secs_f64() * 1e3,
        gib(free_freed),
        realloc_time.as_secs_f64() * 1e3,
    );
    println!(
        "last cycle (pooled, warm): sleep / (copy out + free): {:.2}; wake / (allocate + copy in): {:.2}",
        sleep_time.as_secs_f64() / free_time.as_secs_f64(),
        wake_time.as_secs_f64() / realloc_time.as_secs_f64(),
    );
}
