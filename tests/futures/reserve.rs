//! Reservations (a request's memory as one unit) and the hold-and-wait
//! verdict, on the simulated device.

use std::future::Future;
use std::time::Duration;

use streamalloc::AsyncResource;
use streamalloc::Budget;
use streamalloc::CacheConfig;
use streamalloc::ResourceBuilder;
use streamalloc::{AllocTag, Device, ResourceError, StreamId, gpu::sim::SimGpu};

const MIB: usize = 1 << 20;
const TAG: AllocTag = AllocTag("request");
/// Generous: every scenario here ends in milliseconds, or hangs.
const HANG: Duration = Duration::from_secs(20);

/// A plain stream-ordered resource under a budget of `limit` bytes.
fn budgeted(
    limit: usize,
    streams: usize,
) -> (
    Device,
    AsyncResource<impl streamalloc::DeviceMemoryResource + 'static>,
) {
    let device = Device::sim(&SimGpu::new(), streams);
    let budget = Budget::new(limit);
    let layers = ResourceBuilder::new().budget(&budget);
    let res = AsyncResource::build(&device, &layers).unwrap();
    // Off by default (it judges ownership by task); these tests' tasks
    // free what they allocate.
    res.set_hold_and_wait_check(true);
    (device, res)
}

/// One request of the service: input, then activations, then
/// output, each awaited on its own, then some work, then everything freed.
async fn request_piecewise<R: streamalloc::DeviceMemoryResource + 'static>(
    res: AsyncResource<R>,
    s: StreamId,
) -> Result<(), ResourceError> {
    let input = res.allocate_buffer::<u8>(MIB, s, AllocTag("input")).await?;
    tokio::task::yield_now().await;
    let activations = res
        .allocate_buffer::<u8>(MIB, s, AllocTag("activations"))
        .await?;
    tokio::task::yield_now().await;
    let output = res
        .allocate_buffer::<u8>(MIB, s, AllocTag("output"))
        .await?;
    tokio::task::yield_now().await;
    drop((input, activations, output));
    Ok(())
}

/// The same request with its memory reserved as one unit.
async fn request_reserved<R: streamalloc::DeviceMemoryResource + 'static>(
    res: AsyncResource<R>,
    s: StreamId,
) -> Result<(), ResourceError> {
    let mut memory = res.reserve(&[MIB, MIB, MIB], s, TAG).await?;
    let input = memory.allocate_buffer::<u8>(MIB)?;
    tokio::task::yield_now().await;
    let activations = memory.allocate_buffer::<u8>(MIB)?;
    tokio::task::yield_now().await;
    let output = memory.allocate_buffer::<u8>(MIB)?;
    tokio::task::yield_now().await;
    drop((input, activations, output, memory));
    Ok(())
}

/// The deadlock in small: 8 requests of 3 MiB each, awaited piece
/// by piece, under a budget of 5 MiB. Every request takes its input, and
/// then all wait for activations: without the verdict they wait forever.
/// With it, the newest waiter that holds memory fails with `HoldAndWait`,
/// its input comes back, and the others go on; nothing else fails and
/// nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piecewise_requests_under_a_small_budget_fail_the_newest_holder_instead_of_hanging() {
    let (device, res) = budgeted(5 * MIB, 2);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let s = device.stream(i % 2).unwrap();
            tokio::spawn(request_piecewise(res.clone(), s))
        })
        .collect();
    let results = tokio::time::timeout(HANG, async {
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    })
    .await
    .expect("the requests hung in hold-and-wait");
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(ResourceError::HoldAndWait { .. })))
        .count();
    let served = results.iter().filter(|r| r.is_ok()).count();
    assert!(refused >= 1, "{results:?}");
    assert_eq!(
        served + refused,
        8,
        "only hold-and-wait may fail: {results:?}"
    );
    assert!(served >= 1, "{results:?}");
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert_eq!(res.waiting_allocations(), 0);
}

