//! Safe means safe, on a real GPU: a request cancelled while its kernel
//! runs must not let another stream's work reach memory the late kernel
//! still writes, and a stream of another pool (or one made by hand) never
//! reaches the driver through a safe call. Run on the GPU machine with
//! `--include-ignored`, and under compute-sanitizer (scripts/gpu-call.sh).

use std::sync::Arc;
use std::time::Duration;

use streamalloc::AsyncResource;
use streamalloc::{
    Access, AllocTag, Buffer, CacheConfig, CudaBuffer, Device, ResourceBuilder, ResourceError,
    ResourceResult, StreamId,
};

const TAG: AllocTag = AllocTag("safety");
/// The slow part of the cancelled request: copies of this many bytes.
const SLOW: usize = 512 << 20;
/// The buffer the cancelled request writes last, and the next one takes.
const X: usize = 4 << 20;

/// A handler cancelled while awaiting its launch (a timeout, an abort)
/// drops the completion future, then its buffer, with the launch still
/// queued behind slow copies. Another stream then takes memory of the
/// same size and fills it. Had the dropped future been read as "done", the
/// range would change streams with no wait, the fill would run first, and
/// the late launch's memset would overwrite it: the read-back tells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU"]
async fn a_cancelled_request_never_lets_a_late_write_reach_memory_handed_on() {
    let device = Device::open_cuda(0, 2).expect("a CUDA device");
    let layers = ResourceBuilder::new().cache(CacheConfig::default());
    let res = AsyncResource::build(&device, &layers).expect("the stack");
    let gpu = res.gpu().clone();
    let (s0, s1) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    let src = res.allocate_buffer::<u8>(SLOW, s0, TAG).await.unwrap();
    let mut dst = res.allocate_buffer::<u8>(SLOW, s0, TAG).await.unwrap();
    let mut reused = 0;
    for round in 0..8 {
        let mut x = res.allocate_buffer::<u8>(X, s0, TAG).await.unwrap();
        let (sp, dp, xp) = (src.block().ptr(), dst.block().ptr(), x.block().ptr());
        let ((), done) = res
            .launch(s0)
            .read(&src)
            .write(&mut dst)
            .write(&mut x)
            .enqueue(|raw| {
                for _ in 0..4 {
                    // SAFETY: `raw` is a stream of the resource's pool; both
                    // ranges are live buffers declared by this launch.
                    unsafe { gpu.copy_async(dp, sp, SLOW, raw) }
                        .map_err(|e| e.for_request(SLOW, s0))?;
                }
                // SAFETY: as above; `x` is declared written.
                unsafe { gpu.memset_async(xp, 0xAA, X, raw) }.map_err(|e| e.for_request(X, s0))
            })
            .unwrap();
        // Cancelled: the future goes, then the buffer, the launch queued.
        drop(done);
        drop(x);
        let mut y = res.allocate_buffer::<u8>(X, s1, TAG).await.unwrap();
        reused += usize::from(y.block().ptr() == xp);
        y.fill_bytes_on(s1, 0x55).unwrap();
        res.completion(s1).unwrap().await.unwrap();
        // Everything the cancelled request queued has run too.
        tokio::time::timeout(Duration::from_secs(30), res.completion(s0).unwrap())
            .await
            .expect("stream 0 finished")
            .unwrap();
        let y = CudaBuffer::new(y).unwrap();
        let stream = device.streams().cuda_stream(s1).unwrap().clone();
        let back = stream.clone_dtoh(&y).unwrap();
        stream.synchronize().unwrap();
        let wrong = back.iter().filter(|&&b| b != 0x55).count();
        assert_eq!(
            wrong, 0,
            "round {round}: the late write reached {wrong} bytes handed on"
        );
    }
    println!(
        "cuda: 8 cancelled requests, the next stream took the same address {reused} times, every byte its own"
    );
    drop((src, dst));
    res.reap_pending().await.unwrap();
}

