//! Traces the cache was never tuned on: shapes of real workloads built from
//! a seed, so that a policy that holds memory close to what is live on the
//! two recorded GPT-2 traces is checked against others too.
//!
//! Every generator is deterministic (its seed fixes every size and every
//! order) and returns a checked [`Trace`]: each free names a live block of
//! its size, on a stream the trace counts, and every block is freed by the
//! end.
//!
//! - [`scaled`]: a recorded trace with every size multiplied (a model of
//!   half or twice the width, the same program);
//! - [`ramp`]: pure growth, blocks of mixed sizes that are never freed
//!   until the end (loading weights, a cache filling up);
//! - [`sawtooth`]: phases of large blocks allocated up to a level and freed,
//!   with the sizes changing between phases (pipelines of big buffers);
//! - [`layered`]: forward and backward passes over a stack of layers at a
//!   varying batch size, activations freed in reverse, a few long-lived
//!   blocks growing between passes (training and inference with changing
//!   shapes);
//! - [`many_streams`]: independent workers on their own streams, each
//!   churning blocks of mixed sizes, some freed from another stream;
//! - [`plateau_then_spike`]: a long steady state of small churn, then a
//!   jump to a new peak with large blocks (the top of the trace comes after
//!   memory has been laid out for something else);
//! - [`kv_serving`]: requests served concurrently, one per stream, each
//!   growing a key/value cache per layer by a token a step (`torch.cat`:
//!   the grown copy allocated, then the old one freed), and freeing it all
//!   when done while the other streams keep growing theirs.

use std::collections::HashMap;

use super::format::{OpKind, Trace, TraceOp};

const MIB: usize = 1 << 20;

/// Builds a trace op by op, keeping the blocks live so that frees are
/// always of live blocks.
#[derive(Debug, Default)]
struct Builder {
    ops: Vec<TraceOp>,
    next: u64,
    sizes: HashMap<u64, (usize, u32)>,
}

impl Builder {
    fn alloc(&mut self, size: usize, stream: u32) -> u64 {
        let id = self.next;
        self.next += 1;
        self.sizes.insert(id, (size, stream));
        self.ops.push(TraceOp {
            kind: OpKind::Alloc,
            id,
            size,
            stream,
        });
        id
    }

    /// Frees `id` from `stream` (its allocation stream when `None`).
    fn free_from(&mut self, id: u64, stream: Option<u32>) {
        let (size, home) = self.sizes.remove(&id).expect("a live block");
        self.ops.push(TraceOp {
            kind: OpKind::Free,
            id,
            size,
            stream: stream.unwrap_or(home),
        });
    }

    fn free(&mut self, id: u64) {
        self.free_from(id, None);
    }

    /// Frees what is left, oldest first, and returns the trace.
    fn finish(mut self) -> Trace {
        let mut left: Vec<u64> = self.sizes.keys().copied().collect();
        left.sort_unstable();
        for id in left {
            self.free(id);
        }
        let streams = self
            .ops
            .iter()
            .map(|op| op.stream as usize + 1)
            .max()
            .unwrap_or(0);
        Trace {
            ops: self.ops,
            streams,
        }
    }
}

/// A size between `lo` and `hi` bytes, uniform in its logarithm (as tensor
/// sizes of a model spread over orders of magnitude), a multiple of 512.
fn log_uniform(rng: &mut fastrand::Rng, lo: usize, hi: usize) -> usize {
    let (l, h) = ((lo.max(1) as f64).ln(), (hi.max(lo + 1) as f64).ln());
    let size = (l + rng.f64() * (h - l)).exp() as usize;
    size.clamp(lo, hi).next_multiple_of(512)
}

/// `trace` with every size multiplied by `factor` (at least one byte).
pub fn scaled(trace: &Trace, factor: f64) -> Trace {
    let ops = trace
        .ops
        .iter()
        .map(|op| TraceOp {
            size: ((op.size as f64 * factor).round() as usize).max(1),
            ..*op
        })
        .collect();
    Trace {
        ops,
        streams: trace.streams,
    }
}

/// Blocks of 4 KiB to 256 MiB (log-uniform) allocated until `total` bytes
/// are live, one in eight of the small ones freed again soon after.
pub fn ramp(seed: u64, total: usize) -> Trace {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut b = Builder::default();
    let mut live = 0;
    let mut scratch = Vec::new();
    while live < total {
        let size = log_uniform(&mut rng, 4 << 10, 256 * MIB);
        let id = b.alloc(size, 0);
        if size < MIB && rng.u8(..8) == 0 {
            scratch.push(id);
        } else {
            live += size;
        }
        if scratch.len() > 4 {
            let id = scratch.remove(0);
            b.free(id);
        }
    }
    b.finish()
}