/// The same 8 requests reserving their 3 MiB as one unit: every one is
/// served, none fails, and nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_requests_under_a_small_budget_are_all_served() {
    let (device, res) = budgeted(5 * MIB, 2);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let s = device.stream(i % 2).unwrap();
            tokio::spawn(request_reserved(res.clone(), s))
        })
        .collect();
    tokio::time::timeout(HANG, async {
        for t in tasks {
            t.await.unwrap().unwrap();
        }
    })
    .await
    .expect("reserved requests hung");
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert_eq!(res.waiting_allocations(), 0);
}

/// The same, over a cache: the reservation's blocks are the cache's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_requests_over_a_cache_are_all_served() {
    let gpu = SimGpu::new();
    let device = Device::sim(&gpu, 2);
    let budget = Budget::new(16 * MIB);
    let layers = ResourceBuilder::new()
        .budget(&budget)
        .cache(CacheConfig::default());
    let res = AsyncResource::build(&device, &layers).unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let s = device.stream(i % 2).unwrap();
            tokio::spawn(request_reserved(res.clone(), s))
        })
        .collect();
    tokio::time::timeout(HANG, async {
        for t in tasks {
            t.await.unwrap().unwrap();
        }
    })
    .await
    .expect("reserved requests hung");
    assert_eq!(res.waiting_allocations(), 0);
    // The budget above the cache admits every page a growth maps before
    // it is mapped: the device never held more than the limit, and the
    // budget never counted more (once the loser of a race for a free range
    // grew past the limit, and kept the page; see
    // `tests/cache/budget_above.rs`).
    assert!(
        gpu.peak_held_bytes() <= budget.limit(),
        "the device held {} under a budget of {}",
        gpu.peak_held_bytes(),
        budget.limit()
    );
    assert!(
        budget.peak() <= budget.limit(),
        "the budget counted {}",
        budget.peak()
    );
    assert!(budget.in_use() <= budget.limit());
}

/// A budget above a cache whose first growth would map ahead past the
/// budget's limit (7% of 100 MiB is 3 pages of 2 MiB, one more than the
/// budget has room for): the growth maps ahead only inside the room, the
/// reservation's second block lands on the pages mapped ahead of its
/// first, and the first try serves it. Once the growth mapped past the
/// limit and the cost counted only idle mappings (those pages share the
/// live first block's handle), so the budget, past its limit, refused the
/// second block; the try gave the first back and waited, and every later
/// try found the same: a reservation never served though no block was
/// live.
#[tokio::test]
async fn a_reservation_over_a_cache_that_mapped_ahead_past_the_budget_is_served() {
    use streamalloc::DriverCall;
    let gpu = SimGpu::new();
    let device = Device::sim(&gpu, 1);
    let budget = Budget::new(104 * MIB);
    let layers = ResourceBuilder::new()
        .budget(&budget)
        .cache(CacheConfig::default());
    let res = AsyncResource::build(&device, &layers).unwrap();
    let s = device.stream(0).unwrap();
    let mut reserving = Box::pin(res.reserve(&[100 * MIB, 4 * MIB], s, TAG));
    let waker = futures_noop();
    let mut cx = std::task::Context::from_waker(&waker);
    let reserved = match reserving.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(reserved) => reserved.unwrap(),
        std::task::Poll::Pending => panic!(
            "the first try was refused with no other block live: the budget \
             counts {} of a limit of {}, the cache holds {} (all of it the \
             reservation's to use)",
            budget.in_use(),
            budget.limit(),
            res.bytes_outstanding(),
        ),
    };
    assert!(
        budget.in_use() <= budget.limit(),
        "the growth mapped ahead past the budget above"
    );
    assert_eq!(gpu.call_count(DriverCall::MemCreate), 1, "one growth");
    assert_eq!(reserved.sizes().collect::<Vec<_>>(), [100 * MIB, 4 * MIB]);
    drop(reserved);
    drop(reserving);
    res.reap_pending().await.unwrap();
    budget.release_idle();
    assert_eq!(budget.in_use(), 0, "everything comes back");
}

