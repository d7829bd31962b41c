//! [`Fences`]: when the GPU is done with what a stream's arena freed, learnt
//! by querying events, never by waiting.
//!
//! # State
//!
//! - **The stamp**: every free on the stream takes the next number; the
//!   page table remembers, per idle handle, the stamp of the free that
//!   left it idle.
//! - **Fences in flight**: events recorded on the stream, each with the
//!   stamp it covers (every free stamped at or below it was queued before
//!   the event), oldest first.
//! - **Done**: the highest stamp whose fence was seen complete. A handle
//!   idle since a stamp at or below it is no longer used by the GPU and
//!   may be unmapped.
//!
//! # Who changes it
//!
//! The stream's shard, under its lock. Fences are recorded only where a
//! handle is wanted back (giving memory back, a trim, the cap) and only
//! when no fence in flight covers the idle handles already; [`poll`]
//! queries the oldest ones.
//!
//! # Bounded
//!
//! At most [`MAX_IN_FLIGHT`] fences per stream: past that, the newest is
//! recorded again (see [`Fences::cover`]).
//!
//! [`poll`]: Fences::poll

// Unsafe here: fences are event records and queries on raw handles of the `Gpu` seam.
#![allow(unsafe_code)]

use std::collections::VecDeque;

use crate::gpu::{Gpu, GpuResult, RawEvent, RawStream};

/// Fences in flight per stream, at most.
const MAX_IN_FLIGHT: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct Fences {
    stamp: u64,
    in_flight: VecDeque<(RawEvent, u64)>,
    done: u64,
    /// Events whose fence completed, for reuse.
    spare: Vec<RawEvent>,
}

impl Fences {
    /// The stamp of a new free.
    pub(crate) fn next_stamp(&mut self) -> u64 {
        self.stamp += 1;
        self.stamp
    }

    /// The stamp of the stream's newest free (0 before any).
    pub(crate) fn stamp(&self) -> u64 {
        self.stamp
    }

    /// The highest stamp the GPU is known to be done with.
    pub(crate) fn done(&self) -> u64 {
        self.done
    }

    /// The host saw the stream with nothing left to run: every free so
    /// far is done.
    pub(crate) fn settle(&mut self) {
        self.done = self.stamp;
    }

    /// Queries the fences in flight, oldest first, and moves `done` past
    /// every complete one. Returns the new `done`.
    ///
    /// # Errors
    /// A failed query; what was learnt before it stays.
    pub(crate) fn poll(&mut self, gpu: &dyn Gpu) -> GpuResult<u64> {
        // One stream's events complete in the order they were recorded:
        // the newest complete means all are (one query where the GPU keeps
        // up, as it mostly does).
        if let Some(&(newest, stamp)) = self.in_flight.back()
            && self.in_flight.len() > 1
            // SAFETY: as below: made by `cover` on `gpu`, live until
            // `destroy`.
            && unsafe { gpu.event_query(newest) }?
        {
            self.done = self.done.max(stamp);
            self.spare.extend(self.in_flight.drain(..).map(|(e, _)| e));
            return Ok(self.done);
        }
        while let Some(&(event, stamp)) = self.in_flight.front() {
            // SAFETY: `gpu` is the tier's backend (every caller passes the
            // tier's `access.gpu`), which made the fence's event in `cover`;
            // fences are destroyed only by `destroy`, when the arena goes.
            if !unsafe { gpu.event_query(event) }? {
                break;
            }
            self.in_flight.pop_front();
            self.done = self.done.max(stamp);
            self.spare.push(event);
        }
        Ok(self.done)
    }

    /// Records a fence on `stream` covering every free so far, unless one in
    /// flight covers `wanted` already. With [`MAX_IN_FLIGHT`] in flight, the
    /// newest is recorded again instead, here: the frees it covered are
    /// then covered by a later point (seen complete later, never earlier),
    /// and a stream that waits on it already stays bound to the record it
    /// waited on (a wait binds to the record current when it is queued,
    /// CUDA's rule). Refusing instead left the frees of a stream far ahead
    /// of the GPU with no fence at all: no other stream could use them,
    /// behind a wait or after, and every allocation there grew the arena
    /// (a simulated service whose frees ran ahead of its kernels held 36×
    /// its live bytes).
    ///
    /// # Errors
    /// A failed event creation or record; nothing changes.
    pub(crate) fn cover(&mut self, gpu: &dyn Gpu, stream: RawStream, wanted: u64) -> GpuResult<()> {
        let covered = self.done.max(self.in_flight.back().map_or(0, |f| f.1));
        if wanted <= covered {
            return Ok(());
        }
        // A fence recorded on a capturing stream would be captured: it never
        // completes on the host, and querying it invalidates the capture.
        // The next cover after the capture records it.
        // SAFETY: `stream` is a stream of the tier's device pool (every
        // caller passes its arena's), which the tier holds.
        if unsafe { gpu.capture_status(stream) }?.is_capturing() {
            return Ok(());
        }
        if self.in_flight.len() >= MAX_IN_FLIGHT {
            // The oldest may have completed: their events serve again.
            let _ = self.poll(gpu);
        }
        if self.in_flight.len() >= MAX_IN_FLIGHT
            && let Some(newest) = self.in_flight.back_mut()
        {
            // SAFETY: a fence in flight: made on `gpu` (the tier's backend,
            // every caller passes it), live until `destroy`; `stream` is a
            // stream of the tier's device pool, which the tier holds.
            unsafe { gpu.event_record(newest.0, stream) }?;
            newest.1 = self.stamp;
            return Ok(());
        }
        let event = match self.spare.pop() {
            Some(e) => e,
            None => gpu.event_create()?,
        };
        // SAFETY: the event was made on `gpu`, the tier's backend (every
        // caller passes it), and is live until `destroy`; `stream` is a
        // stream of the tier's device pool, which the tier holds.
        if let Err(e) = unsafe { gpu.event_record(event, stream) } {
            self.spare.push(event);
            return Err(e);
        }
        self.in_flight.push_back((event, self.stamp));
        Ok(())
    }

