//! [`TracingResource`]: the decorator that emits events.

use crate::forward_to_inner;
use crate::resource::unwind::ReturnOnUnwind;
use crate::util::poll_scope::in_waiting_try;
use std::time::Instant;

use tracing::{Level, debug, enabled, info_span, trace, warn};

use crate::error::{ResourceError, ResourceResult};
use crate::gpu::CaptureId;
use crate::resource::DeviceMemoryResource;
use crate::types::{Access, AllocTag, BlockId, CompletedUses, DeviceBlock, NeverUsed, StreamId};

/// The target of every event and span of [`TracingResource`].
pub const ALLOC_TARGET: &str = "streamalloc::alloc";

/// Emits a [`tracing`] event for every call of the inner resource; forwards
/// every call unchanged, on the target [`ALLOC_TARGET`]. The essay of
/// `src/adaptors/trace/` lists the fields.
///
/// # Examples
/// ```
/// use streamalloc::TracingResource;
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, DeviceMemoryResource, SimResource};
///
/// let gpu = SimGpu::new();
/// let device = Device::simulated(&gpu, 1);
/// let r = TracingResource::new(SimResource::new(&device));
/// // With a subscriber installed, this logs `allocate` with its fields.
/// let block = r.allocate(256, device.stream(0)?, AllocTag("kv-cache"))?;
/// r.deallocate(block)?;
/// # Ok::<(), streamalloc::ResourceError>(())
/// ```
#[derive(Debug)]
pub struct TracingResource<R> {
    inner: R,
}

impl<R> TracingResource<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        TracingResource { inner }
    }

    /// The inner resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

/// A start time, taken only when an event at `level` would be recorded.
macro_rules! start {
    ($level:expr) => {
        if enabled!(target: ALLOC_TARGET, $level) {
            Some(Instant::now())
        } else {
            None
        }
    };
}

/// Whether a subscriber may want this layer's warnings (a failure), and so
/// perhaps its other events: without one, allocations and frees pass
/// through untouched. One load and a compare of `tracing`'s global
/// maximum level, which stays OFF until a subscriber that wants WARN (or
/// more) is set, and is lowered when it goes.
#[inline(always)]
fn warnings_wanted() -> bool {
    use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
    Level::WARN <= STATIC_MAX_LEVEL && Level::WARN <= LevelFilter::current()
}

fn elapsed_ns(start: Option<Instant>) -> u64 {
    start.map_or(0, |t| t.elapsed().as_nanos() as u64)
}

fn access_name(access: Access) -> &'static str {
    match access {
        Access::Read => "read",
        Access::Write => "write",
    }
}

impl<R: DeviceMemoryResource> TracingResource<R> {
    /// Logs a refused allocation: a warning, or a DEBUG event when its
    /// request waits (back-pressure, not a failure).
    #[cold]
    fn allocate_failed(&self, bytes: usize, stream: StreamId, tag: AllocTag, e: &ResourceError) {
        let device = self.inner.device_ordinal();
        if e.is_lack_of_memory() && in_waiting_try() {
            // The futures layer's span, around this event, says how long
            // the request waits.
            debug!(
                target: ALLOC_TARGET,
                device,
                stream = %stream,
                bytes,
                tag = %tag,
                refusal = %e,
                "allocate refused; the request waits"
            );
        } else {
            warn!(
                target: ALLOC_TARGET,
                device,
                stream = %stream,
                bytes,
                tag = %tag,
                error = %e,
                "allocate failed"
            );
        }
    }

    fn hook(
        &self,
        name: &'static str,
        block: BlockId,
        stream: StreamId,
        access: Access,
        call: impl FnOnce() -> ResourceResult<()>,
    ) -> ResourceResult<()> {
        let start = start!(Level::TRACE);
        let result = call();
        let device = self.inner.device_ordinal();
        match &result {
            Ok(()) => trace!(
                target: ALLOC_TARGET,
                device,
                stream = %stream,
                block = %block,
                access = access_name(access),
                elapsed_ns = elapsed_ns(start),
                "{name}"
            ),
            Err(e) => warn!(
                target: ALLOC_TARGET,
                device,
                stream = %stream,
                block = %block,
                access = access_name(access),
                error = %e,
                "{name} failed"
            ),
        }
        result
    }

