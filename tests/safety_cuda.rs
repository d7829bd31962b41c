//! The shortcuts of the ordering rules on a real GPU: a request cancelled
//! while its kernel runs must not let another stream's work reach memory
//! the late kernel still writes. Run on the GPU machine with
//! `--include-ignored`, and under compute-sanitizer (scripts/gpu-call.sh).

use std::time::Duration;

use streamalloc::futures::AsyncResource;
use streamalloc::{AllocTag, CacheConfig, CudaBuffer, Device, ResourceBuilder};

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
