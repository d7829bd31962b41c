//! [`StreamFrees`]: the frees of one stream that are queued on the GPU but
//! not yet known to have run, with sequence numbers.
//!
//! Every free gets the next sequence number of its stream. Knowing that
//! "stream S reached sequence n" (a synchronize, or a completion notification
//! placed after the n-th free) drains every entry of S at or below n in one
//! cut, as wgpu-core's `triage_submissions` does with submission indices.
//!
//! # Bounded without a reaper
//!
//! A cut is only ever made at a number someone read ([`observe`] or
//! [`high_water`]): a completion point covers "every free up to the number I
//! read before recording it". So frees queued since the last read are kept
//! as one entry (the newest number, the bytes summed), and the queue holds
//! one entry per read rather than one per free: a program that frees and
//! never reaps keeps one entry per stream instead of growing without bound.
//! A cut at a number nobody read drains the entries at or below it, which
//! may leave a few frees below it pending (never drains one above it).
//!
//! The tallies are plain fields: the resource keeps each stream's frees in
//! the shard of its live blocks, under that shard's lock.
//!
//! [`observe`]: StreamFrees::observe
//! [`high_water`]: StreamFrees::high_water

use std::collections::VecDeque;

/// One stream's queued frees; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct StreamFrees {
    /// The number of the latest free (0 before any).
    last_seq: u64,
    /// The highest number read out; entries above it may be merged.
    observed: u64,
    /// `(number of the newest free in the entry, bytes)`, oldest first.
    queue: VecDeque<(u64, usize)>,
    bytes: usize,
}

impl StreamFrees {
    /// Tallies a free of `bytes` queued on the stream; returns its sequence
    /// number. Call after the free was queued on the GPU.
    pub(crate) fn push(&mut self, bytes: usize) -> u64 {
        self.last_seq += 1;
        self.bytes += bytes;
        match self.queue.back_mut() {
            // No one read the newest entry's number: no cut can fall on it.
            Some(entry) if entry.0 > self.observed => {
                entry.0 = self.last_seq;
                entry.1 += bytes;
            }
            _ => self.queue.push_back((self.last_seq, bytes)),
        }
        self.last_seq
    }

    /// The latest sequence number handed out (0 before any); a cut may fall
    /// on it from now on.
    pub(crate) fn observe(&mut self) -> u64 {
        self.observed = self.last_seq;
        self.last_seq
    }

    /// The number of the latest pending free, when any is pending (observed,
    /// as by [`observe`](Self::observe)).
    pub(crate) fn high_water(&mut self) -> Option<u64> {
        let seq = self.queue.back()?.0;
        self.observed = self.observed.max(seq);
        Some(seq)
    }

    /// The stream reached `seq`: drops every entry at or below it; returns
    /// the bytes drained.
    ///
    /// A number past the latest free (one never handed out, such as
    /// `u64::MAX`) drains nothing: it claims frees that may not have run.
    pub(crate) fn drain_through(&mut self, seq: u64) -> usize {
        if seq > self.last_seq {
            return 0;
        }
        let mut drained = 0;
        while let Some(&(s, bytes)) = self.queue.front() {
            if s > seq {
                break;
            }
            self.queue.pop_front();
            drained += bytes;
        }
        self.bytes -= drained;
        drained
    }

    /// Bytes pending on the stream.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Entries pending (frees queued between two reads of the numbers
    /// share one).
    pub(crate) fn entries(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_in_one_cut_at_every_number_read() {
        let mut p = StreamFrees::default();
        assert_eq!(p.observe(), 0);
        assert_eq!(p.push(10), 1);
        assert_eq!(p.observe(), 1);
        assert_eq!(p.push(20), 2);
        assert_eq!(p.observe(), 2);
        assert_eq!(p.push(40), 3);
        assert_eq!(p.drain_through(2), 30);
        assert_eq!(p.bytes(), 40);
        assert_eq!(p.high_water(), Some(3));
        assert_eq!(p.drain_through(3), 40);
        assert_eq!(p.bytes(), 0);
        assert_eq!(p.high_water(), None);
    }

    #[test]
    fn frees_between_reads_share_one_entry() {
        let mut p = StreamFrees::default();
        for i in 1..=1000 {
            assert_eq!(p.push(1), i);
        }
        assert_eq!(p.queue.len(), 1);
        assert_eq!(p.observe(), 1000);
        p.push(5);
        p.push(5);
        assert_eq!(p.queue.len(), 2);
        // A cut below the first read drains nothing (never too much).
        assert_eq!(p.drain_through(999), 0);
        assert_eq!(p.drain_through(1000), 1000);
        assert_eq!(p.drain_through(1002), 10);
        assert_eq!(p.bytes(), 0);
    }
}