/// `phases` phases, each allocating blocks of one phase-wide size range
/// (between 16 MiB and 1 GiB) until about `level` bytes are live, then
/// freeing them in a random order, half of them before the next phase
/// starts.
pub fn sawtooth(seed: u64, phases: usize, level: usize) -> Trace {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut b = Builder::default();
    let mut live: Vec<(u64, usize)> = Vec::new();
    for _ in 0..phases {
        let lo = log_uniform(&mut rng, 16 * MIB, 256 * MIB);
        let hi = (lo * rng.usize(2..5)).min(1 << 30);
        let mut bytes: usize = live.iter().map(|&(_, s)| s).sum();
        while bytes < level {
            let size = log_uniform(&mut rng, lo, hi);
            live.push((b.alloc(size, 0), size));
            bytes += size;
        }
        rng.shuffle(&mut live);
        let keep = live.len() / 2;
        for (id, _) in live.drain(keep..) {
            b.free(id);
        }
    }
    b.finish()
}

/// `passes` forward and backward passes over `layers` layers at a batch of
/// 1 to 16: each layer's forward allocates a few activations (sizes
/// proportional to the batch) kept for the backward, and a workspace
/// freed at once; the backward frees them in reverse while allocating
/// gradients. Weights (`layers` blocks of 8 to 64 MiB) live throughout, and
/// every few passes a long-lived block grows (a cache of keys and values).
pub fn layered(seed: u64, layers: usize, passes: usize) -> Trace {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut b = Builder::default();
    for _ in 0..layers {
        let size = log_uniform(&mut rng, 8 * MIB, 64 * MIB);
        b.alloc(size, 0);
    }
    let shapes: Vec<[usize; 3]> = (0..layers)
        .map(|_| {
            [
                log_uniform(&mut rng, 256 << 10, 4 * MIB),
                log_uniform(&mut rng, 512 << 10, 8 * MIB),
                log_uniform(&mut rng, 64 << 10, MIB),
            ]
        })
        .collect();
    let mut kv: Option<(u64, usize)> = None;
    for pass in 0..passes {
        let batch = rng.usize(1..=16);
        let mut saved = Vec::new();
        for shape in &shapes {
            for &unit in shape {
                saved.push(b.alloc(unit * batch, 0));
            }
            let work = b.alloc(shape[1] * batch * 2, 0);
            b.free(work);
        }
        while let Some(id) = saved.pop() {
            let grad = b.alloc(shapes[0][0] * batch, 0);
            b.free(id);
            b.free(grad);
        }
        if pass % 4 == 3 {
            let grown = kv.map_or(32 * MIB, |(_, s)| s + s / 4);
            let new = b.alloc(grown, 0);
            if let Some((old, _)) = kv.take() {
                b.free(old);
            }
            kv = Some((new, grown));
        }
    }
    b.finish()
}

/// `streams` workers, one per stream, taking turns: each allocates blocks
/// of 512 B to 64 MiB (log-uniform) and keeps up to `per_stream` of them
/// live, freeing a random one when it has too many; one free in sixteen is
/// made from the next stream (a block used there last).
pub fn many_streams(seed: u64, streams: u32, per_stream: usize, ops: usize) -> Trace {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut b = Builder::default();
    let mut live: Vec<Vec<u64>> = vec![Vec::new(); streams as usize];
    let mut done = 0;
    while done < ops {
        let s = rng.u32(..streams);
        let mine = &mut live[s as usize];
        if mine.len() >= per_stream || (!mine.is_empty() && rng.bool()) {
            let id = mine.swap_remove(rng.usize(..mine.len()));
            let from = (rng.u8(..16) == 0).then(|| (s + 1) % streams);
            b.free_from(id, from);
        } else {
            let size = log_uniform(&mut rng, 512, 64 * MIB);
            mine.push(b.alloc(size, s));
        }
        done += 1;
    }
    b.finish()
}

