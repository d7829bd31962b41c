//! [`RetryOnOom`]: the decorator that reaps and retries once.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{ResourceError, ResourceResult};
use crate::resource::DeviceMemoryResource;
use crate::types::{Access, AllocTag, BlockId, BlockState, DeviceBlock, StreamId};

/// Retries an allocation once, after reaping, when memory is short.
///
/// See the [module documentation](super).
///
/// # Examples
/// ```
/// use streamalloc::adaptors::RetryOnOom;
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{AllocTag, DeviceMemoryResource, SimResource};
///
/// // A 1 MiB device whose work runs only when the host synchronizes.
/// let gpu = SimGpu::builder().manual().capacity(1 << 20).build();
/// let pool = gpu.stream_pool(2);
/// let (a, b) = (pool.id(0).unwrap(), pool.id(1).unwrap());
/// let r = RetryOnOom::new(SimResource::new(gpu, pool.clone()));
///
/// let block = r.allocate(768 << 10, a, AllocTag::UNTAGGED)?;
/// r.deallocate(block)?; // queued on `a`, not yet executed
/// // Stream `b` cannot reuse it yet: the first try fails, the reap runs
/// // the free, the retry succeeds.
/// let again = r.allocate(768 << 10, b, AllocTag::UNTAGGED)?;
/// assert_eq!(r.retries(), 1);
/// # r.deallocate(again)?;
/// # Ok::<(), streamalloc::ResourceError>(())
/// ```
///
/// # Stream ordering
/// The reap synchronizes the streams that have queued frees, on the calling
/// thread; it runs only on the failure path.
#[derive(Debug)]
pub struct RetryOnOom<R> {
    inner: R,
    retries: AtomicU64,
}

impl<R> RetryOnOom<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        RetryOnOom {
            inner,
            retries: AtomicU64::new(0),
        }
    }

    /// The inner resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// How many allocations were retried.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Acquire)
    }
}

fn memory_short(e: &ResourceError) -> bool {
    matches!(
        e,
        ResourceError::OutOfMemory { .. } | ResourceError::BudgetExceeded { .. }
    )
}

impl<R: DeviceMemoryResource> DeviceMemoryResource for RetryOnOom<R> {
    /// Allocates from the inner resource; when memory is short, reaps and
    /// tries once more.
    ///
    /// # Errors
    /// The retry's error when memory is still short; the first error when it
    /// is of another kind or when the reap itself fails. Nothing changes.
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        match self.inner.allocate(bytes, stream, tag) {
            Err(e) if memory_short(&e) => {
                if let Err(reap) = self.inner.reap_pending() {
                    tracing::debug!(error = %reap, "reap before retry failed");
                    return Err(e);
                }
                self.retries.fetch_add(1, Ordering::AcqRel);
                self.inner.allocate(bytes, stream, tag)
            }
            other => other,
        }
    }

    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.inner.deallocate(block)
    }

    fn device_ordinal(&self) -> u32 {
        self.inner.device_ordinal()
    }

    fn bytes_outstanding(&self) -> usize {
        self.inner.bytes_outstanding()
    }

    fn reap_pending(&self) -> ResourceResult<()> {
        self.inner.reap_pending()
    }

    fn pending_free_seq(&self, stream: StreamId) -> u64 {
        self.inner.pending_free_seq(stream)
    }

    fn reap_through(&self, stream: StreamId, seq: u64) -> usize {
        self.inner.reap_through(stream, seq)
    }

    fn supports_block_use_tracking(&self) -> bool {
        self.inner.supports_block_use_tracking()
    }

    fn record_block_use(&self, block: &DeviceBlock, use_stream: StreamId) -> ResourceResult<()> {
        self.inner.record_block_use(block, use_stream)
    }

    fn prepare_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        self.inner.prepare_block_use(b, s, a)
    }

    fn finish_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        self.inner.finish_block_use(b, s, a)
    }

    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        self.inner.block_state(block)
    }
}