/// What an error must match.
type Expected = fn(&ResourceError) -> bool;

/// Bad input is refused at the first poll, before waiting, and changes
/// nothing.
#[tokio::test]
async fn bad_reservations_are_refused_and_change_nothing() {
    let (device, res) = budgeted(4 * MIB, 1);
    let s = device.stream(0).unwrap();
    let cases: [(&[usize], Expected); 4] = [
        (&[], |e| {
            matches!(e, ResourceError::EmptyReservation { index: None })
        }),
        (&[MIB, 0], |e| {
            matches!(e, ResourceError::EmptyReservation { index: Some(1) })
        }),
        (&[usize::MAX, 1], |e| {
            matches!(e, ResourceError::ReservationOverflow { sizes: 2 })
        }),
        (
            &[3 * MIB, 2 * MIB],
            |e| matches!(e, ResourceError::BudgetExceeded { requested, .. } if *requested == 5 * MIB),
        ),
    ];
    for (sizes, expected) in cases {
        let e = res.reserve(sizes, s, TAG).await.unwrap_err();
        assert!(expected(&e), "{sizes:?}: {e}");
        assert_eq!(res.bytes_outstanding(), 0);
        assert_eq!(res.waiting_allocations(), 0);
    }
}

/// Buffers come from the smallest block that holds them; asking for more
/// than any block left holds is an error that leaves the reservation as it
/// was; dropping the reservation frees what was not taken.
#[tokio::test]
async fn buffers_are_taken_best_fit_and_the_rest_is_freed_on_drop() {
    let (device, res) = budgeted(8 * MIB, 1);
    let s = device.stream(0).unwrap();
    let mut memory = res.reserve(&[2 * MIB, MIB, 2 * MIB], s, TAG).await.unwrap();
    assert_eq!(memory.stream(), s);
    assert_eq!(res.bytes_outstanding(), 5 * MIB);
    // 4 KiB of f32: the 1 MiB block, the smallest that holds it.
    let small = memory.allocate_buffer::<f32>(1024).unwrap();
    assert_eq!(memory.sizes().collect::<Vec<_>>(), [2 * MIB, 2 * MIB]);
    for bad in [3 * MIB, 0] {
        let e = memory.allocate_buffer::<u8>(bad).unwrap_err();
        assert_eq!(
            e,
            ResourceError::NotReserved {
                requested: bad,
                largest: 2 * MIB,
                left: 2
            }
        );
    }
    assert!(matches!(
        memory.allocate_buffer::<u64>(usize::MAX),
        Err(ResourceError::SizeOverflow { .. })
    ));
    assert_eq!(memory.len(), 2);
    assert_eq!(memory.bytes_left(), 4 * MIB);
    let big = memory.allocate_buffer::<u8>(2 * MIB).unwrap();
    assert_eq!(big.stream(), s);
    drop(memory);
    drop(small);
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 2 * MIB);
    drop(big);
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
}

/// A reservation waits first come first served, holding nothing while it
/// waits (a try that fits in part gives the part back); dropped while
/// waiting it strands nobody behind it.
#[tokio::test]
async fn a_waiting_reservation_holds_nothing_and_its_drop_strands_nobody() {
    let (device, res) = budgeted(4 * MIB, 1);
    let s = device.stream(0).unwrap();
    let held = res.allocate_buffer::<u8>(2 * MIB, s, TAG).await.unwrap();
    // 1 MiB + 2 MiB: the first fits, the second does not.
    let mut waiting = Box::pin(res.reserve(&[MIB, 2 * MIB], s, TAG));
    let mut behind = Box::pin(res.allocate_buffer::<u8>(MIB, s, TAG));
    let cx_waker = futures_noop();
    let mut cx = std::task::Context::from_waker(&cx_waker);
    assert!(waiting.as_mut().poll(&mut cx).is_pending());
    assert!(waiting.is_waiting());
    res.reap_pending().await.unwrap();
    assert_eq!(
        res.bytes_outstanding(),
        2 * MIB,
        "the waiting reservation holds nothing"
    );
    // First come first served: the 1 MiB behind it would fit, and waits.
    assert!(behind.as_mut().poll(&mut cx).is_pending());
    assert_eq!(res.waiting_allocations(), 2);
    drop(waiting);
    let next = tokio::time::timeout(HANG, behind).await.expect("stranded");
    let next = next.unwrap();
    drop((held, next));
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert_eq!(res.waiting_allocations(), 0);
}