/// Reads `buf` back through its own stream.
fn read_back(device: &Device<streamalloc::gpu::cuda::CudaGpu>, buf: Buffer<u8>) -> Vec<u8> {
    let s = buf.block().stream();
    let buf = CudaBuffer::new(buf).unwrap();
    let stream = device.streams().cuda_stream(s).unwrap().clone();
    let back = stream.clone_dtoh(&buf).unwrap();
    stream.synchronize().unwrap();
    back
}

/// Two `Device`s of CUDA device 0 (two stream pools on one context), a
/// cached stack on the first, a live buffer of the second's resource
/// filled with a pattern. Every safe entry point given a stream of the
/// second pool, or a `StreamId` made by hand, answers `ForeignStream`,
/// queues nothing, and the other resource's live bytes stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU"]
async fn streams_the_crate_cannot_vouch_for_never_reach_the_driver() {
    let a = Device::open_cuda(0, 2).expect("a CUDA device");
    let b = Device::open_cuda(0, 2).expect("a second pool");
    let layers = ResourceBuilder::new().cache(CacheConfig::default());
    let res = AsyncResource::build(&a, &layers).expect("the stack on a");
    let other = AsyncResource::on(&b).expect("a resource on b");
    let (sa, sb) = (a.stream(0).unwrap(), b.stream(0).unwrap());
    let mut victim = other.allocate_buffer::<u8>(1 << 20, sb, TAG).await.unwrap();
    victim.fill_bytes_on(sb, 0x11).unwrap();
    let mut held = res.allocate_buffer::<u8>(1 << 20, sa, TAG).await.unwrap();
    let source = res.allocate_buffer::<u8>(1 << 20, sa, TAG).await.unwrap();
    let before = res.bytes_outstanding();
    let mut refused = 0;
    for bad in [sb, StreamId::new(0, 0)] {
        let foreign = |r: ResourceResult<()>, what: &str| match r {
            Err(ResourceError::ForeignStream { stream }) => assert_eq!(stream, bad, "{what}"),
            other => panic!("{what} on {bad}: {other:?}"),
        };
        foreign(res.try_allocate(64, bad, TAG).map(drop), "try_allocate");
        foreign(held.fill_bytes_on(bad, 0xEE), "fill_bytes_on");
        foreign(held.copy_from_on(bad, &source), "copy_from_on");
        foreign(held.write_on(bad).map(drop), "write_on");
        foreign(
            res.prepare_block_use(held.id(), bad, Access::Write),
            "prepare_block_use",
        );
        foreign(res.completion(bad).map(drop), "completion");
        foreign(
            Buffer::<u8>::allocate_in(Arc::clone(res.inner()), &a, 64, bad, TAG).map(drop),
            "Buffer::allocate_in",
        );
        let mut ran = false;
        foreign(
            res.launch(bad)
                .write(&mut held)
                .enqueue(|_| {
                    ran = true;
                    Ok::<(), ResourceError>(())
                })
                .map(drop),
            "launch",
        );
        assert!(!ran, "a launch closure ran on {bad}");
        refused += 8;
    }
    // A resource of `a` used with `b`'s device: refused for both pools.
    for s in [sa, sb] {
        let r = Buffer::<u8>::allocate_in(Arc::clone(res.inner()), &b, 64, s, TAG);
        assert!(
            matches!(r, Err(ResourceError::ForeignStream { .. })),
            "{:?}",
            r.map(drop)
        );
        refused += 1;
    }
    assert_eq!(
        res.bytes_outstanding(),
        before,
        "a refused call changed the books"
    );
    let back = read_back(&b, victim);
    assert!(
        back.iter().all(|&v| v == 0x11),
        "the other resource's bytes changed"
    );
    println!(
        "cuda: {refused} calls with streams of another pool or made by hand refused (ForeignStream), the other resource's live 1 MiB intact"
    );
    drop((held, source));
    res.reap_pending().await.unwrap();
    other.reap_pending().await.unwrap();
}
