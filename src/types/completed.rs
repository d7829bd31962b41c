//! [`CompletedUses`]: the crate's word that the GPU is done with a block.

use super::block::BlockId;

/// Proof that every operation queued on the GPU that touches one block has
/// completed, as seen from the host. Only the crate makes one (the futures
/// layer, when an owned buffer is dropped after the completion of its last
/// launch settled), so a safe call cannot claim it falsely; a layer passes
/// it down with the block it names, or drops it (a layer that queues work
/// on the block at its free, such as a debug guard's poison fill, drops
/// it: its free is then an ordinary one).
///
/// See [`DeviceMemoryResource::deallocate_completed`](crate::DeviceMemoryResource::deallocate_completed).
#[derive(Debug, PartialEq, Eq)]
pub struct CompletedUses {
    block: BlockId,
}

impl CompletedUses {
    /// The proof for `block`: the caller saw every use of it complete.
    pub(crate) fn new(block: BlockId) -> Self {
        CompletedUses { block }
    }

    /// The block it speaks for.
    pub fn block(&self) -> BlockId {
        self.block
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::gpu::sim::SimGpu;
    use crate::{
        AllocTag, CachingResource, Device, DeviceMemoryResource, ResourceError, SimResource,
    };

    #[test]
    fn a_proof_for_another_block_is_refused_and_changes_nothing() {
        let gpu = SimGpu::new();
        let device = Device::simulated(&gpu, 1);
        let cache = CachingResource::new(Arc::new(SimResource::new(&device)));
        let s = device.stream(0).unwrap();
        let a = cache.allocate(4096, s, AllocTag::UNTAGGED).unwrap();
        let b = cache.allocate(4096, s, AllocTag::UNTAGGED).unwrap();
        let wrong = CompletedUses::new(b.id());
        assert!(matches!(
            cache.deallocate_completed(a.clone(), wrong),
            Err(ResourceError::UnknownBlock { .. })
        ));
        // Both still live: each frees once.
        cache.deallocate(a.clone()).unwrap();
        assert!(cache.deallocate(a).is_err());
        let proof = CompletedUses::new(b.id());
        assert_eq!(proof.block(), b.id());
        cache.deallocate_completed(b, proof).unwrap();
    }
}