/// A try allocates the largest size first: a reservation whose largest
/// block does not fit takes nothing and gives nothing back while it waits
/// (a block taken and given back is a free at its stream's end, which a
/// cache below lends to other streams only behind a wait for all of that
/// stream's work), and, served, holds its blocks in the order asked.
#[tokio::test]
async fn a_reservation_whose_largest_size_is_refused_takes_nothing() {
    use streamalloc::DriverCall;
    let gpu = SimGpu::new();
    let device = Device::sim(&gpu, 1);
    let budget = Budget::new(4 * MIB);
    let res = AsyncResource::build(&device, &ResourceBuilder::new().budget(&budget)).unwrap();
    let s = device.stream(0).unwrap();
    let held = res
        .allocate_buffer::<u8>(5 * MIB / 2, s, TAG)
        .await
        .unwrap();
    let calls = || {
        (
            gpu.call_count(DriverCall::AllocAsync),
            gpu.call_count(DriverCall::FreeAsync),
        )
    };
    let before = calls();
    // 1 MiB fits beside the 2.5 MiB held, 2 MiB does not.
    let mut waiting = Box::pin(res.reserve(&[MIB, 2 * MIB, 4096], s, TAG));
    let cx_waker = futures_noop();
    let mut cx = std::task::Context::from_waker(&cx_waker);
    assert!(waiting.as_mut().poll(&mut cx).is_pending());
    assert!(waiting.is_waiting());
    assert_eq!(
        calls(),
        before,
        "a try refused took and gave back blocks (allocations, frees)"
    );
    drop(held);
    let reserved = tokio::time::timeout(HANG, waiting)
        .await
        .expect("served once the held block is freed")
        .unwrap();
    assert_eq!(
        reserved.sizes().collect::<Vec<_>>(),
        [MIB, 2 * MIB, 4096],
        "the blocks in the order asked"
    );
    drop(reserved);
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
}

/// `allocate_buffers`: all or nothing, in the order asked.
#[tokio::test]
async fn allocate_buffers_is_all_or_nothing() {
    let (device, res) = budgeted(4 * MIB, 1);
    let s = device.stream(0).unwrap();
    let bufs = res
        .allocate_buffers::<f32>(&[1024, 256 * 1024, 16], s, TAG)
        .await
        .unwrap();
    assert_eq!(
        bufs.iter().map(|b| b.len()).collect::<Vec<_>>(),
        [1024, 256 * 1024, 16]
    );
    drop(bufs);
    let e = res
        .allocate_buffers::<u8>(&[MIB, 0], s, TAG)
        .await
        .unwrap_err();
    assert_eq!(e, ResourceError::EmptyReservation { index: Some(1) });
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
}