    /// The oldest fence in flight covering the free at `stamp`, if one
    /// does: its event, and the stamp of the newest free it covers now.
    /// Another stream that waits on it is ordered after every use of what
    /// was freed up to that stamp: the event was recorded on this stream
    /// after those frees (`cover` records it once the stream's stamp got
    /// there, and a record again only moves it later), and a wait binds to
    /// the record current when it is queued.
    pub(crate) fn covering(&self, stamp: u64) -> Option<(RawEvent, u64)> {
        self.in_flight.iter().find(|&&(_, s)| s >= stamp).copied()
    }

    /// Blocks until every fence in flight is complete (the last resort
    /// before reporting out of memory).
    ///
    /// # Errors
    /// A failed synchronize; `done` stays where it was.
    pub(crate) fn wait_all(&mut self, gpu: &dyn Gpu) -> GpuResult<u64> {
        if let Some(&(event, _)) = self.in_flight.back() {
            // SAFETY: a fence in flight: made on `gpu` (the tier's backend),
            // live until `destroy`.
            unsafe { gpu.event_synchronize(event) }?;
        }
        self.poll(gpu)
    }

    /// Destroys every event (when the arena goes away).
    pub(crate) fn destroy(&mut self, gpu: &dyn Gpu) {
        let events = self
            .in_flight
            .drain(..)
            .map(|f| f.0)
            .chain(self.spare.drain(..));
        for e in events.collect::<Vec<_>>() {
            // SAFETY: every fence was made on `gpu` (the tier's backend) and
            // is destroyed here once, as the arena goes away.
            let _ = unsafe { gpu.event_destroy(e) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::sim::SimGpu;

    #[test]
    fn a_fence_covers_the_frees_before_it_once_complete() {
        let gpu = SimGpu::builder().manual().build();
        let s = gpu.create_stream();
        let mut f = Fences::default();
        let a = f.next_stamp();
        f.cover(&*gpu, s, a).unwrap();
        let b = f.next_stamp();
        assert_eq!(f.poll(&*gpu).unwrap(), 0, "nothing ran yet");
        gpu.run_until_idle();
        assert_eq!(f.poll(&*gpu).unwrap(), a);
        assert!(b > f.done(), "a free after the fence is not covered");
        f.cover(&*gpu, s, b).unwrap();
        f.cover(&*gpu, s, b).unwrap();
        assert_eq!(f.in_flight.len(), 1, "one fence covers it already");
        assert_eq!(f.wait_all(&*gpu).unwrap(), b);
        f.destroy(&*gpu);
    }

    #[test]
    fn with_every_fence_in_flight_the_newest_is_recorded_again() {
        let gpu = SimGpu::builder().manual().build();
        let s = gpu.create_stream();
        let mut f = Fences::default();
        for _ in 0..MAX_IN_FLIGHT {
            let stamp = f.next_stamp();
            f.cover(&*gpu, s, stamp).unwrap();
        }
        let last = f.next_stamp();
        f.cover(&*gpu, s, last).unwrap();
        assert_eq!(f.in_flight.len(), MAX_IN_FLIGHT, "no more events");
        let newest = f.in_flight[MAX_IN_FLIGHT - 1].0;
        assert_eq!(
            f.covering(last),
            Some((newest, last)),
            "the free is covered"
        );
        assert_eq!(
            f.covering(last - 1),
            Some((newest, last)),
            "later, never earlier"
        );
        gpu.run_until_idle();
        assert_eq!(f.poll(&*gpu).unwrap(), last);
        f.destroy(&*gpu);
    }

    #[test]
    fn the_oldest_fence_past_a_free_is_the_one_to_wait_for() {
        let gpu = SimGpu::builder().manual().build();
        let s = gpu.create_stream();
        let mut f = Fences::default();
        let a = f.next_stamp();
        f.cover(&*gpu, s, a).unwrap();
        let b = f.next_stamp();
        let c = f.next_stamp();
        f.cover(&*gpu, s, c).unwrap();
        let (first, second) = (f.in_flight[0].0, f.in_flight[1].0);
        assert_eq!(f.covering(a), Some((first, a)));
        assert_eq!(f.covering(b), Some((second, c)), "recorded after b's free");
        assert_eq!(f.covering(c), Some((second, c)));
        assert_eq!(f.covering(c + 1), None, "no fence after that free yet");
        f.destroy(&*gpu);
    }
}