    /// A free through `free` (a plain or a completed one), logged as
    /// `deallocate` when a subscriber wants it, or as a failure. Inlined
    /// into the caller (one check, one call of the inner resource, and
    /// what the event or a failure's warning names kept); the logging is
    /// out of line.
    #[inline]
    fn logged_free(
        &self,
        block: DeviceBlock,
        free: impl FnOnce(&R, DeviceBlock) -> ResourceResult<()>,
    ) -> ResourceResult<()> {
        // Nothing to log, not even a failure: the block is handed on as
        // it came, none of its fields kept.
        if !warnings_wanted() {
            return free(&self.inner, block);
        }
        let start = start!(Level::DEBUG);
        let (id, ptr, bytes, stream, tag) = (
            block.id(),
            block.ptr(),
            block.size(),
            block.stream(),
            block.tag(),
        );
        let result = free(&self.inner, block);
        if start.is_some() || result.is_err() {
            self.log_free(start, (id, ptr, bytes, stream, tag), &result);
        }
        result
    }

    /// Logs a free: `deallocate` with its time since `start` when a
    /// subscriber wants the event (`start` is set), or its failure.
    #[cold]
    #[inline(never)]
    fn log_free(
        &self,
        start: Option<Instant>,
        (id, ptr, bytes, stream, tag): (BlockId, u64, usize, StreamId, AllocTag),
        result: &ResourceResult<()>,
    ) {
        match result {
            Ok(()) => debug!(
                target: ALLOC_TARGET,
                device = self.inner.device_ordinal(),
                stream = %stream,
                bytes,
                tag = %tag,
                address = ptr,
                block = %id,
                elapsed_ns = elapsed_ns(start),
                "deallocate"
            ),
            Err(e) => self.free_failed(id, ptr, bytes, stream, tag, e),
        }
    }

    /// Logs the allocation `result` holds: `allocate` with its time since
    /// `start` when a subscriber wants the event (`start` is set), the
    /// refusal otherwise. Out of line: the hot path only checks for it.
    #[cold]
    #[inline(never)]
    fn log_allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
        start: Option<Instant>,
        result: &mut ResourceResult<DeviceBlock>,
    ) {
        match result {
            Ok(_) if start.is_none() => return,
            Ok(_) => {}
            // Back-pressure (the request waits in the futures layer's
            // queue, whose span, around this event, says so and for how
            // long) or a failure.
            Err(e) => return self.allocate_failed(bytes, stream, tag, e),
        }
        // Taken out for the guard (and put back below): `result` is `Ok`.
        let Ok(block) = std::mem::replace(result, Err(ResourceError::Shutdown)) else {
            return;
        };
        let device = self.inner.device_ordinal();
        // A subscriber that panics on the event below must not leave the
        // block live with no descriptor: the guard frees it as the panic
        // unwinds.
        let guard = ReturnOnUnwind::new(&self.inner, block);
        debug!(
            target: ALLOC_TARGET,
            device,
            stream = %stream,
            bytes,
            tag = %tag,
            address = guard.block().ptr(),
            block = %guard.block().id(),
            elapsed_ns = elapsed_ns(start),
            "allocate"
        );
        *result = Ok(guard.hand_out());
    }

    /// Logs a refused free.
    #[cold]
    fn free_failed(
        &self,
        id: BlockId,
        ptr: u64,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
        e: &ResourceError,
    ) {
        warn!(
            target: ALLOC_TARGET,
            device = self.inner.device_ordinal(),
            stream = %stream,
            bytes,
            tag = %tag,
            address = ptr,
            block = %id,
            error = %e,
            "deallocate failed"
        );
    }
}

