//! Time on the simulated device: kernels one at a time by default, side
//! by side on several streams with `concurrent_kernels`; host functions
//! after a latency on a callback thread with `host_fn_latency`.

use std::time::{Duration, Instant};

use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::SimGpu;

const LATENCY: Duration = Duration::from_millis(150);
/// A hang guard, never a timing assertion.
const GUARD: Duration = Duration::from_secs(20);

/// The most kernels seen running at once while `streams` streams each run
/// one kernel, and the time until all were done.
fn run_one_kernel_per_stream(gpu: &SimGpu, streams: usize) -> (usize, Duration) {
    let start = Instant::now();
    let handles: Vec<_> = (0..streams).map(|_| gpu.create_stream()).collect();
    for &s in &handles {
        gpu.launch_kernel(s, &[]).unwrap();
    }
    let mut most = 0;
    while !gpu.is_idle() {
        most = most.max(gpu.kernels_running());
        assert!(start.elapsed() < GUARD, "the kernels never ended");
        std::thread::sleep(Duration::from_millis(1));
    }
    (most, start.elapsed())
}

#[test]
fn kernels_of_several_streams_run_side_by_side_up_to_the_limit() {
    let gpu = SimGpu::builder()
        .op_latency(LATENCY)
        .concurrent_kernels(2)
        .build();
    let (most, took) = run_one_kernel_per_stream(&gpu, 3);
    // Two at once, never three: the third waited for a slot, so the whole
    // took two kernels' time at least.
    assert_eq!(most, 2);
    assert!(took >= 2 * LATENCY, "{took:?}");
}

/// The one-at-a-time engine: a stream whose last operation is a kernel is
/// not idle before the kernel's time is up (it used to look done from the
/// kernel's start: the sleep delayed what came next, not the kernel's end).
#[test]
fn by_default_kernels_run_one_at_a_time_and_end_after_their_time() {
    let gpu = SimGpu::builder().op_latency(LATENCY).build();
    let (most, took) = run_one_kernel_per_stream(&gpu, 2);
    assert_eq!(most, 0, "the default engine has no kernels side by side");
    assert!(took >= 2 * LATENCY, "{took:?}");
}

/// What follows a kernel on its stream (here an event's record) runs only
/// once the kernel's time is up, while another stream goes on meanwhile.
#[test]
fn a_stream_goes_on_only_after_its_kernel_while_others_run() {
    let gpu = SimGpu::builder()
        .op_latency(LATENCY)
        .concurrent_kernels(4)
        .build();
    let (a, b) = (gpu.create_stream(), gpu.create_stream());
    let (after_kernel, on_b) = (gpu.event_create().unwrap(), gpu.event_create().unwrap());
    let start = Instant::now();
    gpu.launch_kernel(a, &[]).unwrap();
    gpu.event_record(after_kernel, a).unwrap();
    gpu.event_record(on_b, b).unwrap();
    gpu.event_synchronize(on_b).unwrap();
    gpu.event_synchronize(after_kernel).unwrap();
    assert!(start.elapsed() >= LATENCY);
    gpu.run_until_idle();
    assert!(gpu.races().is_empty());
}

/// With a host-function latency, a host function runs on the callback
/// thread no earlier than the latency after its stream reached it; its
/// stream waits for it, another stream goes on meanwhile. (Each check on
/// the clock is a lower bound: a stalled test thread only skips one.)
#[test]
fn host_functions_come_after_their_latency_while_other_streams_go_on() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    const HOST_FN: Duration = Duration::from_millis(300);
    let gpu = SimGpu::builder().host_fn_latency(HOST_FN).build();
    let (a, b) = (gpu.create_stream(), gpu.create_stream());
    let ran = Arc::new(AtomicBool::new(false));
    let ran_at = Arc::new(std::sync::Mutex::new(None));
    let start = Instant::now();
    {
        let (ran, ran_at) = (ran.clone(), ran_at.clone());
        gpu.launch_host_fn(
            a,
            Box::new(move || {
                *ran_at.lock().unwrap() = Some(Instant::now());
                ran.store(true, Ordering::SeqCst);
            }),
        )
        .unwrap();
    }
    let on_b = gpu.event_create().unwrap();
    gpu.event_record(on_b, b).unwrap();
    gpu.event_synchronize(on_b).unwrap();
    let asked = Instant::now();
    let a_idle = gpu.stream_query(a).unwrap();
    if asked - start < HOST_FN {
        assert!(!a_idle, "stream a waits for its host function");
        assert!(
            !ran.load(Ordering::SeqCst),
            "b went on before a's host function"
        );
    }
    gpu.stream_synchronize(a).unwrap();
    let at = ran_at.lock().unwrap().expect("the host function ran");
    assert!(at - start >= HOST_FN, "{:?}", at - start);
    assert!(gpu.races().is_empty());
}
