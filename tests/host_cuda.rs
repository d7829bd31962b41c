//! The pinned host pool on a real GPU: what goes in comes back, and a
//! block a late copy still writes is never handed to anyone else. Run on
//! the GPU machine with `--include-ignored` (scripts/gpu-run.sh suites).

use streamalloc::AsyncResource;
use streamalloc::{AllocTag, Device, ResourceError};
use streamalloc::{HostPool, HostPoolConfig};

const TAG: AllocTag = AllocTag("host-cuda");
/// Copies of this many bytes queued first keep the stream busy.
const SLOW: usize = 512 << 20;
const LEN: usize = 4 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU"]
async fn pinned_round_trip_returns_what_went_in_and_reuses_the_block() {
    let device = Device::open_cuda(0, 1).expect("a CUDA device");
    let res = AsyncResource::on(&device).unwrap();
    let pool = HostPool::new(&device, HostPoolConfig::new());
    let s = device.stream(0).unwrap();

    for round in 0..4u32 {
        let mut input = pool.allocate::<u32>(LEN, TAG).unwrap();
        for (i, v) in input.as_mut_slice().unwrap().iter_mut().enumerate() {
            *v = i as u32 ^ round;
        }
        let mut x = res.allocate_buffer::<u32>(LEN, s, TAG).await.unwrap();
        res.copy_to_device(&input, &mut x, s)
            .unwrap()
            .await
            .unwrap();
        let mut y = res.allocate_buffer::<u32>(LEN, s, TAG).await.unwrap();
        y.copy_from_on(s, &x).unwrap();
        let mut output = pool.allocate::<u32>(LEN, TAG).unwrap();
        res.copy_to_host(&y, &mut output, s).unwrap().await.unwrap();
        assert_eq!(output.as_slice().unwrap(), input.as_slice().unwrap());
    }
    let stats = pool.stats();
    assert_eq!(stats.pins, 2, "two blocks pinned, then reused: {stats:?}");
    assert_eq!(stats.reuses, 6);
    assert_eq!(pool.trim().unwrap(), 2 * 4 * LEN);
}

/// A copy to the host queued behind slow work; its future and its buffer
/// dropped at once. The next request of the same size must get another
/// block: had the pool handed the same one out, the late copy would
/// overwrite what the new owner wrote, and the read-back tells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU"]
async fn a_block_a_late_copy_writes_is_never_handed_on() {
    let device = Device::open_cuda(0, 1).expect("a CUDA device");
    let res = AsyncResource::on(&device).unwrap();
    let pool = HostPool::new(&device, HostPoolConfig::new());
    let s = device.stream(0).unwrap();
    let src = res.allocate_buffer::<u8>(SLOW, s, TAG).await.unwrap();
    let mut dst = res.allocate_buffer::<u8>(SLOW, s, TAG).await.unwrap();
    let mut dev = res.allocate_buffer::<u8>(LEN, s, TAG).await.unwrap();
    dev.fill_bytes_on(s, 0xAB).unwrap();

    // Some 10-20 ms of copies ahead of the late one: far longer than the
    // drop and the next allocation take.
    for _ in 0..16 {
        dst.copy_from_on(s, &src).unwrap();
    }
    let mut late = pool.allocate::<u8>(LEN, TAG).unwrap();
    let copy = res.copy_to_host(&dev, &mut late, s).unwrap();
    drop(copy);
    assert!(matches!(
        late.as_slice(),
        Err(ResourceError::HostBufferBusy { .. })
    ));
    drop(late);

    let mut next = pool.allocate::<u8>(LEN, TAG).unwrap();
    assert_eq!(pool.stats().pins, 2, "the pending block was not handed out");
    next.as_mut_slice().unwrap().fill(0x11);
    res.completion(s).unwrap().await.unwrap();
    assert!(
        next.as_slice().unwrap().iter().all(|&b| b == 0x11),
        "a late copy wrote a block handed on"
    );
    // The late copy's block came back to the pool once seen complete.
    assert_eq!(pool.stats().pending_bytes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU"]
async fn a_dropped_copy_future_proves_nothing_until_ready() {
    let device = Device::open_cuda(0, 1).expect("a CUDA device");
    let res = AsyncResource::on(&device).unwrap();
    let pool = HostPool::new(&device, HostPoolConfig::new());
    let s = device.stream(0).unwrap();
    let src = res.allocate_buffer::<u8>(SLOW, s, TAG).await.unwrap();
    let mut dst = res.allocate_buffer::<u8>(SLOW, s, TAG).await.unwrap();
    let mut dev = res.allocate_buffer::<u8>(LEN, s, TAG).await.unwrap();
    dev.fill_bytes_on(s, 0x5A).unwrap();
    dst.copy_from_on(s, &src).unwrap();

    let mut out = pool.allocate::<u8>(LEN, TAG).unwrap();
    drop(res.copy_to_host(&dev, &mut out, s).unwrap());
    assert_eq!(out.pending_copies(), 1);
    out.ready().await.unwrap();
    assert!(out.as_slice().unwrap().iter().all(|&b| b == 0x5A));
}
