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
//! Rows 4 and 5 are measured for several [`WaitPolicy`] choices in the same
//! process, interleaved and repeated (medians of `ROUNDS`), with the
//! [`WaitStats`] of each row per op: how the futures waited. Row 2 is
//! measured for the default policy and a longer spin, interleaved sample
//! by sample with the floor. Controls without the futures layer (a raw
//! event record, an empty spawned task, a `()` sent to a consumer task,
//! `join_all` instead of awaiting in order) run in the same rounds;
//! `--controls` adds a few more that say which work in a spawned task slows
//! the submitting thread.
//!
//! Targets on an H200: idle p50 ≤ 5 µs / p99 ≤ 15 µs; tiny op p50 ≤ 1.1× the
//! polling floor and p99 ≤ 10 µs; memsets with futures ≤ 1.15× plain; 10k
//! futures ≤ 1 µs each.
//!
//! ```text
//! cargo run --release -p streamalloc-measure --bin gpu_latency          # needs a CUDA GPU
//! STREAMALLOC_DEVICE=sim cargo run --release -p streamalloc-measure --bin gpu_latency # smoke run, simulated
//! cargo run --release -p streamalloc-measure --bin gpu_latency -- --controls # and the breakdown
//! ```
//! Without a GPU it runs on the simulated device: the numbers then measure
//! only the futures machinery and are not comparable to the targets.

use std::time::{Duration, Instant};

use std::sync::Arc;

use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    AllocTag, Device, DeviceBlock, DeviceMemoryResource, RawStream, ResourceError, ResourceResult,
};
use streamalloc::{AsyncResource, WaitPolicy, WaitStats, WhenBehind};

const SAMPLES: usize = 20_000;
const STREAMS: usize = 8;
/// Fills in the many-futures rows.
const FILLS: usize = 10_000;
/// Rounds of the throughput rows on a GPU; each row reports its median (one
/// round on the simulated device, which runs one operation at a time).
const ROUNDS: usize = 9;

fn main() -> ResourceResult<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let device = Device::open_or_sim(
        0,
        STREAMS,
        SimGpu::builder()
            .capacity(1 << 30)
            .op_latency(Duration::from_micros(50)),
    );
    println!("device: {device}");
    let res = AsyncResource::on(&device)?;
    if device.simulator().is_none() {
        rt.block_on(in_a_task(measure(res, SAMPLES, ROUNDS)))
    } else {
        println!("SIMULATED — numbers measure the futures layer only");
        rt.block_on(in_a_task(measure(res, SAMPLES / 10, 1)))
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
/// the task it spawns. Per op: the submit loop alone, in all (every task
/// joined, the stream synchronized), and the part of the submit loop spent
/// inside `memset_async` (the rest is `after`). The tasks' outputs come back
/// for the caller to check.
async fn memsets_with_tasks<T: Send + 'static>(
    gpu: &Arc<dyn Gpu>,
    big: &DeviceBlock,
    raw: RawStream,
    n: u32,
    mut after: impl FnMut() -> ResourceResult<tokio::task::JoinHandle<T>>,
) -> ResourceResult<(Duration, Duration, Vec<T>, Duration)> {
    let t = Instant::now();
    let mut in_memset = Duration::ZERO;
    let mut tasks = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let m = Instant::now();
        // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
        unsafe { gpu.memset_async(big.ptr(), 8, big.size(), raw) }?;
        in_memset += m.elapsed();
        tasks.push(after()?);
    }
    let submit = t.elapsed() / n;
    let mut outputs = Vec::with_capacity(tasks.len());
    for task in tasks {
        outputs.push(task.await.expect("measured task"));
    }
    // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
    unsafe { gpu.stream_synchronize(raw) }?;
    Ok((submit, t.elapsed() / n, outputs, in_memset / n))
}

