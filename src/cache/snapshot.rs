//! The cache's part of a [`MemorySnapshot`]: its blocks and its idle
//! memory.
//!
//! - **Blocks**: every lease of every shard, read under that shard's lock
//!   (one at a time, as an allocation takes them): address, the size it
//!   takes in the cache (a size class, an arena range), the size asked,
//!   stream, tag and the uses recorded on other streams. Not its age: a
//!   clock read at every hit would cost a fifth of one, so a snapshot
//!   taken through [`AsyncResource`](crate::AsyncResource) dates a block
//!   from the history's allocation event at its address, where the
//!   history records.
//! - **Segments**: the arena's range (the tier's lock, after the shards'),
//!   with what is mapped and the free ranges and kept blocks with the
//!   memory behind them; or, for the size classes, each cached block, idle
//!   in whole.
//!
//! The shards and the arena are read one after the other, each consistent
//! in itself; a block handed out between two reads shows as a lease and
//! may still show in the free ranges read after.

use super::arena::tier::ArenaTier;
use super::shard::Backing;
use super::shards::Shards;
use crate::observe::{BlockInfo, BlockInfoState, MemorySnapshot, SegmentInfo};

/// Adds the cache's blocks and segments to `snapshot`.
pub(super) fn snapshot_into(
    shards: &Shards,
    arena: Option<&ArenaTier>,
    snapshot: &mut MemorySnapshot,
) {
    let mut kept = Vec::new();
    for slot in shards.slots.iter() {
        let shard = slot.lock();
        for lease in shard.leases() {
            let (size, tag, pending_uses) = match &lease.backing {
                Backing::Inner(block) => (block.size(), block.tag(), 0),
                Backing::Mapped(m) => (m.placed.len as usize, m.tag, m.event_count()),
            };
            snapshot.blocks.push(BlockInfo {
                layer: "cache",
                address: lease.backing.ptr(),
                size,
                requested: lease.size,
                stream: lease.stream.index(),
                tag: tag.0,
                // From the history, where it records (see the module docs).
                age: None,
                state: match lease.capture {
                    Some(_) => BlockInfoState::Graph,
                    None => BlockInfoState::Live,
                },
                pending_uses,
            });
        }
        for block in shard.free_blocks() {
            snapshot.segments.push(SegmentInfo {
                layer: "cache",
                address: block.ptr(),
                reserved: block.size(),
                mapped: block.size(),
                idle: block.size(),
                largest_idle: block.size(),
                stream: Some(block.stream().index()),
                expandable: false,
                free_ranges: vec![(block.ptr(), block.size(), block.size())],
            });
        }
        if let Some(ss) = &shard.arena {
            kept.extend(ss.kept_blocks());
        }
    }
    if let Some(segment) = arena.and_then(|a| a.vm.segment(&kept)) {
        snapshot.segments.push(segment);
    }
}
