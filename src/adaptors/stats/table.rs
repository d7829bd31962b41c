//! [`Tally`]: the overall and per-tag counts behind one lock, and the tag
//! look-up that keeps the per-call cost of a tag to a comparison of two
//! words.
//!
//! An [`AllocTag`] is a `&'static str` compared by content, so a hash map
//! keyed by tags hashes the whole string (SipHash) and compares it on every
//! call. But a program names its tags with a handful of literals, each with
//! one fixed address: the table keys its slots by the string's address and
//! length, remembers the last slot used, and compares contents only the
//! first time it meets an address (two literals of the same text, from two
//! crates say, share one slot).

use std::collections::HashMap;

use super::{QueueOutcome, StatsCounts};
use crate::types::AllocTag;
use crate::util::fast_hash::FastMap;

/// A tag's string as two words: its address and its length.
type Address = (usize, usize);

fn address(tag: AllocTag) -> Address {
    (tag.0.as_ptr() as usize, tag.0.len())
}

impl StatsCounts {
    /// Counts an allocation of `bytes`.
    #[inline(always)]
    fn count_allocation(&mut self, bytes: usize) {
        self.count_live(bytes);
        self.total_bytes += bytes as u64;
        self.total_blocks += 1;
    }

    /// Counts a block of `bytes` as held, with the peaks: all the overall
    /// counts move by at an allocation (the totals are the tags' sums).
    #[inline(always)]
    fn count_live(&mut self, bytes: usize) {
        self.current_bytes += bytes;
        self.peak_bytes = self.peak_bytes.max(self.current_bytes);
        self.current_blocks += 1;
        self.peak_blocks = self.peak_blocks.max(self.current_blocks);
    }

    /// Adds the totals of `tag` (everything but the current counts and
    /// their peaks) to these.
    fn add_totals(&mut self, tag: &StatsCounts) {
        self.total_bytes += tag.total_bytes;
        self.total_blocks += tag.total_blocks;
        self.failed_allocations += tag.failed_allocations;
        self.refused_tries += tag.refused_tries;
        self.waited += tag.waited;
        self.wait_total_ns += tag.wait_total_ns;
        self.wait_max_ns = self.wait_max_ns.max(tag.wait_max_ns);
        self.cancelled_waits += tag.cancelled_waits;
    }

    /// Counts a request that left the wait queue after `wait_ns`.
    fn count_wait(&mut self, wait_ns: u64, outcome: QueueOutcome) {
        match outcome {
            QueueOutcome::Served => {
                self.waited += 1;
                self.wait_total_ns += wait_ns;
                self.wait_max_ns = self.wait_max_ns.max(wait_ns);
            }
            QueueOutcome::Failed => self.failed_allocations += 1,
            QueueOutcome::Cancelled => self.cancelled_waits += 1,
        }
    }

    /// Stops counting a block of `bytes`. Saturating: a block allocated
    /// before the stats layer wrapped the resource must not wrap the
    /// counters around.
    #[inline(always)]
    fn count_deallocation(&mut self, bytes: usize) {
        self.current_bytes = self.current_bytes.saturating_sub(bytes);
        self.current_blocks = self.current_blocks.saturating_sub(1);
    }
}

/// Every count of a [`Stats`](super::Stats): overall and per tag.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// The overall current counts and their peaks, which no sum of the
    /// tags' gives (a peak of the whole is not the sum of the tags' peaks).
    /// The other overall counts are the sums of the tags', made on read:
    /// each call adds to one tag's only.
    overall: StatsCounts,
    /// Per-tag counts, in the order the tags were first seen.
    per_tag: Vec<(AllocTag, StatsCounts)>,
    /// Slot in `per_tag` of each tag address met so far.
    by_address: FastMap<Address, usize>,
    /// Slot in `per_tag` of each tag text, for a new address.
    by_text: HashMap<AllocTag, usize>,
    /// The address and slot of the last tag counted: a service allocating
    /// with one tag at a time skips even the map. `(0, 0)` before the
    /// first: no string starts at address 0.
    last: (Address, usize),
}

impl Tally {
    /// Counts an allocation of `bytes` tagged `tag`.
    // Always: the body is a dozen instructions, and out of line it cost a
    // call frame per allocation through a stats layer.
    #[inline(always)]
    pub(super) fn allocation(&mut self, bytes: usize, tag: AllocTag) {
        self.overall.count_live(bytes);
        self.tag(tag).count_allocation(bytes);
    }

    /// Counts the deallocation of a block of `bytes` tagged `tag`.
    #[inline(always)]
    pub(super) fn deallocation(&mut self, bytes: usize, tag: AllocTag) {
        self.overall.count_deallocation(bytes);
        self.tag(tag).count_deallocation(bytes);
    }