/// 10,000 4-byte fills round-robin over `blocks` (one per stream), each
/// followed by whatever `after` queues (it may hand back something to wait
/// for); then `finish` waits for those and every stream is synchronized.
/// Per op, in all.
async fn fills<T>(
    gpu: &Arc<dyn Gpu>,
    blocks: &[DeviceBlock],
    raws: &[RawStream],
    mut after: impl FnMut(usize, &DeviceBlock, RawStream) -> ResourceResult<Option<T>>,
    finish: impl AsyncFnOnce(Vec<T>) -> ResourceResult<()>,
) -> ResourceResult<Duration> {
    let t = Instant::now();
    let mut waits = Vec::with_capacity(FILLS);
    for i in 0..FILLS {
        let (b, raw) = (&blocks[i % blocks.len()], raws[i % raws.len()]);
        // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
        unsafe { gpu.memset_async(b.ptr(), 3, 4, raw) }?;
        waits.extend(after(i, b, raw)?);
    }
    finish(waits).await?;
    for &raw in raws {
        // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
        unsafe { gpu.stream_synchronize(raw) }?;
    }
    Ok(t.elapsed() / FILLS as u32)
}

/// `fills` with nothing after each fill.
async fn plain_fills(
    gpu: &Arc<dyn Gpu>,
    blocks: &[DeviceBlock],
    raws: &[RawStream],
) -> ResourceResult<Duration> {
    fills(
        gpu,
        blocks,
        raws,
        |_, _, _| Ok(None::<()>),
        async |_| Ok(()),
    )
    .await
}

/// Awaits `futures` one after another.
async fn in_order<F: std::future::Future<Output = ResourceResult<()>>>(
    futures: Vec<F>,
) -> ResourceResult<()> {
    for f in futures {
        f.await?;
    }
    Ok(())
}

/// Awaits spawned tasks that each return a result.
async fn joined(tasks: Vec<tokio::task::JoinHandle<ResourceResult<()>>>) -> ResourceResult<()> {
    for task in tasks {
        task.await.expect("spawned task")?;
    }
    Ok(())
}

fn pct(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    (at(0.50), at(0.99))
}

