//! [`BlockTable`]: the blocks PyTorch holds, by address.
//!
//! # State
//!
//! PyTorch gives back a pointer, never a block: each live allocation's
//! [`DeviceBlock`] is kept here under its address until `free` takes it
//! out, with the streams `record_stream` named for it.
//!
//! # Who changes it
//!
//! `alloc` inserts, `free` removes, `record_stream` adds a stream to an
//! entry. Sixteen shards, chosen by the address's bits above the 512-byte
//! alignment, each behind its own lock held for one map operation (never
//! across a driver call), so threads allocating at once rarely meet.
//!
//! # Failure
//!
//! A pointer that is not in the table (freed twice, or not this
//! allocator's) is reported to the caller, which refuses it.
//!
//! # Bounded
//!
//! By the live allocations.

use std::sync::{Mutex, MutexGuard};

use rustc_hash::FxHashMap;
use streamalloc::{DeviceBlock, StreamId};

const SHARDS: usize = 16;

/// A live allocation: its block, and the streams `record_stream` named.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) block: DeviceBlock,
    pub(crate) uses: Vec<StreamId>,
}

/// The live blocks, by address.
#[derive(Debug, Default)]
pub(crate) struct BlockTable {
    shards: [Mutex<FxHashMap<u64, Entry>>; SHARDS],
}

impl BlockTable {
    fn shard(&self, ptr: u64) -> MutexGuard<'_, FxHashMap<u64, Entry>> {
        // Blocks are 512-byte aligned at least: the bits above pick the shard.
        let index = (ptr >> 9) as usize % SHARDS;
        self.shards[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `block` under its address.
    pub(crate) fn insert(&self, block: DeviceBlock) {
        let ptr = block.ptr();
        self.shard(ptr).insert(
            ptr,
            Entry {
                block,
                uses: Vec::new(),
            },
        );
    }

    /// Takes the entry at `ptr` out.
    pub(crate) fn remove(&self, ptr: u64) -> Option<Entry> {
        self.shard(ptr).remove(&ptr)
    }

    /// Puts an entry a failed free could not give back in again.
    pub(crate) fn restore(&self, entry: Entry) {
        let ptr = entry.block.ptr();
        self.shard(ptr).insert(ptr, entry);
    }

    /// Whether a live block starts at `ptr`.
    pub(crate) fn contains(&self, ptr: u64) -> bool {
        self.shard(ptr).contains_key(&ptr)
    }

    /// Notes that the block at `ptr` is used on `stream`; `false` when no
    /// live block starts there.
    pub(crate) fn record_use(&self, ptr: u64, stream: StreamId) -> bool {
        match self.shard(ptr).get_mut(&ptr) {
            Some(entry) => {
                if !entry.uses.contains(&stream) && stream != entry.block.stream() {
                    entry.uses.push(stream);
                }
                true
            }
            None => false,
        }
    }
}
