//! [`GraphPool`]: the memory one capture's graph holds in one stream's
//! shard, kept from everyone else until the graph is released.
//!
//! A CUDA graph replays the addresses its capture saw. So memory handed out
//! on a capturing stream, and memory freed on one, belongs to the capture
//! (PyTorch's graph-private pools follow the same rules):
//!
//! - **Inside the capture**, a range freed is kept in the pool of the
//!   capture, not in the stream's arena or free lists, and a later
//!   allocation of the same capture on the same stream takes it back
//!   (replays run the same frees and allocations in the same order, so the
//!   reuse is as safe at every replay as it was in the capture). A block
//!   allocated before the capture and freed inside it joins the pool too:
//!   the replays use it up to their free.
//! - **What a capture is served**: only memory no work queued outside the
//!   graph can still touch, since its replays may run on any stream, after
//!   nothing the capturing stream queued before the capture: its own
//!   temporaries (above), memory with no use before, and arena ranges
//!   whose free a fence queried done shows finished. Not the stream's own
//!   recent frees (stream order covers a reuse on that stream only), not a
//!   block allocated before the capture that it freed, not a size-class
//!   block from the free lists (also: one used on another stream would
//!   need a wait joining that stream's work to the capture). A size-class
//!   request in a capture is a graph allocation of the inner resource.
//! - **After the capture**, a block the capture allocated that a user still
//!   holds (the graph's output, say) goes to the pool when freed: the
//!   replays still write it.
//! - **Release** ([`release_capture`](crate::DeviceMemoryResource::release_capture)):
//!   the stream waits for an event recorded on the stream the replays are
//!   ordered on, then the pool's ranges go back to the arena (or its blocks
//!   to the free lists) as if freed at that point, so reuse on the stream
//!   is ordered after the last replay, and reuse elsewhere waits for a
//!   fence after it as any free does. When the stream is capturing at that
//!   moment (a wait would join another capture), the release is deferred
//!   to the next call that finds it not capturing.
//!
//! Pool memory is neither idle nor leased: its pages stay touched (the
//! arena never unmaps them, a trim never sees them), and it counts in the
//! cache's [`graph_bytes`](crate::CachingResource::graph_bytes).
//!
//! # Who changes it
//!
//! The stream's shard, under its lock, like everything of the stream.

use crate::cache::arena::placement::Placed;
use crate::cache::size_class::SizeClass;
use crate::gpu::CaptureId;
use crate::types::{DeviceBlock, StreamId};

/// One capture's memory in one shard.
#[derive(Debug)]
pub(crate) struct GraphPool {
    pub(crate) capture: CaptureId,
    /// Arena ranges freed while the graph owns them, and whether the free
    /// was noted in the capture (a temporary of the graph, allocated and
    /// freed in it: only those serve its later allocations, so that a
    /// checking backend sees every replay allocate and free them in
    /// order). The others (a block from before the capture, the graph's
    /// output freed after it) are noted freed at the release.
    pub(crate) ranges: Vec<(Placed, bool)>,
    /// Size-class blocks freed while the graph owns them: all from before
    /// the capture (a capture's own size-class requests are graph
    /// allocations of the inner resource), so they serve none of its
    /// allocations (see the module docs).
    pub(crate) blocks: Vec<(SizeClass, DeviceBlock)>,
    /// Leases of the shard the capture handed out that users still hold.
    pub(crate) live: usize,
    /// Bytes of `ranges` and `blocks` (their placed or class sizes).
    pub(crate) bytes: usize,
    /// Released, waiting for the stream to leave a capture: the stream
    /// whose end is ordered after the last replay.
    pub(crate) released: Option<StreamId>,
}

/// A range of a pool may serve a request of `len` bytes when it fits and
/// wastes at most as much again (a pool holds few ranges, all kept whole:
/// a small request must not take a large range a later one needs).
pub(crate) fn fits(range: u64, len: u64) -> bool {
    range >= len && range - len <= len
}

impl GraphPool {
    pub(crate) fn new(capture: CaptureId) -> Self {
        GraphPool {
            capture,
            ranges: Vec::new(),
            blocks: Vec::new(),
            live: 0,
            bytes: 0,
            released: None,
        }
    }

    /// Takes the smallest range freed in the capture that [`fits`] `len`.
    pub(crate) fn take_range(&mut self, len: u64) -> Option<Placed> {
        let (i, _) = self
            .ranges
            .iter()
            .enumerate()
            .filter(|(_, (p, noted))| *noted && fits(p.len, len))
            .min_by_key(|(_, (p, _))| p.len)?;
        let (placed, _) = self.ranges.swap_remove(i);
        self.bytes -= placed.len as usize;
        Some(placed)
    }

    /// Keeps a range the graph freed (`noted`: in its capture).
    pub(crate) fn put_range(&mut self, placed: Placed, noted: bool) {
        self.bytes += placed.len as usize;
        self.ranges.push((placed, noted));
    }

    /// Keeps a block the graph freed.
    pub(crate) fn put_block(&mut self, class: SizeClass, block: DeviceBlock) {
        self.bytes += block.size();
        self.blocks.push((class, block));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(off: u64, len: u64) -> Placed {
        Placed { node: 0, off, len }
    }

    #[test]
    fn a_range_serves_requests_up_to_twice_smaller() {
        assert!(fits(4096, 4096));
        assert!(fits(4096, 2048));
        assert!(!fits(4096, 1536), "would waste more than the request");
        assert!(!fits(4096, 8192));
    }

    #[test]
    fn the_smallest_fitting_range_is_taken() {
        let mut pool = GraphPool::new(CaptureId::new(1));
        pool.put_range(placed(0, 8192), true);
        pool.put_range(placed(8192, 4096), true);
        pool.put_range(placed(12288, 16384), true);
        pool.put_range(placed(28672, 4096), false);
        assert_eq!(pool.bytes, 32768);
        assert_eq!(pool.take_range(4096).map(|p| p.off), Some(8192));
        assert_eq!(pool.take_range(4096).map(|p| p.off), Some(0));
        assert_eq!(pool.take_range(4096), None, "16 KiB is too large for 4 KiB");
        assert_eq!(pool.take_range(10000).map(|p| p.off), Some(12288));
        assert_eq!(pool.take_range(4096), None, "not freed in the capture");
        assert_eq!(pool.bytes, 4096);
    }
}
