//! The end of a capture's graph: [`release_capture`](crate::resource::DeviceMemoryResource::release_capture),
//! here [`release_graph`](StreamOrderedResource::release_graph), and the
//! frees of the blocks the graph adopted
//! ([`free_adopted`](StreamOrderedResource::free_adopted)).
//!
//! While a graph lives, the bytes freed in its capture stay counted in the
//! graph's tally (its replays free and re-allocate that memory); a block
//! from outside the capture freed on a capturing stream is adopted by the
//! graph rather than freed at every replay. The release frees, on `after`,
//! the instances the last replay left of blocks users gave to the graph,
//! then the adopted blocks, then moves the graph's bytes to the pending
//! frees of `after`.
//!
//! # Stream ordering
//!
//! The caller orders `after` after the graph's last replay (the release's
//! contract). An adopted block's free also waits for the work queued on
//! its own stream and its recorded uses elsewhere; while one of those
//! streams captures, the release is refused and changes nothing (an event
//! recorded there would be captured).

// Unsafe here: capture queries, event records, waits and frees on raw
// handles of the `Gpu` seam.
#![allow(unsafe_code)]

use super::StreamOrderedResource;
use crate::device::graph_memory::Adopted;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{CaptureId, Gpu, RawStream};
use crate::types::StreamId;

impl<G: Gpu> StreamOrderedResource<G> {
    /// Queues on `after` (`raw_after`) the free of a block the graph of a
    /// released capture adopted: after the work queued on the block's
    /// stream so far and its recorded uses on other streams.
    fn free_adopted(
        &self,
        a: &Adopted,
        after: StreamId,
        raw_after: RawStream,
    ) -> ResourceResult<()> {
        if a.stream != after {
            let raw = self.raw_stream(a.stream)?;
            let event = self.events.take().map_err(ResourceError::from)?;
            // SAFETY: a pooled event of this gpu; `raw` and `raw_after` are
            // streams of this resource's pool (alive). The event goes back
            // to the pool once the wait is queued: a wait keeps the record
            // it saw.
            let ordered = unsafe { self.gpu.event_record(event, raw) }
                .and_then(|()| unsafe { self.gpu.stream_wait_event(raw_after, event) });
            self.events.give([event]);
            ordered.map_err(ResourceError::from)?;
        }
        for &event in &a.events {
            // SAFETY: the block's use events, from this resource's pool and
            // kept out of it until the free is queued.
            unsafe { self.gpu.stream_wait_event(raw_after, event) }.map_err(ResourceError::from)?;
        }
        // SAFETY: `a.ptr` is a live allocation of this gpu (its record left
        // the live set for the graph's tally, and nothing else frees it),
        // used by nothing after what `raw_after` now waits for and the
        // graph's replays (ordered before `after`, the release's contract).
        unsafe { self.gpu.free_async(a.ptr, raw_after) }.map_err(|e| e.for_request(0, after))
    }

    /// [`release_capture`](crate::resource::DeviceMemoryResource::release_capture): frees
    /// on `after` the instances users gave to the graph and the blocks it
    /// adopted, then moves the graph's bytes to the pending frees of
    /// `after`.
    ///
    /// # Errors
    ///
    /// `StreamCapturing` while `after` or an adopted block's stream
    /// captures; a driver error. The adopted blocks not freed yet stay the
    /// graph's, for a later release.
    pub(super) fn release_graph(&self, capture: CaptureId, after: StreamId) -> ResourceResult<()> {
        let raw = self.raw_stream(after)?;
        // SAFETY: `raw` was resolved through `self.stream_pool`, which keeps
        // its streams alive.
        unsafe { self.gpu.capture_status(raw) }?.refuse(after)?;
        // Blocks the graph adopted (freed in the capture, allocated outside
        // it) are freed on `after`, after their own stream's work: refused,
        // changing nothing, while one of those streams captures (an event
        // recorded there would be captured).
        let adopted = self
            .stream_pool
            .kept_graph_memory()
            .lock()
            .take_adopted(capture);
        for a in &adopted {
            let refused = self.raw_stream(a.stream).and_then(|raw| {
                // SAFETY: `raw` was resolved through `self.stream_pool`.
                let status = unsafe { self.gpu.capture_status(raw) }?;
                match status.is_capturing() && a.stream != after {
                    true => Err(ResourceError::StreamCapturing {
                        stream: a.stream,
                        capture: status.id(),
                    }),
                    false => Ok(()),
                }
            });
            if let Err(e) = refused {
                self.stream_pool
                    .kept_graph_memory()
                    .lock()
                    .readopt(capture, adopted);
                return Err(e);
            }
        }
        // The instances the last replay left of blocks users gave to the
        // graph: freed on `after`, behind the last replay, before the bytes
        // move (they are in the graph's tally). Blocks users still hold are
        // theirs to free from now on.
        {
            let ledger = self.stream_pool.kept_graph_memory();
            let mut kept = ledger.lock();
            let frees = kept.release(capture);
            if !frees.ptrs.is_empty() {
                // SAFETY: the pool is this resource's (alive), of `self.gpu`;
                // the addresses are live instances of this gpu's graph
                // allocations which no user holds, and `after` is ordered
                // after the last replay that made them (this fn's contract).
                let (done, queued) = unsafe {
                    crate::device::graph_memory::free_instances(
                        &*self.gpu,
                        |s| self.stream_pool.raw(s),
                        after,
                        &frees,
                    )
                };
                kept.forget(capture, &frees.ptrs[..done]);
                if let Err(e) = queued {
                    kept.readopt(capture, adopted);
                    return Err(e);
                }
            }
        }
        let mut adopted = adopted.into_iter();
        while let Some(a) = adopted.next() {
            if let Err(e) = self.free_adopted(&a, after, raw) {
                let mut rest = vec![a];
                rest.extend(adopted);
                self.stream_pool
                    .kept_graph_memory()
                    .lock()
                    .readopt(capture, rest);
                return Err(e);
            }
            self.events.give(a.events);
        }
        let held: Vec<(usize, usize)> = self
            .shards
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let bytes = s.lock().graph_bytes(capture);
                (bytes > 0).then_some((i, bytes))
            })
            .collect();
        let total: usize = held.iter().map(|&(_, b)| b).sum();
        if total == 0 {
            return Ok(());
        }
        // Counted on `after` before they leave the graphs' tallies, so a
        // concurrent reader may count them twice for a moment, never miss
        // them (a budget above releases late, never early).
        let (index, local) = self.place(after);
        {
            let slot = &self.shards[index];
            let mut shard = slot.lock();
            shard.queue_released(local, total);
            slot.add_outstanding(&shard, total);
        }
        for (i, bytes) in held {
            let slot = &self.shards[i];
            let mut shard = slot.lock();
            shard.take_graph(capture, bytes);
            slot.sub_outstanding(&shard, bytes);
        }
        tracing::trace!(bytes = total, %capture, %after, "release_capture");
        Ok(())
    }
}
