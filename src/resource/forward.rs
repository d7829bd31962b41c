//! `forward_to_inner!`: the methods a decorator passes through unchanged.
//!
//! A decorator (an adaptor, the cache, a user's own layer) changes a few
//! methods of [`DeviceMemoryResource`](super::DeviceMemoryResource) and must
//! forward all the others, the block-use hooks and the reaping included, or
//! a stack silently loses frees or tracking. The trait has no defaults for
//! them, so a decorator that forgets one does not compile; this macro
//! writes the forwards from a list of names, so what a decorator changes is
//! what its `impl` block shows. It is exported as the checked way for
//! third-party decorators to forward what they do not change.

/// Inside an `unsafe impl DeviceMemoryResource for …` block, writes each
/// named method as a plain call of the same method on `self.$field`.
///
/// `$field` is the field holding the wrapped resource (a name, or `0` for a
/// tuple struct). Each name is a method of
/// [`DeviceMemoryResource`](crate::DeviceMemoryResource), or one of its
/// groups (see "Methods, by group" there): `frees`, `use_tracking`,
/// `capture`, `costs`, `sleep`, `observing`. `all_but_allocate` names every
/// method but `allocate` and `device_access` (a decorator keeps the
/// provided `None` there, so that a tier above allocates through it and it
/// sees every byte).
///
/// This is the checked way for a decorator outside the crate to pass on
/// what it does not change: the trait has no default for a method that
/// moves bytes or tracks uses, so a method neither written nor named here
/// fails to compile, and one named twice (written and forwarded) too.
///
/// # Examples
/// ```
/// use streamalloc::{AllocTag, DeviceBlock, DeviceMemoryResource, ResourceResult, StreamId};
///
/// /// Refuses allocations over `max` bytes; forwards everything else.
/// struct Capped<R>(R, usize);
///
/// // SAFETY: blocks and streams are the inner resource's, unchanged.
/// unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for Capped<R> {
///     fn allocate(&self, bytes: usize, stream: StreamId, tag: AllocTag) -> ResourceResult<DeviceBlock> {
///         if bytes > self.1 {
///             let limit = self.1;
///             return Err(streamalloc::ResourceError::BudgetExceeded { requested: bytes, limit, in_use: 0 });
///         }
///         self.0.allocate(bytes, stream, tag)
///     }
///     streamalloc::forward_to_inner!(0; deallocate, device_ordinal, bytes_outstanding,
///         frees, use_tracking, capture, allocation_cost, allocation_cost_is_exact,
///         budget_reliefs, sleep, observing);
///     fn allocation_limit(&self) -> Option<usize> {
///         Some(self.0.allocation_limit().map_or(self.1, |l| l.min(self.1)))
///     }
/// }
/// ```
#[macro_export]
macro_rules! forward_to_inner {
    ($field:tt; $($method:ident),+ $(,)?) => {
        $( $crate::forward_to_inner!(@one $field $method); )+
    };
    // The groups of the trait's documentation ("Methods, by group").
    (@one $f:tt all_but_allocate) => {
        $crate::forward_to_inner!($f; deallocate, device_ordinal, bytes_outstanding, frees,
            use_tracking, capture, costs, sleep, observing);
    };
    (@one $f:tt frees) => {
        $crate::forward_to_inner!($f; deallocate_completed, deallocate_unused, reap_pending,
            pending_free_seq, reap_through, release_idle, frees_across_streams, frees_only_queue);
    };
    (@one $f:tt use_tracking) => {
        $crate::forward_to_inner!($f; supports_block_use_tracking, record_block_use,
            prepare_block_use, finish_block_use, block_state);
    };
    (@one $f:tt capture) => {
        $crate::forward_to_inner!($f; capture_status, release_capture);
    };
    (@one $f:tt costs) => {
        $crate::forward_to_inner!($f; allocation_cost, allocation_cost_is_exact,
            allocation_limit, budget_reliefs);
    };
    (@one $f:tt sleep) => {
        $crate::forward_to_inner!($f; begin_sleep, settle_sleep, wake);
    };
    (@one $f:tt observing) => {
        $crate::forward_to_inner!($f; snapshot_into, visit_layers);
    };
    // One method each.
    (@one $f:tt begin_sleep) => {
        fn begin_sleep(
            &self,
            plan: &$crate::SleepPlan,
        ) -> $crate::ResourceResult<::std::vec::Vec<$crate::StreamId>> {
            self.$f.begin_sleep(plan)
        }
    };
    (@one $f:tt settle_sleep) => {
        fn settle_sleep(&self) -> $crate::ResourceResult<bool> {
            self.$f.settle_sleep()
        }
    };
    (@one $f:tt wake) => {
        fn wake(&self) -> $crate::ResourceResult<::std::vec::Vec<$crate::StreamId>> {
            self.$f.wake()
        }
    };
    (@one $f:tt visit_layers) => {
        fn visit_layers(&self, visit: &mut dyn FnMut(&dyn ::std::any::Any)) {
            self.$f.visit_layers(visit)
        }
    };
    (@one $f:tt deallocate) => {
        fn deallocate(&self, block: $crate::DeviceBlock) -> $crate::ResourceResult<()> {
            self.$f.deallocate(block)
        }
    };
    (@one $f:tt deallocate_completed) => {
        fn deallocate_completed(
            &self,
            block: $crate::DeviceBlock,
            completed: $crate::CompletedUses,
        ) -> $crate::ResourceResult<()> {
            self.$f.deallocate_completed(block, completed)
        }
    };
    (@one $f:tt deallocate_unused) => {
        fn deallocate_unused(
            &self,
            block: $crate::DeviceBlock,
            unused: $crate::NeverUsed,
        ) -> $crate::ResourceResult<()> {
            self.$f.deallocate_unused(block, unused)
        }
    };
    (@one $f:tt device_ordinal) => {
        fn device_ordinal(&self) -> u32 {
            self.$f.device_ordinal()
        }
    };
    (@one $f:tt bytes_outstanding) => {
        fn bytes_outstanding(&self) -> usize {
            self.$f.bytes_outstanding()
        }
    };
    (@one $f:tt reap_pending) => {
        fn reap_pending(&self) -> $crate::ResourceResult<()> {
            self.$f.reap_pending()
        }
    };
    (@one $f:tt pending_free_seq) => {
        fn pending_free_seq(&self, stream: $crate::StreamId) -> u64 {
            self.$f.pending_free_seq(stream)
        }
    };
    (@one $f:tt reap_through) => {
        fn reap_through(&self, stream: $crate::StreamId, seq: u64) -> usize {
            self.$f.reap_through(stream, seq)
        }
    };
    (@one $f:tt supports_block_use_tracking) => {
        fn supports_block_use_tracking(&self) -> bool {
            self.$f.supports_block_use_tracking()
        }
    };
    (@one $f:tt record_block_use) => {
        fn record_block_use(
            &self,
            block: &$crate::DeviceBlock,
            use_stream: $crate::StreamId,
        ) -> $crate::ResourceResult<()> {
            self.$f.record_block_use(block, use_stream)
        }
    };
    (@one $f:tt prepare_block_use) => {
        fn prepare_block_use(
            &self,
            block: $crate::BlockId,
            use_stream: $crate::StreamId,
            access: $crate::Access,
        ) -> $crate::ResourceResult<()> {
            self.$f.prepare_block_use(block, use_stream, access)
        }
    };
    (@one $f:tt finish_block_use) => {
        fn finish_block_use(
            &self,
            block: $crate::BlockId,
            use_stream: $crate::StreamId,
            access: $crate::Access,
        ) -> $crate::ResourceResult<()> {
            self.$f.finish_block_use(block, use_stream, access)
        }
    };
    (@one $f:tt allocation_cost) => {
        fn allocation_cost(&self, bytes: usize, stream: $crate::StreamId) -> usize {
            self.$f.allocation_cost(bytes, stream)
        }
    };
    (@one $f:tt allocation_cost_is_exact) => {
        fn allocation_cost_is_exact(&self) -> bool {
            self.$f.allocation_cost_is_exact()
        }
    };
    (@one $f:tt release_idle) => {
        fn release_idle(&self) -> $crate::ResourceResult<usize> {
            self.$f.release_idle()
        }
    };
    (@one $f:tt allocation_limit) => {
        fn allocation_limit(&self) -> Option<usize> {
            self.$f.allocation_limit()
        }
    };
    (@one $f:tt budget_reliefs) => {
        fn budget_reliefs(&self, out: &mut ::std::vec::Vec<$crate::BudgetRelief>) {
            self.$f.budget_reliefs(out)
        }
    };
    (@one $f:tt frees_across_streams) => {
        fn frees_across_streams(&self) -> bool {
            self.$f.frees_across_streams()
        }
    };
    (@one $f:tt frees_only_queue) => {
        fn frees_only_queue(&self) -> bool {
            self.$f.frees_only_queue()
        }
    };
    (@one $f:tt capture_status) => {
        fn capture_status(
            &self,
            stream: $crate::StreamId,
        ) -> $crate::ResourceResult<$crate::gpu::CaptureStatus> {
            self.$f.capture_status(stream)
        }
    };
    (@one $f:tt release_capture) => {
        fn release_capture(
            &self,
            capture: $crate::CaptureId,
            after: $crate::StreamId,
        ) -> $crate::ResourceResult<()> {
            self.$f.release_capture(capture, after)
        }
    };
    (@one $f:tt snapshot_into) => {
        fn snapshot_into(&self, snapshot: &mut $crate::MemorySnapshot) {
            self.$f.snapshot_into(snapshot)
        }
    };
    (@one $f:tt block_state) => {
        fn block_state(&self, block: $crate::BlockId) -> Option<$crate::BlockState> {
            self.$f.block_state(block)
        }
    };
}