    /// Counts a failed allocation tagged `tag`.
    pub(super) fn failure(&mut self, tag: AllocTag) {
        self.tag(tag).failed_allocations += 1;
    }

    /// Counts a try refused while its request waits.
    pub(super) fn refusal(&mut self, tag: AllocTag) {
        self.tag(tag).refused_tries += 1;
    }

    /// Counts a request that left the wait queue after `wait_ns`.
    pub(super) fn wait(&mut self, tag: AllocTag, wait_ns: u64, outcome: QueueOutcome) {
        self.tag(tag).count_wait(wait_ns, outcome);
    }

    /// The overall counts.
    pub(super) fn overall(&self) -> StatsCounts {
        let mut overall = self.overall;
        for (_, counts) in &self.per_tag {
            overall.add_totals(counts);
        }
        overall
    }

    /// The per-tag counts, sorted by tag.
    pub(super) fn per_tag(&self) -> Vec<(AllocTag, StatsCounts)> {
        let mut per_tag = self.per_tag.clone();
        per_tag.sort_by_key(|a| a.0);
        per_tag
    }

    /// The counts of `tag`, made (all zero) on first use.
    #[inline(always)]
    fn tag(&mut self, tag: AllocTag) -> &mut StatsCounts {
        let key = address(tag);
        let slot = match self.last {
            (last, slot) if last == key => slot,
            _ => {
                let slot = self.slot(tag, key);
                self.last = (key, slot);
                slot
            }
        };
        &mut self.per_tag[slot].1
    }

    /// The slot of `tag`, found by address, else by text, else new. Out of
    /// line: kept apart, the maps' code does not weigh on `tag`'s fast path.
    #[cold]
    #[inline(never)]
    fn slot(&mut self, tag: AllocTag, key: Address) -> usize {
        if let Some(&slot) = self.by_address.get(&key) {
            return slot;
        }
        let slot = *self.by_text.entry(tag).or_insert_with(|| {
            self.per_tag.push((tag, StatsCounts::default()));
            self.per_tag.len() - 1
        });
        self.by_address.insert(key, slot);
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_of_equal_text_at_two_addresses_share_counts() {
        // Build the same text at a second address (leaked: tags are static).
        let other: &'static str = Box::leak(String::from("weights").into_boxed_str());
        assert_ne!(other.as_ptr(), "weights".as_ptr());
        let mut t = Tally::default();
        t.allocation(10, AllocTag("weights"));
        t.allocation(20, AllocTag(other));
        t.allocation(5, AllocTag("kv"));
        t.deallocation(10, AllocTag(other));
        t.failure(AllocTag("weights"));
        let per_tag = t.per_tag();
        assert_eq!(per_tag.len(), 2);
        let (tag, w) = per_tag[1];
        assert_eq!(tag, AllocTag("weights"));
        assert_eq!((w.current_bytes, w.peak_bytes, w.total_bytes), (20, 30, 30));
        assert_eq!((w.current_blocks, w.total_blocks), (1, 2));
        assert_eq!(w.failed_allocations, 1);
        assert_eq!(t.overall().current_bytes, 25);
        assert_eq!(t.overall().peak_bytes, 35);
    }

    #[test]
    fn the_overall_totals_are_the_tags_sums_and_the_peaks_the_whole_ones() {
        let mut t = Tally::default();
        t.allocation(10, AllocTag("a"));
        t.deallocation(10, AllocTag("a"));
        t.allocation(20, AllocTag("b"));
        t.failure(AllocTag("a"));
        t.refusal(AllocTag("b"));
        t.refusal(AllocTag("b"));
        t.wait(AllocTag("a"), 30, QueueOutcome::Served);
        t.wait(AllocTag("b"), 50, QueueOutcome::Served);
        t.wait(AllocTag("b"), 7, QueueOutcome::Cancelled);
        t.wait(AllocTag("b"), 9, QueueOutcome::Failed);
        let all = t.overall();
        assert_eq!((all.total_bytes, all.total_blocks), (30, 2));
        assert_eq!((all.current_bytes, all.current_blocks), (20, 1));
        // Never both held at once: the whole's peak is not the tags' sum.
        assert_eq!((all.peak_bytes, all.peak_blocks), (20, 1));
        assert_eq!((all.failed_allocations, all.refused_tries), (2, 2));
        assert_eq!(
            (all.waited, all.wait_total_ns, all.wait_max_ns),
            (2, 80, 50)
        );
        assert_eq!(all.cancelled_waits, 1);
    }
}