/// No false verdict: a task that holds memory and waits for something
/// other than memory (here a channel) keeps the waiters waiting, and they
/// are served once it lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_waits_for_something_else_is_not_hold_and_wait() {
    let (device, res) = budgeted(2 * MIB, 1);
    let s = device.stream(0).unwrap();
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let res = res.clone();
        tokio::spawn(async move {
            let b = res.allocate_buffer::<u8>(2 * MIB, s, TAG).await?;
            held_tx.send(()).unwrap();
            wait.await.unwrap();
            drop(b);
            Ok::<_, ResourceError>(())
        })
    };
    held_rx.await.unwrap();
    let waiter = {
        let res = res.clone();
        tokio::spawn(async move {
            let first = res.allocate_buffer::<u8>(MIB, s, TAG).await?;
            let second = res.allocate_buffer::<u8>(MIB, s, TAG).await?;
            drop((first, second));
            Ok::<_, ResourceError>(())
        })
    };
    // Longer than the watchdog's retries, which judge again.
    tokio::time::sleep(streamalloc::FALLBACK_PERIOD * 5).await;
    assert!(
        !waiter.is_finished(),
        "the waiter was failed or served early"
    );
    go.send(()).unwrap();
    tokio::time::timeout(HANG, async {
        holder.await.unwrap().unwrap();
        waiter.await.unwrap().unwrap();
    })
    .await
    .expect("hung");
}

/// The verdict can be turned off: then piecewise requests are not failed
/// (here they cannot deadlock: the budget fits them all).
#[tokio::test]
async fn the_verdict_can_be_turned_off() {
    let (device, res) = budgeted(64 * MIB, 1);
    res.set_hold_and_wait_check(false);
    let s = device.stream(0).unwrap();
    request_piecewise(res.clone(), s).await.unwrap();
}

/// What stream 3 paid to take the range a refused try of stream 2 gave
/// back: the waits on the GPU its allocation queued, and whether the range
/// was the one stream 1 freed.
struct TakenAfter {
    waits: u64,
    same_range: bool,
}

/// Stream 1 writes two pages and frees them (its kernel run when
/// `stream1_done`, else still queued); stream 2 has work of its own
/// queued; the budget below the cache is full (stream 3 holds the third
/// page, right after stream 1's). A reservation on stream 2 of two pages
/// and one: its first block
/// lands on stream 1's range, its second needs a growth the budget
/// refuses, and the try gives the first back, unused. Then stream 3 takes
/// two pages, writes them, and everything runs; the simulated device's
/// race detector must stay silent.
async fn stream3_takes_what_a_refused_try_gave_back(stream1_done: bool) -> TakenAfter {
    use std::sync::Arc;
    use streamalloc::gpu::sim::MemAccess;
    use streamalloc::{BudgetResource, CachingResource, DeviceMemoryResource, DriverCall};
    const P: usize = 2 * MIB;
    let gpu = SimGpu::builder().manual().build();
    let device = Device::simulated(&gpu, 3);
    let (s1, s2, s3) = (
        device.stream(0).unwrap(),
        device.stream(1).unwrap(),
        device.stream(2).unwrap(),
    );
    let raw = |s| device.raw(s).unwrap();
    let budget = Budget::new(3 * P);
    let bottom = Arc::new(streamalloc::SimResource::new(&device));
    let cache = Arc::new(CachingResource::with_config(
        BudgetResource::new(bottom, &budget),
        CacheConfig::default().max_mapping_bytes(P),
    ));
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(cache.clone(), &device) }.unwrap();
    // Stream 3's page lies after stream 1's range: the range given back
    // merges with no free neighbour, whose tags would cover for its own.
    let freed = cache.allocate(2 * P, s1, TAG).unwrap();
    let held = cache.allocate(P, s3, TAG).unwrap();
    assert_eq!(held.ptr(), freed.ptr() + 2 * P as u64);
    let at = freed.ptr();
    gpu.launch_kernel(raw(s1), &[MemAccess::write(&freed)])
        .unwrap();
    cache.deallocate(freed).unwrap();
    assert_eq!(budget.in_use(), 3 * P, "the budget is full");
    if stream1_done {
        gpu.run_until_idle();
    }
    gpu.launch_kernel(raw(s2), &[]).unwrap();

    let mut reserving = Box::pin(res.reserve(&[2 * P, P], s2, TAG));
    let waker = futures_noop();
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(
        reserving.as_mut().poll(&mut cx).is_pending(),
        "the budget refuses the second page"
    );
    drop(reserving);
    assert_eq!(cache.leased_bytes(), P, "the try gave its block back");

    let waits = gpu.call_count(DriverCall::StreamWaitEvent);
    let taken = cache.allocate(2 * P, s3, TAG).unwrap();
    let after = TakenAfter {
        waits: gpu.call_count(DriverCall::StreamWaitEvent) - waits,
        same_range: taken.ptr() == at,
    };
    gpu.launch_kernel(raw(s3), &[MemAccess::write(&taken)])
        .unwrap();
    cache.deallocate(taken).unwrap();
    cache.deallocate(held).unwrap();
    gpu.run_until_idle();
    assert_eq!(gpu.races(), [], "stream 3 raced stream 1's work");
    after
}

