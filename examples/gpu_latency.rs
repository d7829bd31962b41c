//! EventFuture latency and overhead on a real GPU, as a table.
//!
//! Measures, on a multi-thread tokio runtime:
//! 1. wake latency p50/p99 of an EventFuture for an event on an idle stream;
//! 2. the same after a 4-byte memset;
//! 3. the floor: a task polling `cuEventQuery` (yielding between queries)
//!    after the same memset;
//! 4. stream throughput of 8 MiB memsets with a completion future on every
//!    one, against none;
//! 5. 10,000 concurrent 4-byte fills over 8 streams with a future on each,
//!    against none: the cost per future.
//!
//! Targets on an H200: idle p50 ≤ 5 µs / p99 ≤ 15 µs; tiny op p50 ≤ 1.1× the
//! polling floor and p99 ≤ 10 µs; memsets with futures ≤ 1.15× plain; 10k
//! futures ≤ 1 µs each.
//!
//! ```text
//! cargo run --release --example gpu_latency          # needs a CUDA GPU
//! cargo run --release --example gpu_latency -- --sim # smoke run, simulated
//! ```
//! Without a GPU it runs on the simulated device: the numbers then measure
//! only the futures machinery and are not comparable to the targets.

mod common;

use std::time::{Duration, Instant};

use std::sync::Arc;

use streamalloc::futures::AsyncResource;
use streamalloc::gpu::Gpu;
use streamalloc::{AllocTag, DeviceBlock, DeviceMemoryResource, RawStream, ResourceResult};

const SAMPLES: usize = 20_000;
const STREAMS: usize = 8;

fn main() -> ResourceResult<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match common::setup(STREAMS, 1 << 30)? {
        common::Setup::Cuda(res) => {
            println!("device: CUDA device 0");
            rt.block_on(in_a_task(measure(res, SAMPLES)))
        }
        common::Setup::Sim(res, _) => {
            println!("device: SIMULATED — numbers measure the futures layer only");
            rt.block_on(in_a_task(measure(res, SAMPLES / 10)))
        }
    }
}

/// Runs `work` in a task of the runtime (on a worker thread), as a
/// service's request handler would run: tasks it spawns go to that worker's
/// own queue.
async fn in_a_task(
    work: impl std::future::Future<Output = ResourceResult<()>> + Send + 'static,
) -> ResourceResult<()> {
    tokio::spawn(work).await.expect("measuring task")
}

/// `n` 8 MiB memsets on `raw`, each followed by whatever `after` queues and
/// the task it spawns. Per op: the submit loop alone, and in all (every task
/// joined, the stream synchronized). The tasks' outputs come back for the
/// caller to check.
async fn memsets_with_tasks<T: Send + 'static>(
    gpu: &Arc<dyn Gpu>,
    big: &DeviceBlock,
    raw: RawStream,
    n: u32,
    mut after: impl FnMut() -> ResourceResult<tokio::task::JoinHandle<T>>,
) -> ResourceResult<(Duration, Duration, Vec<T>)> {
    let t = Instant::now();
    let mut tasks = Vec::with_capacity(n as usize);
    for _ in 0..n {
        gpu.memset_async(big.ptr(), 8, big.size(), raw)
            .map_err(common::gpu_err)?;
        tasks.push(after()?);
    }
    let submit = t.elapsed() / n;
    let mut outputs = Vec::with_capacity(tasks.len());
    for task in tasks {
        outputs.push(task.await.expect("measured task"));
    }
    gpu.stream_synchronize(raw).map_err(common::gpu_err)?;
    Ok((submit, t.elapsed() / n, outputs))
}

fn pct(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    (at(0.50), at(0.99))
}

