//! [`RetryOnOomResource`]: the decorator that reaps and retries once.

use crate::forward_to_inner;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{ResourceError, ResourceResult};
use crate::resource::DeviceMemoryResource;
use crate::types::{AllocTag, DeviceBlock, StreamId};

/// Retries an allocation once, after reaping, when memory is short.
///
/// The essay of `src/adaptors/retry/` says when it retries.
///
/// # Examples
/// ```
/// use streamalloc::RetryOnOomResource;
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, DeviceMemoryResource, SimResource};
///
/// // A 1 MiB device whose work runs only when the host synchronizes.
/// let gpu = SimGpu::builder().manual().capacity(1 << 20).build();
/// let device = Device::simulated(&gpu, 2);
/// let (a, b) = (device.stream(0)?, device.stream(1)?);
/// let r = RetryOnOomResource::new(SimResource::new(&device));
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
///
/// # Under an `AsyncResource`
/// An allocation awaited through
/// [`AsyncResource`](crate::AsyncResource) runs inside a poll,
/// where the stream-ordered resource's reap does not synchronize: the retry
/// then only sees what was already applied, and when it fails too the
/// allocation waits in the queue until the completion notifications apply
/// the frees. So this adaptor never parks an executor thread.
#[derive(Debug)]
pub struct RetryOnOomResource<R> {
    inner: R,
    retries: AtomicU64,
}

impl<R> RetryOnOomResource<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        RetryOnOomResource {
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

// SAFETY: blocks and streams are the inner resource's, unchanged; every
// call reaches it (an allocation, perhaps more than once).
#[allow(unsafe_code)]
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for RetryOnOomResource<R> {
    forward_to_inner!(inner; deallocate, deallocate_completed, deallocate_unused, device_ordinal, bytes_outstanding, reap_pending, pending_free_seq, reap_through, supports_block_use_tracking, record_block_use, prepare_block_use, finish_block_use, block_state, allocation_cost, allocation_cost_is_exact, frees_across_streams, frees_only_queue, release_idle, allocation_limit, budget_reliefs, capture_status, release_capture, snapshot_into, visit_layers, begin_sleep, settle_sleep, wake);

    /// The inner resource's device, lent as it is (with the charges of
    /// the layers below): this layer counts nothing, so it has nothing to
    /// see of a tier that maps memory itself, and that tier's growth does
    /// what a retry would (gives back its idle mappings, outside a poll
    /// after waiting for the GPU, and asks again). So a cache over a retry
    /// over a budget keeps its arena.
    fn device_access(&self) -> Option<crate::resource::DeviceAccess> {
        self.inner.device_access()
    }

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
}