/// A refused try gives its blocks back as they were, not as frees of its
/// stream: stream 1's range, which the host saw stream 1 done with, serves
/// stream 3 with no wait on the GPU. Given back as a free at the end of
/// stream 2's queue, as it was, the range made stream 3 wait for all the
/// work queued on stream 2, none of which touched it (under a service's
/// full budget the streams then ran one after another on the GPU).
#[tokio::test]
async fn a_refused_try_gives_back_its_blocks_untagged_by_its_stream() {
    let taken = stream3_takes_what_a_refused_try_gave_back(true).await;
    assert!(taken.same_range, "stream 1's range serves stream 3");
    assert_eq!(
        taken.waits, 0,
        "stream 3 waited on the GPU for stream 2's work, which never touched the range"
    );
}

/// The same with stream 1's work still queued: the range given back keeps
/// stream 1's tag (the try's placement made stream 2 wait for it, which
/// does not order stream 3), so stream 3 waits for stream 1's free, and
/// the race detector, which the undo of the placement hands the range's
/// history back to, finds stream 3's write ordered after stream 1's.
#[tokio::test]
async fn a_block_given_back_unused_still_orders_the_next_user_after_the_free_before() {
    let taken = stream3_takes_what_a_refused_try_gave_back(false).await;
    assert!(taken.same_range, "stream 1's range serves stream 3");
    assert_eq!(taken.waits, 1, "one wait, for stream 1's free");
}

/// Which block of a reservation on stream 2 became a buffer written on
/// stream 2 before the reservation was dropped.
#[derive(Clone, Copy, PartialEq)]
enum Buffered {
    /// The small one: the block on stream 1's range stayed in the
    /// reservation.
    OtherBlock,
    /// As `OtherBlock`, and a use of another block was named to the
    /// resource's hooks meanwhile.
    OtherBlockAndAHookUse,
    /// The block on stream 1's range.
    StreamOnesRange,
}