async fn measure<R: DeviceMemoryResource + 'static>(
    res: AsyncResource<R>,
    samples: usize,
) -> ResourceResult<()> {
    // `QUERY_EVERY_NS=…` measures another query spacing than the default.
    if let Some(ns) = std::env::var("QUERY_EVERY_NS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        res.set_wait_policy(streamalloc::futures::WaitPolicy {
            query_every: Duration::from_nanos(ns),
            ..res.wait_policy()
        });
    }
    println!("wait policy: {:?}", res.wait_policy());
    let pool = res.stream_pool().clone();
    let s = pool.id(0).expect("stream");
    let raw = pool.raw(s)?;
    let tiny = res.try_allocate(256, s, AllocTag("tiny"))?;
    let gpu = res.gpu().clone();

    // Everything runs inside a spawned task, as a service's request would.
    let (idle, op, floor) = {
        let res = res.clone();
        let gpu = gpu.clone();
        let tiny = tiny.clone();
        tokio::spawn(async move {
            let mut idle = Vec::with_capacity(samples);
            let mut op = Vec::with_capacity(samples);
            let mut floor = Vec::with_capacity(samples);
            let event = gpu.event_create().map_err(common::gpu_err)?;
            for i in 0..samples {
                let t = Instant::now();
                res.completion(s)?.await?;
                idle.push(t.elapsed());

                let t = Instant::now();
                gpu.memset_async(tiny.ptr(), i as u8, 4, raw)
                    .map_err(common::gpu_err)?;
                res.completion(s)?.await?;
                op.push(t.elapsed());

                let t = Instant::now();
                gpu.memset_async(tiny.ptr(), i as u8, 4, raw)
                    .map_err(common::gpu_err)?;
                gpu.event_record(event, raw).map_err(common::gpu_err)?;
                while !gpu.event_query(event).map_err(common::gpu_err)? {
                    tokio::task::yield_now().await;
                }
                floor.push(t.elapsed());
            }
            let _ = gpu.event_destroy(event);
            ResourceResult::Ok((idle, op, floor))
        })
        .await
        .expect("latency task")?
    };
    let (idle50, idle99) = pct(idle);
    let (op50, op99) = pct(op);
    let (fl50, fl99) = pct(floor);

    // Stream throughput: 8 MiB memsets, plain vs a future on each.
    let big = res.try_allocate(8 << 20, s, AllocTag("big"))?;
    let n = 400;
    let plain = {
        let t = Instant::now();
        for _ in 0..n {
            gpu.memset_async(big.ptr(), 1, big.size(), raw)
                .map_err(common::gpu_err)?;
        }
        gpu.stream_synchronize(raw).map_err(common::gpu_err)?;
        t.elapsed() / n
    };
    let (spawned_submit, with_futures, outputs) =
        memsets_with_tasks(&gpu, &big, raw, n, || Ok(tokio::spawn(res.completion(s)?))).await?;
    outputs.into_iter().collect::<ResourceResult<()>>()?;

    // The same as a pipeline: the submitting task hands each future to one
    // consumer task that awaits them in order (no task per future).
    let piped = {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let consumer = tokio::spawn(async move {
            while let Some(point) = rx.recv().await {
                let point: streamalloc::futures::EventFuture = point;
                point.await?;
            }
            ResourceResult::Ok(())
        });
        let t = Instant::now();
        for _ in 0..n {
            gpu.memset_async(big.ptr(), 2, big.size(), raw)
                .map_err(common::gpu_err)?;
            let _ = tx.send(res.completion(s)?);
        }
        drop(tx);
        consumer.await.expect("consumer task")?;
        t.elapsed() / n
    };

    // 10,000 concurrent futures over 8 streams (a 4-byte fill each).
    let blocks: Vec<_> = pool
        .ids()
        .map(|s| res.try_allocate(256, s, AllocTag("10k")))
        .collect::<ResourceResult<_>>()?;
    let many_round = |with_futures: bool| {
        let res = res.clone();
        let pool = pool.clone();
        let gpu = gpu.clone();
        let blocks = blocks.clone();
        async move {
            let t = Instant::now();
            let mut tasks = Vec::with_capacity(10_000);
            for i in 0..10_000 {
                let b = &blocks[i % blocks.len()];
                gpu.memset_async(b.ptr(), 3, 4, pool.raw(b.stream())?)
                    .map_err(common::gpu_err)?;
                if with_futures {
                    tasks.push(tokio::spawn(res.completion(b.stream())?));
                }
            }
            for task in tasks {
                task.await.expect("future task")?;
            }
            for s in pool.ids() {
                gpu.stream_synchronize(pool.raw(s)?)
                    .map_err(common::gpu_err)?;
            }
            ResourceResult::Ok(t.elapsed() / 10_000)
        }
    };
    many_round(true).await?; // warm-up: grows the event pool
    let many_plain = many_round(false).await?;
    let many = many_round(true).await?;

    // Where the cost goes: the same work split into its parts.
    // (a) `completion()` alone (event record + sequence number), futures
    //     dropped at once, on an idle stream.
    gpu.stream_synchronize(raw).map_err(common::gpu_err)?;
    let point_only = {
        let t = Instant::now();
        for _ in 0..10_000 {
            drop(res.completion(s)?);
        }
        t.elapsed() / 10_000
    };
    // (b) 8 MiB memsets with a future each, awaited together in this task
    //     (no task spawned per future): the submit loop alone, then in all.
    let (submit, joined) = {
        let t = Instant::now();
        let mut futs = Vec::with_capacity(n as usize);
        for _ in 0..n {
            gpu.memset_async(big.ptr(), 4, big.size(), raw)
                .map_err(common::gpu_err)?;
            futs.push(res.completion(s)?);
        }
        let submit = t.elapsed() / n;
        for r in ::futures::future::join_all(futs).await {
            r?;
        }
        (submit, t.elapsed() / n)
    };
    // (c) the spawned variant with futures that park at once (no spin).
    let parked = {
        let policy = res.wait_policy();
        res.set_wait_policy(streamalloc::futures::WaitPolicy::PARK_AT_ONCE);
        let (_, parked, outputs) =
            memsets_with_tasks(&gpu, &big, raw, n, || Ok(tokio::spawn(res.completion(s)?))).await?;
        res.set_wait_policy(policy);
        outputs.into_iter().collect::<ResourceResult<()>>()?;
        parked
    };
    // (e) the floor any event-based design pays: plain memsets, the submit
    //     loop alone; then a raw event record after each (no futures).
    gpu.stream_synchronize(raw).map_err(common::gpu_err)?;
    let plain_submit = {
        let t = Instant::now();
        for _ in 0..n {
            gpu.memset_async(big.ptr(), 6, big.size(), raw)
                .map_err(common::gpu_err)?;
        }
        let submit = t.elapsed() / n;
        gpu.stream_synchronize(raw).map_err(common::gpu_err)?;
        submit
    };
    let raw_events: Vec<_> = (0..64)
        .map(|_| gpu.event_create().map_err(common::gpu_err))
        .collect::<ResourceResult<_>>()?;
    let (record_submit, record_all) = {
        let t = Instant::now();
        for i in 0..n as usize {
            gpu.memset_async(big.ptr(), 7, big.size(), raw)
                .map_err(common::gpu_err)?;
            gpu.event_record(raw_events[i % raw_events.len()], raw)
                .map_err(common::gpu_err)?;
        }
        let submit = t.elapsed() / n;
        gpu.stream_synchronize(raw).map_err(common::gpu_err)?;
        (submit, t.elapsed() / n)
    };
    let many_record = {
        let t = Instant::now();
        for i in 0..10_000 {
            let b = &blocks[i % blocks.len()];
            let r = pool.raw(b.stream())?;
            gpu.memset_async(b.ptr(), 3, 4, r)
                .map_err(common::gpu_err)?;
            gpu.event_record(raw_events[i % raw_events.len()], r)
                .map_err(common::gpu_err)?;
        }
        for s in pool.ids() {
            gpu.stream_synchronize(pool.raw(s)?)
                .map_err(common::gpu_err)?;
        }
        t.elapsed() / 10_000
    };
    for e in raw_events {
        let _ = gpu.event_destroy(e);
    }
    // Controls: what the runtime and the driver cost without the futures
    // layer. (f) a spawned empty task per op; (g) a raw record per op, each
    // on an event of its own (10,000 events, as 10,000 live futures hold);
    // (h) `completion()` per op with the futures dropped at once.
    let (_, spawn_big, _) =
        memsets_with_tasks(&gpu, &big, raw, n, || Ok(tokio::spawn(async {}))).await?;
    // (i) spawned tasks that only take the notifier locks (no driver call),
    // and (j) tasks that only query a finished event three times (no lock):
    // which of the two slows a thread submitting to the same stream.
    let done = gpu.event_create().map_err(common::gpu_err)?;
    gpu.event_record(done, raw).map_err(common::gpu_err)?;
    gpu.stream_synchronize(raw).map_err(common::gpu_err)?;
    let (spawn_locks, _, _) = memsets_with_tasks(&gpu, &big, raw, n, || {
        let res = res.clone();
        Ok(tokio::spawn(async move {
            for _ in 0..4 {
                std::hint::black_box(res.parked_points());
                tokio::task::yield_now().await;
            }
        }))
    })
    .await?;
    let (spawn_queries, _, _) = memsets_with_tasks(&gpu, &big, raw, n, || {
        let gpu = gpu.clone();
        Ok(tokio::spawn(async move {
            for _ in 0..3 {
                let _ = std::hint::black_box(gpu.event_query(done));
                tokio::task::yield_now().await;
            }
        }))
    })
    .await?;
    let _ = gpu.event_destroy(done);
    // (k) spawned tasks woken from a thread outside the runtime about 5 µs
    // after they are spawned, as a completion notification wakes a parked
    // future: no GPU or lock involved.
    let remote_woken = {
        let (to_waker, inbox) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>();
        let waker = std::thread::spawn(move || {
            for reply in inbox {
                let t = Instant::now();
                while t.elapsed() < Duration::from_micros(5) {
                    std::hint::spin_loop();
                }
                let _ = reply.send(());
            }
        });
        let (submit, _, _) = memsets_with_tasks(&gpu, &big, raw, n, || {
            let (reply, woken) = tokio::sync::oneshot::channel();
            let _ = to_waker.send(reply);
            Ok(tokio::spawn(async move {
                let _ = woken.await;
            }))
        })
        .await?;
        drop(to_waker);
        let _ = waker.join();
        submit
    };
    // (l) spawned tasks woken by a host function on a second stream that
    // waits on an event recorded after each memset (our notifier's shape,
    // one per op, none of our code): waking inside the host function, and
    // (m) the host function handing the wake to a thread of ours.
    let lane = gpu.create_stream().map_err(common::gpu_err)?;
    let lane_events: Vec<_> = (0..n)
        .map(|_| gpu.event_create().map_err(common::gpu_err))
        .collect::<ResourceResult<_>>()?;
    let mut host_fn_woken = [Duration::ZERO; 2];
    for (handoff, slot) in host_fn_woken.iter_mut().enumerate() {
        let (to_waker, inbox) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>();
        let helper = std::thread::spawn(move || {
            for reply in inbox {
                let _ = reply.send(());
            }
        });
        let mut events = lane_events.iter();
        (*slot, _, _) = memsets_with_tasks(&gpu, &big, raw, n, || {
            let e = *events.next().expect("an event per memset");
            gpu.event_record(e, raw).map_err(common::gpu_err)?;
            gpu.stream_wait_event(lane, e).map_err(common::gpu_err)?;
            let (reply, woken) = tokio::sync::oneshot::channel();
            let to_waker = to_waker.clone();
            gpu.launch_host_fn(
                lane,
                Box::new(move || {
                    if handoff == 1 {
                        let _ = to_waker.send(reply);
                    } else {
                        let _ = reply.send(());
                    }
                }),
            )
            .map_err(common::gpu_err)?;
            Ok(tokio::spawn(async move {
                let _ = woken.await;
            }))
        })
        .await?;
        drop(to_waker);
        gpu.stream_synchronize(lane).map_err(common::gpu_err)?;
        let _ = helper.join();
    }
    for e in lane_events {
        let _ = gpu.event_destroy(e);
    }
    let _ = gpu.destroy_stream(lane);
    let sync_all = || -> ResourceResult<()> {
        for s in pool.ids() {
            gpu.stream_synchronize(pool.raw(s)?)
                .map_err(common::gpu_err)?;
        }
        Ok(())
    };
    let spawn_many = {
        let t = Instant::now();
        let mut tasks = Vec::with_capacity(10_000);
        for i in 0..10_000 {
            let b = &blocks[i % blocks.len()];
            gpu.memset_async(b.ptr(), 3, 4, pool.raw(b.stream())?)
                .map_err(common::gpu_err)?;
            tasks.push(tokio::spawn(async {}));
        }
        for task in tasks {
            task.await.expect("empty task");
        }
        sync_all()?;
        t.elapsed() / 10_000
    };
    let own_events: Vec<_> = (0..10_000)
        .map(|_| gpu.event_create().map_err(common::gpu_err))
        .collect::<ResourceResult<_>>()?;
    let many_own_record = {
        let t = Instant::now();
        for (i, &e) in own_events.iter().enumerate() {
            let b = &blocks[i % blocks.len()];
            let r = pool.raw(b.stream())?;
            gpu.memset_async(b.ptr(), 3, 4, r)
                .map_err(common::gpu_err)?;
            gpu.event_record(e, r).map_err(common::gpu_err)?;
        }
        sync_all()?;
        t.elapsed() / 10_000
    };
    for e in own_events {
        let _ = gpu.event_destroy(e);
    }
    let many_dropped = {
        let t = Instant::now();
        for i in 0..10_000 {
            let b = &blocks[i % blocks.len()];
            gpu.memset_async(b.ptr(), 3, 4, pool.raw(b.stream())?)
                .map_err(common::gpu_err)?;
            drop(res.completion(b.stream())?);
        }
        sync_all()?;
        t.elapsed() / 10_000
    };
    // (d) 10,000 futures over 8 streams awaited together, no task each.
    let many_joined = {
        let t = Instant::now();
        let mut futs = Vec::with_capacity(10_000);
        for i in 0..10_000 {
            let b = &blocks[i % blocks.len()];
            gpu.memset_async(b.ptr(), 3, 4, pool.raw(b.stream())?)
                .map_err(common::gpu_err)?;
            futs.push(res.completion(b.stream())?);
        }
        for r in ::futures::future::join_all(futs).await {
            r?;
        }
        t.elapsed() / 10_000
    };

    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!();
    println!("| measurement | p50 / value | p99 | target |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| EventFuture, idle stream | {idle50:.2} µs | {idle99:.2} µs | p50 ≤ 5 µs, p99 ≤ 15 µs |"
    );
    println!(
        "| EventFuture, 4-byte memset | {op50:.2} µs | {op99:.2} µs | p50 ≤ {:.2} µs (1.1× floor), p99 ≤ 10 µs |",
        1.1 * fl50
    );
    println!("| floor: task polling cuEventQuery | {fl50:.2} µs | {fl99:.2} µs | — |");
    println!(
        "| 8 MiB memset, plain / a spawned task awaiting a future each | {:.2} / {:.2} µs ({:.3}×) | — | ≤ 1.15× |",
        us(plain),
        us(with_futures),
        us(with_futures) / us(plain)
    );
    println!(
        "| 8 MiB memset, plain / a future each handed to one consumer task | {:.2} / {:.2} µs ({:.3}×) | — | ≤ 1.15× |",
        us(plain),
        us(piped),
        us(piped) / us(plain)
    );
    println!(
        "| 10,000 concurrent 4-byte fills on 8 streams, plain / with a future each | {:.3} / {:.3} µs per op | overhead {:.3} µs per future | ≤ 1 µs |",
        us(many_plain),
        us(many),
        us(many) - us(many_plain)
    );
    println!();
    println!("| breakdown | per op |");
    println!("| --- | --- |");
    println!(
        "| `completion()` alone (record + sequence number), idle stream | {:.2} µs |",
        us(point_only)
    );
    println!(
        "| 8 MiB memset + `completion()`, submit loop only / in all, awaited together (no spawn) | {:.2} / {:.2} µs |",
        us(submit),
        us(joined)
    );
    println!(
        "| 8 MiB memset, a spawned future each, parking at once (no spin) | {:.2} µs |",
        us(parked)
    );
    println!(
        "| 10,000 fills, futures awaited together (no spawn) | {:.3} µs |",
        us(many_joined)
    );
    println!(
        "| 8 MiB memset plain, submit loop only | {:.2} µs |",
        us(plain_submit)
    );
    println!(
        "| 8 MiB memset + a raw event record each (no futures), submit loop only / in all | {:.2} / {:.2} µs |",
        us(record_submit),
        us(record_all)
    );
    println!(
        "| 10,000 fills + a raw event record each (no futures), in all | {:.3} µs |",
        us(many_record)
    );
    println!(
        "| 8 MiB memset, a spawned task awaiting a future each: submit loop only | {:.2} µs |",
        us(spawned_submit)
    );
    println!(
        "| control: 8 MiB memset + a spawned empty task each, in all | {:.2} µs |",
        us(spawn_big)
    );
    println!(
        "| control: 8 MiB memset + a spawned task taking the notifier locks 4 times (no driver call): submit loop | {:.2} µs |",
        us(spawn_locks)
    );
    println!(
        "| control: 8 MiB memset + a spawned task querying a finished event 3 times (no lock): submit loop | {:.2} µs |",
        us(spawn_queries)
    );
    println!(
        "| control: 8 MiB memset + a spawned task woken from another thread 5 µs later (no GPU, no lock): submit loop | {:.2} µs |",
        us(remote_woken)
    );
    println!(
        "| control: 8 MiB memset + record + a host function on a second stream waking a spawned task, in the host function / handed to a thread: submit loop | {:.2} / {:.2} µs |",
        us(host_fn_woken[0]),
        us(host_fn_woken[1])
    );
    println!(
        "| control: 10,000 fills + a spawned empty task each, in all | {:.3} µs |",
        us(spawn_many)
    );
    println!(
        "| control: 10,000 fills + a raw record each on its own event (10,000 events), in all | {:.3} µs |",
        us(many_own_record)
    );
    println!(
        "| 10,000 fills + `completion()` each, futures dropped at once, in all | {:.3} µs |",
        us(many_dropped)
    );
    println!(
        "\n{} notifications (host functions) in all",
        res.notifications()
    );

    for b in blocks.into_iter().chain([tiny, big]) {
        drop(res.deallocate(b)?);
    }
    res.reap_pending().await?;
    assert_eq!(res.bytes_outstanding(), 0);
    Ok(())
}