// SAFETY: blocks and streams are the inner resource's, unchanged; every
// call reaches it.
#[allow(unsafe_code)]
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for TracingResource<R> {
    forward_to_inner!(inner; device_ordinal, bytes_outstanding, pending_free_seq, supports_block_use_tracking, block_state, allocation_cost, allocation_cost_is_exact, frees_across_streams, frees_only_queue, release_idle, allocation_limit, budget_reliefs, capture_status, snapshot_into, visit_layers, begin_sleep, settle_sleep, wake);
    #[inline]
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        // No subscriber wants even a failure's warning: nothing to look
        // at, the inner resource's result is handed on where it lies.
        if !warnings_wanted() {
            return self.inner.allocate(bytes, stream, tag);
        }
        // Without a subscriber that wants the event: the call and two
        // checks (no clock, no unwind guard). One call of the inner
        // resource for both ways, its result logged where it lies: two
        // calls, or a logged result handed back from another function,
        // cost a copy of the block into one place on the hot path.
        let start = start!(Level::DEBUG);
        let mut result = self.inner.allocate(bytes, stream, tag);
        if start.is_some() || result.is_err() {
            self.log_allocate(bytes, stream, tag, start, &mut result);
        }
        result
    }

    #[inline]
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.logged_free(block, |inner, block| inner.deallocate(block))
    }

    #[inline]
    fn deallocate_completed(
        &self,
        block: DeviceBlock,
        completed: CompletedUses,
    ) -> ResourceResult<()> {
        self.logged_free(block, |inner, block| {
            inner.deallocate_completed(block, completed)
        })
    }

    #[inline]
    fn deallocate_unused(&self, block: DeviceBlock, unused: NeverUsed) -> ResourceResult<()> {
        self.logged_free(block, |inner, block| inner.deallocate_unused(block, unused))
    }

    fn reap_pending(&self) -> ResourceResult<()> {
        let device = self.inner.device_ordinal();
        let span = info_span!(target: ALLOC_TARGET, "reap_pending", device);
        let _entered = span.enter();
        let start = start!(Level::INFO);
        let before = self.inner.bytes_outstanding();
        let result = self.inner.reap_pending();
        let drained = before.saturating_sub(self.inner.bytes_outstanding());
        match &result {
            Ok(()) => tracing::info!(
                target: ALLOC_TARGET,
                device,
                bytes = drained,
                elapsed_ns = elapsed_ns(start),
                "reaped"
            ),
            Err(e) => {
                warn!(target: ALLOC_TARGET, device, bytes = drained, error = %e, "reap failed")
            }
        }
        result
    }

    fn release_capture(&self, capture: CaptureId, after: StreamId) -> ResourceResult<()> {
        let result = self.inner.release_capture(capture, after);
        let device = self.inner.device_ordinal();
        match &result {
            Ok(()) => {
                debug!(target: ALLOC_TARGET, device, capture = %capture, after = %after, "release_capture")
            }
            Err(e) => warn!(
                target: ALLOC_TARGET,
                device,
                capture = %capture,
                after = %after,
                error = %e,
                "release_capture failed"
            ),
        }
        result
    }

    fn reap_through(&self, stream: StreamId, seq: u64) -> usize {
        let start = start!(Level::DEBUG);
        let drained = self.inner.reap_through(stream, seq);
        debug!(
            target: ALLOC_TARGET,
            device = self.inner.device_ordinal(),
            stream = %stream,
            seq,
            bytes = drained,
            elapsed_ns = elapsed_ns(start),
            "reap_through"
        );
        drained
    }

    fn record_block_use(&self, block: &DeviceBlock, use_stream: StreamId) -> ResourceResult<()> {
        self.hook(
            "record_block_use",
            block.id(),
            use_stream,
            Access::Read,
            || self.inner.record_block_use(block, use_stream),
        )
    }

    fn prepare_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        self.hook("prepare_block_use", b, s, a, || {
            self.inner.prepare_block_use(b, s, a)
        })
    }

    fn finish_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        self.hook("finish_block_use", b, s, a, || {
            self.inner.finish_block_use(b, s, a)
        })
    }
}