/// Stream 1 writes two pages and frees them (its kernel run when
/// `stream1_done`, else still queued); stream 2 has work of its own
/// queued; stream 3 holds the page right after stream 1's range. A
/// reservation on stream 2 of two pages and one, whose first block lands
/// on stream 1's range, writes the block `buffered` says as a buffer,
/// and is dropped. Then stream 3 takes two pages, writes them, and
/// everything runs; the simulated device's race detector must stay
/// silent.
async fn stream3_takes_what_a_dropped_reservation_held(
    stream1_done: bool,
    buffered: Buffered,
) -> TakenAfter {
    use std::sync::Arc;
    use streamalloc::gpu::sim::MemAccess;
    use streamalloc::{CachingResource, DeviceMemoryResource, DriverCall};
    const P: usize = 2 * MIB;
    let gpu = SimGpu::builder().manual().build();
    let device = Device::simulated(&gpu, 3);
    let (s1, s2, s3) = (
        device.stream(0).unwrap(),
        device.stream(1).unwrap(),
        device.stream(2).unwrap(),
    );
    let raw = |s| device.raw(s).unwrap();
    let bottom = Arc::new(streamalloc::SimResource::new(&device));
    let cache = Arc::new(CachingResource::with_config(
        bottom,
        CacheConfig::default().max_mapping_bytes(P),
    ));
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(cache.clone(), &device) }.unwrap();
    let freed = cache.allocate(2 * P, s1, TAG).unwrap();
    let held = cache.allocate(P, s3, TAG).unwrap();
    assert_eq!(held.ptr(), freed.ptr() + 2 * P as u64);
    let at = freed.ptr();
    gpu.launch_kernel(raw(s1), &[MemAccess::write(&freed)])
        .unwrap();
    cache.deallocate(freed).unwrap();
    if stream1_done {
        gpu.run_until_idle();
    }
    gpu.launch_kernel(raw(s2), &[]).unwrap();

    let mut memory = res.reserve(&[2 * P, P], s2, TAG).await.unwrap();
    let size = match buffered {
        Buffered::StreamOnesRange => 2 * P,
        Buffered::OtherBlock | Buffered::OtherBlockAndAHookUse => P,
    };
    let mut used = memory.allocate_buffer::<u8>(size).unwrap();
    assert_eq!(
        used.block().ptr() == at,
        buffered == Buffered::StreamOnesRange
    );
    let block = used.block().clone();
    let ((), _done) = res
        .launch(s2)
        .write(&mut used)
        .enqueue(|raw| {
            gpu.launch_kernel(raw, &[MemAccess::write(&block)])
                .map_err(|e| e.for_request(0, s2))
        })
        .unwrap();
    if buffered == Buffered::OtherBlockAndAHookUse {
        res.record_block_use(&held, s3).unwrap();
    }
    drop(used);
    assert_eq!(memory.len(), 1);
    drop(memory);
    assert_eq!(cache.leased_bytes(), P, "only stream 3's page is leased");

    let waits = gpu.call_count(DriverCall::StreamWaitEvent);
    let taken = cache.allocate(2 * P, s3, TAG).unwrap();
    let after = TakenAfter {
        waits: gpu.call_count(DriverCall::StreamWaitEvent) - waits,
        same_range: taken.ptr() == at,
    };
    gpu.launch_kernel(raw(s3), &[MemAccess::write(&taken)])
        .unwrap();
    cache.deallocate(taken).unwrap();
    cache.deallocate(held).unwrap();
    gpu.run_until_idle();
    assert_eq!(
        gpu.races(),
        [],
        "stream 3 raced stream 1's or stream 2's work"
    );
    after
}

/// A reservation dropped with a block it never handed out gives that
/// block back as it was, not as a free of its stream: stream 1's range,
/// which the host saw stream 1 done with, serves stream 3 with no wait on
/// the GPU, although stream 2 (the reservation's) still has work queued.
/// Given back as a free at the end of stream 2's queue, it made stream 3
/// wait for all of that work, none of which touched the range.
#[tokio::test]
async fn a_dropped_reservation_gives_back_the_blocks_it_never_handed_out_untagged() {
    let taken = stream3_takes_what_a_dropped_reservation_held(true, Buffered::OtherBlock).await;
    assert!(taken.same_range, "stream 1's range serves stream 3");
    assert_eq!(
        taken.waits, 0,
        "stream 3 waited on the GPU for stream 2's work, which never touched the range"
    );
}

/// The same with stream 1's work still queued: the range keeps stream 1's
/// tag, so stream 3 waits for stream 1's free (the race detector checks
/// its write against stream 1's).
#[tokio::test]
async fn a_dropped_reservations_unused_block_still_orders_the_next_user_after_the_free_before() {
    let taken = stream3_takes_what_a_dropped_reservation_held(false, Buffered::OtherBlock).await;
    assert!(taken.same_range, "stream 1's range serves stream 3");
    assert_eq!(taken.waits, 1, "one wait, for stream 1's free");
}