/// `steady` operations of small churn (blocks of 4 KiB to 4 MiB, about
/// 512 MiB live, freed at random), then a spike: blocks of 64 to 512 MiB
/// until `spike` more bytes are live, freed, and the churn again.
pub fn plateau_then_spike(seed: u64, steady: usize, spike: usize) -> Trace {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut b = Builder::default();
    let mut churn: Vec<(u64, usize)> = Vec::new();
    let mut bytes = 0usize;
    let mut step = |b: &mut Builder, rng: &mut fastrand::Rng| {
        if bytes > 512 * MIB || (!churn.is_empty() && rng.u8(..3) == 0) {
            let (id, size) = churn.swap_remove(rng.usize(..churn.len()));
            b.free(id);
            bytes -= size;
        } else {
            let size = log_uniform(rng, 4 << 10, 4 * MIB);
            churn.push((b.alloc(size, 0), size));
            bytes += size;
        }
    };
    for _ in 0..steady {
        step(&mut b, &mut rng);
    }
    let mut big = Vec::new();
    let mut added = 0;
    while added < spike {
        let size = log_uniform(&mut rng, 64 * MIB, 512 * MIB);
        big.push(b.alloc(size, 0));
        added += size;
        step(&mut b, &mut rng);
    }
    for id in big {
        b.free(id);
    }
    for _ in 0..steady / 4 {
        step(&mut b, &mut rng);
    }
    b.finish()
}

/// `streams` requests served at once, one per stream, `requests` in all,
/// decode steps taken round robin over the streams. A request has a batch
/// of 1 to 8, a prompt of 16 to 768 tokens and 16 to 256 new ones; per
/// layer (`layers`) it holds a key and a value cache of 2 KiB a token and
/// batch row (a hidden size of 1,024 in 16-bit floats). Each step grows
/// every cache by a token as `torch.cat` does (the grown copy allocated,
/// then the old one freed) around a few activations freed within the
/// step; a request done frees its caches, and its stream takes the next.
pub fn kv_serving(seed: u64, streams: u32, layers: usize, requests: usize) -> Trace {
    /// Bytes of one layer's key (or value) cache per token and batch row.
    const ROW: usize = 2 << 10;
    struct Request {
        batch: usize,
        tokens: usize,
        left: usize,
        caches: Vec<u64>,
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut b = Builder::default();
    let mut started = 0;
    let mut start = |b: &mut Builder, rng: &mut fastrand::Rng, stream: u32| {
        if started == requests {
            return None;
        }
        started += 1;
        let (batch, tokens) = (rng.usize(1..=8), rng.usize(16..=768));
        // The prefill: the caches at the prompt's length, and its
        // activations, freed once the caches are written.
        let work = b.alloc(batch * tokens * 4 * ROW, stream);
        let caches = (0..2 * layers)
            .map(|_| b.alloc(batch * tokens * ROW, stream))
            .collect();
        b.free(work);
        Some(Request {
            batch,
            tokens,
            left: rng.usize(16..=256),
            caches,
        })
    };
    let mut serving: Vec<Option<Request>> =
        (0..streams).map(|s| start(&mut b, &mut rng, s)).collect();
    while serving.iter().any(Option::is_some) {
        for (s, slot) in serving.iter_mut().enumerate() {
            let stream = s as u32;
            let Some(req) = slot else { continue };
            req.tokens += 1;
            for cache in &mut req.caches {
                let scores = b.alloc(req.batch * req.tokens * 64, stream);
                let grown = b.alloc(req.batch * req.tokens * ROW, stream);
                b.free(*cache);
                b.free(scores);
                *cache = grown;
            }
            let logits = b.alloc(req.batch * 50_304 * 2, stream);
            b.free(logits);
            req.left -= 1;
            if req.left == 0 {
                for &cache in &req.caches {
                    b.free(cache);
                }
                *slot = start(&mut b, &mut rng, stream);
            }
        }
    }
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Requested;

    /// Every free names a live block of its size; nothing is left live.
    fn checked(trace: &Trace) {
        let mut live = HashMap::new();
        for op in &trace.ops {
            assert!((op.stream as usize) < trace.streams);
            match op.kind {
                OpKind::Alloc => assert!(live.insert(op.id, op.size).is_none()),
                OpKind::Free => assert_eq!(live.remove(&op.id), Some(op.size)),
            }
        }
        assert!(live.is_empty());
        assert_eq!(*Requested::of(trace).after.last().unwrap(), 0);
    }

    #[test]
    fn every_generator_makes_a_checked_trace_the_same_at_every_run() {
        let all = [
            ramp(1, 512 * MIB),
            sawtooth(2, 4, 512 * MIB),
            layered(3, 6, 8),
            many_streams(4, 4, 8, 2000),
            plateau_then_spike(5, 2000, 512 * MIB),
            kv_serving(6, 3, 2, 5),
        ];
        for trace in &all {
            checked(trace);
        }
        assert_eq!(ramp(1, 512 * MIB), all[0], "deterministic");
        assert_eq!(many_streams(4, 4, 8, 2000).streams, 4);
        let half = scaled(&all[0], 0.5);
        checked(&half);
        let peak = |t: &Trace| Requested::of(t).peak as f64;
        assert!((peak(&half) / peak(&all[0]) - 0.5).abs() < 0.01);
    }
}
