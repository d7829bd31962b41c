//! [`HostPoolStats`] and [`HostTagStats`]: what a host pool holds and did.

use crate::types::AllocTag;

/// Bytes and counts of one [`AllocTag`] in a host pool (bytes by size
/// class, as the pool holds them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostTagStats {
    /// Bytes of live host buffers of the tag.
    pub current_bytes: usize,
    /// The most bytes of the tag live at once.
    pub peak_bytes: usize,
    /// Host buffers of the tag handed out so far.
    pub allocations: u64,
}

/// A snapshot of a [`HostPool`](super::HostPool).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostPoolStats {
    /// Pinned bytes held: `in_use + idle + pending`.
    pub held_bytes: usize,
    /// The most pinned bytes held at once.
    pub peak_held_bytes: usize,
    /// Bytes of live host buffers.
    pub in_use_bytes: usize,
    /// Bytes of idle blocks, ready to be handed out.
    pub idle_bytes: usize,
    /// Bytes of dropped buffers whose copies are not yet seen complete.
    pub pending_bytes: usize,
    /// Bytes never handed out again because a copy's use could not be
    /// recorded (see the module's Failure section); not counted in
    /// `held_bytes`.
    pub leaked_bytes: usize,
    /// Blocks pinned (driver calls that pin).
    pub pins: u64,
    /// Blocks unpinned by trims and cap relief.
    pub unpins: u64,
    /// Allocations served by an idle block, with no driver call.
    pub reuses: u64,
    /// The pool's cap.
    pub cap: usize,
    /// The NUMA node asked for, if any.
    pub numa_node: Option<u32>,
    /// Per tag, sorted by tag.
    pub tags: Vec<(AllocTag, HostTagStats)>,
}

impl HostPoolStats {
    /// The statistics of `tag` (all zero if it was never used).
    pub fn tag(&self, tag: AllocTag) -> HostTagStats {
        self.tags
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, s)| *s)
            .unwrap_or_default()
    }
}