/// A block handed out as a buffer and written on stream 2 was used: its
/// free, when the buffer is dropped, is an ordinary one, and stream 3
/// waits for stream 2's work on it.
#[tokio::test]
async fn a_reserved_block_handed_out_as_a_buffer_is_an_ordinary_free() {
    let taken =
        stream3_takes_what_a_dropped_reservation_held(true, Buffered::StreamOnesRange).await;
    assert!(taken.same_range, "stream 1's range serves stream 3");
    assert_eq!(taken.waits, 1, "one wait, for stream 2's free");
}

/// A use named to the resource's hooks while the reservation lived may
/// have named one of its blocks (a caller can build any block's
/// descriptor): the proof that nothing touched them is gone, and the drop
/// gives them back as ordinary frees of stream 2.
#[tokio::test]
async fn a_hook_use_while_a_reservation_lives_makes_its_drop_an_ordinary_free() {
    let taken =
        stream3_takes_what_a_dropped_reservation_held(true, Buffered::OtherBlockAndAHookUse).await;
    assert!(taken.same_range, "stream 1's range serves stream 3");
    assert_eq!(taken.waits, 1, "one wait, for stream 2's free");
}

/// A sleep of a reserved block's tag, then a wake, queues the block's
/// restore on its stream: the crate's own work touched the block, which
/// the reservation never handed out. Its drop still frees it as an
/// ordinary free of its stream (the cache saw the restore), so stream 3,
/// taking the range, waits for the restore on the GPU, and the race
/// detector, which reports an undone allocation that was touched, stays
/// silent.
#[tokio::test]
async fn a_reserved_block_restored_by_a_wake_is_an_ordinary_free() {
    use std::sync::Arc;
    use streamalloc::gpu::sim::MemAccess;
    use streamalloc::{CachingResource, DeviceMemoryResource, DriverCall, SleepMode, SleepPlan};
    const P: usize = 2 * MIB;
    let gpu = SimGpu::builder().manual().build();
    let device = Device::simulated(&gpu, 3);
    let (s1, s2, s3) = (
        device.stream(0).unwrap(),
        device.stream(1).unwrap(),
        device.stream(2).unwrap(),
    );
    let raw = |s| device.raw(s).unwrap();
    let bottom = Arc::new(streamalloc::SimResource::new(&device));
    let cache = Arc::new(CachingResource::with_config(
        bottom,
        CacheConfig::default().max_mapping_bytes(P),
    ));
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(cache.clone(), &device) }.unwrap();
    let freed = cache.allocate(2 * P, s1, TAG).unwrap();
    let held = cache.allocate(P, s3, AllocTag("held")).unwrap();
    let at = freed.ptr();
    gpu.launch_kernel(raw(s1), &[MemAccess::write(&freed)])
        .unwrap();
    cache.deallocate(freed).unwrap();
    gpu.run_until_idle();

    let memory = res.reserve(&[2 * P], s2, TAG).await.unwrap();
    cache
        .sleep(&SleepPlan::new().tag(TAG, SleepMode::Offload))
        .unwrap();
    assert!(
        !cache.wake().unwrap().is_empty(),
        "the wake restored the block"
    );
    drop(memory);

    let waits = gpu.call_count(DriverCall::StreamWaitEvent);
    let taken = cache.allocate(2 * P, s3, TAG).unwrap();
    assert_eq!(taken.ptr(), at, "the reserved range serves stream 3");
    assert!(
        gpu.call_count(DriverCall::StreamWaitEvent) > waits,
        "stream 3 did not wait for the restore on stream 2"
    );
    gpu.launch_kernel(raw(s3), &[MemAccess::write(&taken)])
        .unwrap();
    cache.deallocate(taken).unwrap();
    cache.deallocate(held).unwrap();
    gpu.run_until_idle();
    assert_eq!(gpu.races(), [], "stream 3 raced the restore");
}

fn futures_noop() -> std::task::Waker {
    std::task::Waker::noop().clone()
}
