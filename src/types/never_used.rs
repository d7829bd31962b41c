//! [`NeverUsed`]: the crate's word that no work ever touched a block.

use super::block::BlockId;

/// Proof that no operation was ever queued on a block, nor will be, as
/// far as the futures layer sees: the block never left the crate's hands, never made into a buffer, never
/// launched on, never named to the futures layer's block-use hooks. Only
/// the crate makes one (the futures layer, for the blocks a reservation's
/// try took in the same poll before one of its sizes was refused, and for
/// those a reservation still holds when it is dropped, when no use was
/// named to its hooks meanwhile), so a safe call cannot claim it falsely.
/// What the futures layer cannot see, the layer that owns the block does:
/// a use named to the stack's hooks directly, or a sleep's restore at the
/// wake, makes the cache free the block as an ordinary free whatever the
/// proof says. A layer passes it down with the block it names, or drops
/// it (a layer that queues work on the block at its free, such as a debug
/// guard's poison fill, drops it: its free is then an ordinary one).
///
/// See [`DeviceMemoryResource::deallocate_unused`](crate::DeviceMemoryResource::deallocate_unused).
#[derive(Debug, PartialEq, Eq)]
pub struct NeverUsed {
    block: BlockId,
}

impl NeverUsed {
    /// The proof for `block`: the caller took it and hands it back with
    /// nothing queued on it.
    pub(crate) fn new(block: BlockId) -> Self {
        NeverUsed { block }
    }

    /// The block it speaks for.
    pub fn block(&self) -> BlockId {
        self.block
    }
}
