//! `forward_to_inner!`: the methods a decorator passes through unchanged.
//!
//! A decorator (an adaptor, the cache) changes a few methods of
//! [`DeviceMemoryResource`](super::DeviceMemoryResource) and must forward all
//! the others, the block-use hooks included, or a stack silently loses
//! tracking. Writing each forward by hand repeats a dozen three-line methods
//! per decorator; this macro writes them from a list of names, so what a
//! decorator changes is what its `impl` block shows.

/// Inside an `impl DeviceMemoryResource for …` block, writes each named
/// method as a plain call of the same method on `self.$field`.
macro_rules! forward_to_inner {
    ($field:ident; $($method:ident),+ $(,)?) => {
        $( $crate::resource::forward::forward_to_inner!(@one $field $method); )+
    };
    (@one $f:ident deallocate) => {
        fn deallocate(&self, block: $crate::DeviceBlock) -> $crate::ResourceResult<()> {
            self.$f.deallocate(block)
        }
    };
    (@one $f:ident deallocate_completed) => {
        fn deallocate_completed(
            &self,
            block: $crate::DeviceBlock,
            completed: $crate::CompletedUses,
        ) -> $crate::ResourceResult<()> {
            self.$f.deallocate_completed(block, completed)
        }
    };
    (@one $f:ident device_ordinal) => {
        fn device_ordinal(&self) -> u32 {
            self.$f.device_ordinal()
        }
    };
    (@one $f:ident bytes_outstanding) => {
        fn bytes_outstanding(&self) -> usize {
            self.$f.bytes_outstanding()
        }
    };
    (@one $f:ident reap_pending) => {
        fn reap_pending(&self) -> $crate::ResourceResult<()> {
            self.$f.reap_pending()
        }
    };
    (@one $f:ident pending_free_seq) => {
        fn pending_free_seq(&self, stream: $crate::StreamId) -> u64 {
            self.$f.pending_free_seq(stream)
        }
    };
    (@one $f:ident reap_through) => {
        fn reap_through(&self, stream: $crate::StreamId, seq: u64) -> usize {
            self.$f.reap_through(stream, seq)
        }
    };
    (@one $f:ident supports_block_use_tracking) => {
        fn supports_block_use_tracking(&self) -> bool {
            self.$f.supports_block_use_tracking()
        }
    };
    (@one $f:ident record_block_use) => {
        fn record_block_use(
            &self,
            block: &$crate::DeviceBlock,
            use_stream: $crate::StreamId,
        ) -> $crate::ResourceResult<()> {
            self.$f.record_block_use(block, use_stream)
        }
    };
    (@one $f:ident prepare_block_use) => {
        fn prepare_block_use(
            &self,
            block: $crate::BlockId,
            use_stream: $crate::StreamId,
            access: $crate::Access,
        ) -> $crate::ResourceResult<()> {
            self.$f.prepare_block_use(block, use_stream, access)
        }
    };
    (@one $f:ident finish_block_use) => {
        fn finish_block_use(
            &self,
            block: $crate::BlockId,
            use_stream: $crate::StreamId,
            access: $crate::Access,
        ) -> $crate::ResourceResult<()> {
            self.$f.finish_block_use(block, use_stream, access)
        }
    };
    (@one $f:ident allocation_cost) => {
        fn allocation_cost(&self, bytes: usize, stream: $crate::StreamId) -> usize {
            self.$f.allocation_cost(bytes, stream)
        }
    };
    (@one $f:ident allocation_cost_is_exact) => {
        fn allocation_cost_is_exact(&self) -> bool {
            self.$f.allocation_cost_is_exact()
        }
    };
    (@one $f:ident release_idle) => {
        fn release_idle(&self) -> $crate::ResourceResult<usize> {
            self.$f.release_idle()
        }
    };
    (@one $f:ident allocation_limit) => {
        fn allocation_limit(&self) -> Option<usize> {
            self.$f.allocation_limit()
        }
    };
    (@one $f:ident frees_across_streams) => {
        fn frees_across_streams(&self) -> bool {
            self.$f.frees_across_streams()
        }
    };
    (@one $f:ident capture_status) => {
        fn capture_status(
            &self,
            stream: $crate::StreamId,
        ) -> $crate::ResourceResult<$crate::gpu::CaptureStatus> {
            self.$f.capture_status(stream)
        }
    };
    (@one $f:ident release_capture) => {
        fn release_capture(
            &self,
            capture: $crate::gpu::CaptureId,
            after: $crate::StreamId,
        ) -> $crate::ResourceResult<()> {
            self.$f.release_capture(capture, after)
        }
    };
    (@one $f:ident block_state) => {
        fn block_state(&self, block: $crate::BlockId) -> Option<$crate::BlockState> {
            self.$f.block_state(block)
        }
    };
}

pub(crate) use forward_to_inner;
