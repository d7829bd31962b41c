//! Frees queued on the GPU but not yet executed, tallied per stream.
//!
//! Every free gets the next sequence number of its stream. Knowing that
//! "stream S reached sequence n" (a synchronize, or a completion notification
//! placed after the n-th free) drains every entry of S at or below n in one
//! cut, as wgpu-core's `triage_submissions` does with submission indices.
//!
//! Streams are spread over a few padded shards, each under its own lock, so
//! that threads freeing on different streams do not contend. A stream's
//! tallies and the global total change together under its shard's lock, so
//! `total() == per_stream_total()` whenever no call is in flight.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use crate::fast_hash::FastMap;
use crate::padded::CachePadded;
use crate::sync::{AtomicUsize, Mutex, MutexGuard};
use crate::types::StreamId;

#[derive(Debug, Default)]
struct StreamFrees {
    next_seq: u64,
    queue: VecDeque<(u64, usize)>,
    bytes: usize,
}

const SHARDS: usize = 16;

type Shard = CachePadded<Mutex<FastMap<StreamId, StreamFrees>>>;

/// Frees queued per stream, with their sequence numbers.
#[derive(Debug)]
pub struct PendingFrees {
    /// Stream `s` lives in shard `s.index() % SHARDS`.
    shards: Box<[Shard]>,
    total: AtomicUsize,
}

impl Default for PendingFrees {
    fn default() -> Self {
        PendingFrees {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            total: AtomicUsize::new(0),
        }
    }
}

fn lock(shard: &Shard) -> MutexGuard<'_, FastMap<StreamId, StreamFrees>> {
    shard.lock().unwrap_or_else(|p| p.into_inner())
}

impl PendingFrees {
    /// The shard of `stream`, locked.
    fn lock(&self, stream: StreamId) -> MutexGuard<'_, FastMap<StreamId, StreamFrees>> {
        lock(&self.shards[stream.index() as usize % SHARDS])
    }

    /// Tallies a free of `bytes` queued on `stream`; returns its sequence
    /// number. Call after the free was queued on the GPU.
    pub fn push(&self, stream: StreamId, bytes: usize) -> u64 {
        let mut streams = self.lock(stream);
        let entry = streams.entry(stream).or_default();
        entry.next_seq += 1;
        entry.queue.push_back((entry.next_seq, bytes));
        entry.bytes += bytes;
        self.total.fetch_add(bytes, Ordering::AcqRel);
        entry.next_seq
    }

    /// For every stream with pending frees, the sequence number of its latest.
    pub fn high_water(&self) -> Vec<(StreamId, u64)> {
        self.shards
            .iter()
            .flat_map(|shard| {
                lock(shard)
                    .iter()
                    .filter_map(|(s, f)| f.queue.back().map(|&(seq, _)| (*s, seq)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The latest sequence number handed out on `stream` (0 before any).
    pub fn last_seq(&self, stream: StreamId) -> u64 {
        self.lock(stream).get(&stream).map_or(0, |f| f.next_seq)
    }

    /// `stream` reached `seq`: drops every entry at or below it; returns the
    /// bytes drained.
    pub fn drain_through(&self, stream: StreamId, seq: u64) -> usize {
        let mut streams = self.lock(stream);
        let Some(entry) = streams.get_mut(&stream) else {
            return 0;
        };
        let mut drained = 0;
        while let Some(&(s, bytes)) = entry.queue.front() {
            if s > seq {
                break;
            }
            entry.queue.pop_front();
            drained += bytes;
        }
        entry.bytes -= drained;
        self.total.fetch_sub(drained, Ordering::AcqRel);
        drained
    }

    /// Bytes pending on all streams (one atomic load).
    pub fn total(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }

    /// Sum of the per-stream tallies (walks them under the shard locks).
    pub fn per_stream_total(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| lock(shard).values().map(|f| f.bytes).sum::<usize>())
            .sum()
    }

    /// Bytes pending on `stream`.
    pub fn stream_bytes(&self, stream: StreamId) -> usize {
        self.lock(stream).get(&stream).map_or(0, |f| f.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_in_one_cut_per_stream() {
        let p = PendingFrees::default();
        let (a, b) = (StreamId::new(0, 0), StreamId::new(0, 1));
        assert_eq!(p.push(a, 10), 1);
        assert_eq!(p.push(a, 20), 2);
        assert_eq!(p.push(b, 5), 1);
        assert_eq!(p.push(a, 40), 3);
        assert_eq!(p.drain_through(a, 2), 30);
        assert_eq!(p.total(), 45);
        assert_eq!(p.per_stream_total(), 45);
        assert_eq!(p.drain_through(b, 1), 5);
        assert_eq!(p.drain_through(a, 3), 40);
        assert_eq!(p.total(), 0);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Two pushers and a drainer that cuts at the sequence number it read:
    /// the global total and the per-stream tallies agree at the end, and the
    /// drain takes exactly the entries at or below its cut.
    #[test]
    fn push_and_drain_keep_the_tallies_together() {
        loom::model(|| {
            let p = Arc::new(PendingFrees::default());
            let (a, b) = (StreamId::new(0, 0), StreamId::new(0, 1));
            let pusher = {
                let p = p.clone();
                thread::spawn(move || {
                    p.push(a, 10);
                    p.push(b, 20);
                })
            };
            let drainer = {
                let p = p.clone();
                thread::spawn(move || {
                    let seq = p.last_seq(a);
                    (seq, p.drain_through(a, seq))
                })
            };
            p.push(a, 5);
            pusher.join().unwrap();
            let (seq, drained) = drainer.join().unwrap();
            assert_eq!(p.total(), p.per_stream_total());
            assert_eq!(p.total() + drained, 35);
            assert!(seq <= 2);
            assert!(matches!(drained, 0 | 5 | 10 | 15), "drained {drained}");
            assert_eq!(drained == 0, seq == 0);
            assert_eq!(p.stream_bytes(b), 20);
        });
    }
}