/// The policies the throughput rows are measured with, the default first.
fn policies() -> Vec<(&'static str, WaitPolicy)> {
    let d = WaitPolicy::DEFAULT;
    vec![
        ("default", d),
        (
            "park behind",
            WaitPolicy {
                behind: WhenBehind::Park,
                ..d
            },
        ),
        (
            "no spin",
            WaitPolicy {
                spin: Duration::ZERO,
                ..d
            },
        ),
        (
            "query every 2 µs",
            WaitPolicy {
                query_every: Duration::from_micros(2),
                ..d
            },
        ),
        ("park at once", WaitPolicy::PARK_AT_ONCE),
    ]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One throughput row: µs per op in each round, the plain loop measured
/// right before it (its pair: the host's speed drifts between rounds), and
/// the wait counts per op of the last round.
#[derive(Default)]
struct Row {
    us: Vec<f64>,
    base: Vec<f64>,
    stats: WaitStats,
    ops: u64,
}

impl Row {
    fn push(&mut self, per_op: Duration, stats: WaitStats, ops: u64) {
        self.us.push(per_op.as_secs_f64() * 1e6);
        self.stats = stats;
        self.ops = ops;
    }

    /// As `push`, with the plain loop measured right before.
    fn push_paired(&mut self, per_op: Duration, plain: Duration, stats: WaitStats, ops: u64) {
        self.base.push(plain.as_secs_f64() * 1e6);
        self.push(per_op, stats, ops);
    }

    fn value(&self) -> f64 {
        median(self.us.clone())
    }

    /// Median over the rounds of this row over its paired plain loop.
    fn ratio(&self) -> f64 {
        median(self.us.iter().zip(&self.base).map(|(v, b)| v / b).collect())
    }

    /// Median over the rounds of this row minus its paired plain loop.
    fn overhead(&self) -> f64 {
        median(self.us.iter().zip(&self.base).map(|(v, b)| v - b).collect())
    }

    /// Queries / parks / notifications / yields per op.
    fn counts(&self) -> String {
        let per = |n: u64| n as f64 / self.ops.max(1) as f64;
        format!(
            "{:.2} q, {:.2} fq, {:.2} park, {:.3} notif, {:.1} yield",
            per(self.stats.queries),
            per(self.stats.frontier_queries),
            per(self.stats.parks),
            per(self.stats.notifications),
            per(self.stats.yields)
        )
    }
}

async fn measure<R: DeviceMemoryResource + 'static>(
    res: AsyncResource<R>,
    samples: usize,
    rounds: usize,
) -> ResourceResult<()> {
    // `QUERY_EVERY_NS=…` measures another query spacing than the default.
    let every = std::env::var("QUERY_EVERY_NS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_nanos);
    let with_every = |p: WaitPolicy| WaitPolicy {
        query_every: if p == WaitPolicy::PARK_AT_ONCE {
            p.query_every
        } else {
            every.unwrap_or(p.query_every)
        },
        ..p
    };
    let default_policy = with_every(WaitPolicy::DEFAULT);
    res.set_wait_policy(default_policy);
    println!("wait policy: {default_policy:?}");
    let pool = res.stream_pool().clone();
    let s = pool.id(0).expect("stream");
    let raw = pool.raw(s)?;
    let tiny = res.try_allocate(256, s, AllocTag("tiny"))?;
    let gpu = res.gpu().clone();

    // Latency, in a spawned task as a service's request would run. The
    // default policy, a longer spin, and the floor take turns sample by
    // sample, so that the host's drift hits all three alike.
    let long_spin = WaitPolicy {
        spin: Duration::from_micros(10),
        ..default_policy
    };
    let (idle, op, op_long, floor) = {
        let res = res.clone();
        let gpu = gpu.clone();
        let tiny = tiny.clone();
        tokio::spawn(async move {
            let mut idle = Vec::with_capacity(samples);
            let mut op = Vec::with_capacity(samples);
            let mut op_long = Vec::with_capacity(samples);
            let mut floor = Vec::with_capacity(samples);
            let event = gpu.event_create()?;
            for i in 0..samples {
                let t = Instant::now();
                res.completion(s)?.await?;
                idle.push(t.elapsed());

                for (policy, out) in [(default_policy, &mut op), (long_spin, &mut op_long)] {
                    res.set_wait_policy(policy);
                    let t = Instant::now();
                    // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
                    unsafe { gpu.memset_async(tiny.ptr(), i as u8, 4, raw) }?;
                    res.completion(s)?.await?;
                    out.push(t.elapsed());
                }
                res.set_wait_policy(default_policy);

                let t = Instant::now();
                // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
                unsafe { gpu.memset_async(tiny.ptr(), i as u8, 4, raw) }?;
                // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
                unsafe { gpu.event_record(event, raw) }?;
                // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
                while !unsafe { gpu.event_query(event) }? {
                    tokio::task::yield_now().await;
                }
                floor.push(t.elapsed());
            }
            // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
            let _ = unsafe { gpu.event_destroy(event) };
            ResourceResult::Ok((idle, op, op_long, floor))
        })
        .await
        .expect("latency task")?
    };
    let (idle50, idle99) = pct(idle);
    let (op50, op99) = pct(op);
    let (long50, long99) = pct(op_long);
    let (fl50, fl99) = pct(floor);

    let big = res.try_allocate(8 << 20, s, AllocTag("big"))?;
    let n = 400;
    let blocks: Vec<_> = pool
        .ids()
        .map(|s| res.try_allocate(256, s, AllocTag("10k")))
        .collect::<ResourceResult<_>>()?;
    let raws: Vec<_> = pool
        .ids()
        .map(|s| pool.raw(s))
        .collect::<ResourceResult<_>>()?;
    let (gpu, blocks, raws) = (&gpu, &blocks[..], &raws[..]);

    // Throughput rows, per policy, interleaved over the rounds.
    let policies: Vec<_> = policies()
        .into_iter()
        .map(|(name, p)| (name, with_every(p)))
        .collect();
    const ROWS: usize = 5;
    let row_names = [
        "8 MiB memsets, a spawned task awaiting a future each",
        "8 MiB memsets, a future each handed to one consumer task",
        "8 MiB memsets, the futures awaited in order (no spawn)",
        "10,000 fills on 8 streams, a spawned task awaiting a future each",
        "10,000 fills on 8 streams, the futures awaited in order (no spawn)",
    ];
    let mut rows: Vec<[Row; ROWS]> = policies.iter().map(|_| Default::default()).collect();
    let mut spawned_submit: Vec<Row> = policies.iter().map(|_| Row::default()).collect();
    let mut spawned_in_memset: Vec<Row> = policies.iter().map(|_| Row::default()).collect();
    let mut spawned_in_completion: Vec<Row> = policies.iter().map(|_| Row::default()).collect();
    let mut spawn_empty_split: [Row; 2] = Default::default();
    let mut plain_in_memset = Row::default();
    let mut plain = Row::default();
    let mut many_plain = Row::default();
    let mut spawn_empty = Row::default();
    let mut many_spawn_empty = Row::default();
    let mut unit_to_consumer = Row::default();
    let mut many_join_all = Row::default();
    let spawned_futures = |res: &AsyncResource<R>| {
        let res = res.clone();
        move |_: usize, b: &DeviceBlock, _: RawStream| {
            let point = res.completion(b.stream())?;
            Ok(Some(tokio::spawn(point)))
        }
    };
    let futures_each = |res: &AsyncResource<R>| {
        let res = res.clone();
        move |_: usize, b: &DeviceBlock, _: RawStream| res.completion(b.stream()).map(Some)
    };
    // The plain 8 MiB loop: per op in all, and inside memset_async.
    let plain_loop = || -> ResourceResult<(Duration, Duration)> {
        // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
        unsafe { gpu.stream_synchronize(raw) }?;
        let t = Instant::now();
        let mut in_memset = Duration::ZERO;
        for _ in 0..n {
            let m = Instant::now();
            // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
            unsafe { gpu.memset_async(big.ptr(), 1, big.size(), raw) }?;
            in_memset += m.elapsed();
        }
        // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
        unsafe { gpu.stream_synchronize(raw) }?;
        Ok((t.elapsed() / n, in_memset / n))
    };
    // A raw event record after each 8 MiB memset, no futures: the floor of
    // any design with an event per point.
    let record_events: Vec<_> = (0..64)
        .map(|_| gpu.event_create().map_err(ResourceError::from))
        .collect::<ResourceResult<_>>()?;
    let mut record_each = Row::default();
    // 10,000 fills with a raw record each, re-recording events at different
    // distances: one event per stream (re-recorded every 8 ops, often while
    // its last record is still pending), 8 per stream cycling, or 10,000
    // (each used once per round); and `completion()` dropped at once.
    let mut record_reuse: [Row; 4] = Default::default();
    let many_events: Vec<_> = (0..FILLS)
        .map(|_| gpu.event_create().map_err(ResourceError::from))
        .collect::<ResourceResult<_>>()?;
    // Warm-up: grows the event pool.
    fills(gpu, blocks, raws, spawned_futures(&res), joined).await?;
    for _round in 0..rounds {
        let (base, _) = plain_loop()?;
        let t = Instant::now();
        for i in 0..n as usize {
            // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
            unsafe { gpu.memset_async(big.ptr(), 7, big.size(), raw) }?;
            // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
            unsafe { gpu.event_record(record_events[i % record_events.len()], raw) }?;
        }
        // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
        unsafe { gpu.stream_synchronize(raw) }?;
        record_each.push_paired(t.elapsed() / n, base, WaitStats::default(), 1);
        for (k, events_in_use) in [8usize, 64, FILLS].into_iter().enumerate() {
            let base = plain_fills(gpu, blocks, raws).await?;
            // Event `i % events_in_use` is always on stream `i % 8`.
            let record = |i: usize, _: &DeviceBlock, raw: RawStream| {
                // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
                unsafe { gpu.event_record(many_events[i % events_in_use], raw) }?;
                Ok(None::<()>)
            };
            let with = fills(gpu, blocks, raws, record, async |_| Ok(())).await?;
            record_reuse[k].push_paired(with, base, WaitStats::default(), 1);
        }
        let base = plain_fills(gpu, blocks, raws).await?;
        let dropped = |_: usize, b: &DeviceBlock, _: RawStream| {
            drop(res.completion(b.stream())?);
            Ok(None::<()>)
        };
        let with = fills(gpu, blocks, raws, dropped, async |_| Ok(())).await?;
        record_reuse[3].push_paired(with, base, WaitStats::default(), 1);

        let (plain_all, in_memset) = plain_loop()?;
        plain.push(plain_all, WaitStats::default(), 1);
        plain_in_memset.push(in_memset, WaitStats::default(), 1);
        let many_base = plain_fills(gpu, blocks, raws).await?;
        many_plain.push(many_base, WaitStats::default(), 1);
        // Controls: a spawned empty task per op (what tokio alone costs).
        let (submit, all, _, in_memset) =
            memsets_with_tasks(gpu, &big, raw, n, || Ok(tokio::spawn(async {}))).await?;
        spawn_empty.push_paired(all, plain_all, WaitStats::default(), 1);
        spawn_empty_split[0].push(submit, WaitStats::default(), 1);
        spawn_empty_split[1].push(in_memset, WaitStats::default(), 1);
        let spawn = |_: usize, _: &DeviceBlock, _: RawStream| Ok(Some(tokio::spawn(async {})));
        let with = fills(gpu, blocks, raws, spawn, async |tasks| {
            for task in tasks {
                task.await.expect("empty task");
            }
            Ok(())
        })
        .await?;
        many_spawn_empty.push_paired(with, many_base, WaitStats::default(), 1);
        // What the channel to a consumer task costs alone: a `()` per op.
        let (base, _) = plain_loop()?;
        let t = Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let consumer = tokio::spawn(async move { while let Some(()) = rx.recv().await {} });
        for _ in 0..n {
            // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
            unsafe { gpu.memset_async(big.ptr(), 2, big.size(), raw) }?;
            let _ = tx.send(());
        }
        drop(tx);
        consumer.await.expect("consumer task");
        // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
        unsafe { gpu.stream_synchronize(raw) }?;
        unit_to_consumer.push_paired(t.elapsed() / n, base, WaitStats::default(), 1);
        // The futures of the in-order row awaited by `join_all` instead,
        // which allocates a task node per future.
        let base = plain_fills(gpu, blocks, raws).await?;
        let before = res.wait_stats();
        let with = fills(gpu, blocks, raws, futures_each(&res), async |futs| {
            ::futures::future::join_all(futs)
                .await
                .into_iter()
                .collect()
        })
        .await?;
        many_join_all.push_paired(with, base, res.wait_stats().since(&before), FILLS as u64);

        for (k, &(_, policy)) in policies.iter().enumerate() {
            res.set_wait_policy(policy);
            let row = &mut rows[k];

            let (base, _) = plain_loop()?;
            let before = res.wait_stats();
            // Nanoseconds inside `completion()` (an atomic only so that the
            // measuring future stays `Send`).
            let in_completion = std::sync::atomic::AtomicU64::new(0);
            let (submit, all, outputs, in_memset) = memsets_with_tasks(gpu, &big, raw, n, || {
                let c = Instant::now();
                let point = res.completion(s)?;
                in_completion.fetch_add(
                    c.elapsed().as_nanos() as u64,
                    std::sync::atomic::Ordering::Relaxed,
                );
                Ok(tokio::spawn(point))
            })
            .await?;
            let in_completion = Duration::from_nanos(in_completion.into_inner());
            spawned_in_completion[k].push(in_completion / n, WaitStats::default(), 1);
            outputs.into_iter().collect::<ResourceResult<()>>()?;
            row[0].push_paired(all, base, res.wait_stats().since(&before), n.into());
            spawned_submit[k].push(submit, WaitStats::default(), 1);
            spawned_in_memset[k].push(in_memset, WaitStats::default(), 1);

            // A pipeline: the submitting task hands each future to one
            // consumer task that awaits them in order.
            let (base, _) = plain_loop()?;
            let before = res.wait_stats();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let consumer = tokio::spawn(async move {
                while let Some(point) = rx.recv().await {
                    let point: streamalloc::EventFuture = point;
                    point.await?;
                }
                ResourceResult::Ok(())
            });
            let t = Instant::now();
            for _ in 0..n {
                // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
                unsafe { gpu.memset_async(big.ptr(), 2, big.size(), raw) }?;
                let _ = tx.send(res.completion(s)?);
            }
            drop(tx);
            consumer.await.expect("consumer task")?;
            // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
            unsafe { gpu.stream_synchronize(raw) }?;
            row[1].push_paired(
                t.elapsed() / n,
                base,
                res.wait_stats().since(&before),
                n.into(),
            );

            let (base, _) = plain_loop()?;
            let before = res.wait_stats();
            let t = Instant::now();
            let mut futs = Vec::with_capacity(n as usize);
            for _ in 0..n {
                // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
                unsafe { gpu.memset_async(big.ptr(), 4, big.size(), raw) }?;
                futs.push(res.completion(s)?);
            }
            in_order(futs).await?;
            // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
            unsafe { gpu.stream_synchronize(raw) }?;
            row[2].push_paired(
                t.elapsed() / n,
                base,
                res.wait_stats().since(&before),
                n.into(),
            );

            let base = plain_fills(gpu, blocks, raws).await?;
            let before = res.wait_stats();
            let with = fills(gpu, blocks, raws, spawned_futures(&res), joined).await?;
            row[3].push_paired(with, base, res.wait_stats().since(&before), FILLS as u64);

            let base = plain_fills(gpu, blocks, raws).await?;
            let before = res.wait_stats();
            let with = fills(gpu, blocks, raws, futures_each(&res), in_order).await?;
            row[4].push_paired(with, base, res.wait_stats().since(&before), FILLS as u64);
        }
    }
    res.set_wait_policy(default_policy);
    for e in record_events.into_iter().chain(many_events) {
        // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
        let _ = unsafe { gpu.event_destroy(e) };
    }

    let plain_us = plain.value();
    let many_plain_us = many_plain.value();
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
    println!(
        "| the same, spinning 10 µs on the first poll | {long50:.2} µs | {long99:.2} µs | — |"
    );
    println!("| floor: task polling cuEventQuery | {fl50:.2} µs | {fl99:.2} µs | — |");
    let default_rows = &rows[0];
    for (i, name) in row_names.iter().enumerate() {
        let row = &default_rows[i];
        let v = row.value();
        if i < 3 {
            println!(
                "| {name} | {v:.2} µs per op, {:.3}× plain | — | ≤ 1.15× |",
                row.ratio()
            );
        } else {
            println!(
                "| {name} | {v:.3} µs per op, overhead {:.3} µs per future | — | ≤ 1 µs |",
                row.overhead()
            );
        }
    }

    println!();
    println!(
        "Throughput per wait policy: medians of {rounds} interleaved rounds, each row against the plain loop run right before it (plain 8 MiB {plain_us:.2} µs, plain 10k fills {many_plain_us:.3} µs per op, medians). Counts per op: q = own-event queries, fq = frontier queries, park, notif = host functions, yield."
    );
    println!();
    println!("| row | policy | per op | vs plain | waits per op |");
    println!("| --- | --- | --- | --- | --- |");
    for (i, name) in row_names.iter().enumerate() {
        for (k, (policy, _)) in policies.iter().enumerate() {
            let row = &rows[k][i];
            let v = row.value();
            let versus = if i < 3 {
                format!("{:.3}×", row.ratio())
            } else {
                format!("+{:.3} µs", row.overhead())
            };
            println!(
                "| {name} | {policy} | {v:.3} µs | {versus} | {} |",
                row.counts()
            );
        }
    }
    println!(
        "| control: 8 MiB memsets, a raw event record each (no futures) | — | {:.3} µs | {:.3}× | — |",
        record_each.value(),
        record_each.ratio()
    );
    for (row, what) in record_reuse.iter().zip([
        "a raw record each, one event per stream",
        "a raw record each, 8 events per stream cycling",
        "a raw record each, 10,000 events",
        "`completion()` each, dropped at once",
    ]) {
        println!(
            "| control: 10,000 fills on 8 streams, {what} | — | {:.3} µs | +{:.3} µs | — |",
            row.value(),
            row.overhead()
        );
    }
    println!(
        "| control: 10,000 fills on 8 streams, the futures awaited by `join_all` (default policy) | — | {:.3} µs | +{:.3} µs | {} |",
        many_join_all.value(),
        many_join_all.overhead(),
        many_join_all.counts()
    );
    println!(
        "| control: 8 MiB memsets, a `()` handed to one consumer task each (no futures) | — | {:.3} µs | {:.3}× | — |",
        unit_to_consumer.value(),
        unit_to_consumer.ratio()
    );
    println!(
        "| control: 8 MiB memsets, a spawned empty task each | — | {:.3} µs | {:.3}× | — |",
        spawn_empty.value(),
        spawn_empty.ratio()
    );
    println!(
        "| control: 10,000 fills on 8 streams, a spawned empty task each | — | {:.3} µs | +{:.3} µs | — |",
        many_spawn_empty.value(),
        many_spawn_empty.overhead()
    );
    println!();
    println!(
        "| 8 MiB memset loop, per op | policy | submit loop | of which in memset_async | in `completion()` | the rest (spawn) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    println!(
        "| plain | — | — | {:.3} µs | — | — |",
        plain_in_memset.value()
    );
    println!(
        "| a spawned empty task each | — | {:.3} µs | {:.3} µs | — | {:.3} µs |",
        spawn_empty_split[0].value(),
        spawn_empty_split[1].value(),
        spawn_empty_split[0].value() - spawn_empty_split[1].value()
    );
    for (k, (policy, _)) in policies.iter().enumerate() {
        println!(
            "| a spawned task awaiting a future each | {policy} | {:.3} µs ({:.3}× plain) | {:.3} µs | {:.3} µs | {:.3} µs |",
            spawned_submit[k].value(),
            spawned_submit[k].value() / plain_us,
            spawned_in_memset[k].value(),
            spawned_in_completion[k].value(),
            spawned_submit[k].value()
                - spawned_in_memset[k].value()
                - spawned_in_completion[k].value()
        );
    }

    if std::env::args().any(|a| a == "--controls") {
        breakdown(&res, &big, n).await?;
    }
    println!(
        "\n{} notifications (host functions) in all",
        res.notifications()
    );

    for b in blocks.iter().cloned().chain([tiny, big]) {
        drop(res.deallocate(b)?);
    }
    res.reap_pending().await?;
    assert_eq!(res.bytes_outstanding(), 0);
    Ok(())
}

/// Controls that the main rounds do not repeat (`--controls`): what one
/// `completion()` costs on an idle stream, and which kind of work in a
/// spawned task slows a thread submitting to the same stream.
async fn breakdown<R: DeviceMemoryResource + 'static>(
    res: &AsyncResource<R>,
    big: &DeviceBlock,
    n: u32,
) -> ResourceResult<()> {
    let pool = res.stream_pool().clone();
    let s = pool.id(0).expect("stream");
    let raw = pool.raw(s)?;
    let gpu = res.gpu().clone();
    // (a) `completion()` alone (event record + sequence number), futures
    //     dropped at once, on an idle stream.
    // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
    unsafe { gpu.stream_synchronize(raw) }?;
    let point_only = {
        let t = Instant::now();
        for _ in 0..FILLS {
            drop(res.completion(s)?);
        }
        t.elapsed() / FILLS as u32
    };
    // (b) spawned tasks that only take the notifier locks (no driver call),
    // and (c) tasks that only query a finished event three times (no lock).
    let done = gpu.event_create()?;
    // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
    unsafe { gpu.event_record(done, raw) }?;
    // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
    unsafe { gpu.stream_synchronize(raw) }?;
    let (spawn_locks, _, _, _) = memsets_with_tasks(&gpu, big, raw, n, || {
        let res = res.clone();
        Ok(tokio::spawn(async move {
            for _ in 0..4 {
                std::hint::black_box(res.parked_points());
                tokio::task::yield_now().await;
            }
        }))
    })
    .await?;
    let (spawn_queries, _, _, _) = memsets_with_tasks(&gpu, big, raw, n, || {
        let gpu = gpu.clone();
        Ok(tokio::spawn(async move {
            for _ in 0..3 {
                // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
                let _ = std::hint::black_box(unsafe { gpu.event_query(done) });
                tokio::task::yield_now().await;
            }
        }))
    })
    .await?;
    // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
    let _ = unsafe { gpu.event_destroy(done) };
    // (d) spawned tasks woken from a thread outside the runtime about 5 µs
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
        let (submit, _, _, _) = memsets_with_tasks(&gpu, big, raw, n, || {
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
    // (e) spawned tasks woken by a host function on a second stream that
    // waits on an event recorded after each memset (our notifier's shape,
    // one per op, none of our code): waking inside the host function, and
    // (f) the host function handing the wake to a thread of ours.
    let lane = gpu.create_stream()?;
    let lane_events: Vec<_> = (0..n)
        .map(|_| gpu.event_create().map_err(ResourceError::from))
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
        (*slot, _, _, _) = memsets_with_tasks(&gpu, big, raw, n, || {
            let e = *events.next().expect("an event per memset");
            // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
            unsafe { gpu.event_record(e, raw) }?;
            // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
            unsafe { gpu.stream_wait_event(lane, e) }?;
            let (reply, woken) = tokio::sync::oneshot::channel();
            let to_waker = to_waker.clone();
            // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
            unsafe {
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
            }?;
            Ok(tokio::spawn(async move {
                let _ = woken.await;
            }))
        })
        .await?;
        drop(to_waker);
        // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
        unsafe { gpu.stream_synchronize(lane) }?;
        let _ = helper.join();
    }
    for e in lane_events {
        // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
        let _ = unsafe { gpu.event_destroy(e) };
    }
    // SAFETY: the harness's own handles: streams of its pool (held for the run), events it made on this backend and destroys once, addresses it just allocated.
    let _ = unsafe { gpu.destroy_stream(lane) };

    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!();
    println!("| control (`--controls`) | per op |");
    println!("| --- | --- |");
    println!(
        "| `completion()` alone (record + sequence number), idle stream | {:.2} µs |",
        us(point_only)
    );
    println!(
        "| 8 MiB memset + a spawned task taking the notifier locks 4 times (no driver call): submit loop | {:.2} µs |",
        us(spawn_locks)
    );
    println!(
        "| 8 MiB memset + a spawned task querying a finished event 3 times (no lock): submit loop | {:.2} µs |",
        us(spawn_queries)
    );
    println!(
        "| 8 MiB memset + a spawned task woken from another thread 5 µs later (no GPU, no lock): submit loop | {:.2} µs |",
        us(remote_woken)
    );
    println!(
        "| 8 MiB memset + record + a host function on a second stream waking a spawned task, in the host function / handed to a thread: submit loop | {:.2} / {:.2} µs |",
        us(host_fn_woken[0]),
        us(host_fn_woken[1])
    );
    Ok(())
}
