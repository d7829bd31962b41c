//! Stream capture: what the driver says about a stream being recorded into
//! a CUDA graph, and the plain handles of graphs.
//!
//! While a stream is *capturing* (between `cuStreamBeginCapture` and
//! `cuStreamEndCapture`), the work queued on it is recorded into a graph
//! instead of running. Some calls are then illegal and, worse, *invalidate*
//! the user's capture: querying or synchronizing an event recorded in the
//! capture (`CUDA_ERROR_CAPTURED_EVENT`), synchronizing the capturing stream
//! (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); `end_capture` then fails with
//! `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` and the user's work is lost. So
//! every layer that might query, synchronize or wait on a stream asks first
//! ([`Gpu::capture_status`](crate::gpu::Gpu::capture_status)).
//!
//! The owning, safe graph types ([`Graph`](crate::gpu::Graph),
//! [`GraphExec`](crate::gpu::GraphExec)) destroy their handles when dropped;
//! the raw handles here are what the [`Gpu`](crate::gpu::Gpu) seam passes.

pub use crate::types::CaptureId;

/// Whether a stream is being captured into a graph
/// (`CUstreamCaptureStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CaptureStatus {
    /// Not capturing: work queued on the stream runs.
    None,
    /// Capturing into the graph of capture `0`: work queued on the stream is
    /// recorded, not run; events recorded on it may not be queried or
    /// synchronized, and the stream may not be synchronized.
    Active(CaptureId),
    /// Capturing, but an illegal call already invalidated the capture: its
    /// `end_capture` will fail with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
    /// Work queued meanwhile neither runs nor is recorded.
    Invalidated,
}

impl CaptureStatus {
    /// Whether the stream is inside a capture sequence (active or
    /// invalidated): no event query, synchronize or host function may be
    /// made on its behalf.
    pub fn is_capturing(self) -> bool {
        !matches!(self, CaptureStatus::None)
    }

    /// The capture's id when it is active.
    pub fn id(self) -> Option<CaptureId> {
        match self {
            CaptureStatus::Active(id) => Some(id),
            _ => None,
        }
    }

    /// [`StreamCapturing`](crate::ResourceError::StreamCapturing) naming
    /// `stream` while it is capturing: what a layer answers before a call
    /// that would be captured, or would invalidate the capture.
    pub(crate) fn refuse(self, stream: crate::types::StreamId) -> crate::error::ResourceResult<()> {
        match self {
            CaptureStatus::None => Ok(()),
            status => Err(crate::error::ResourceError::StreamCapturing {
                stream,
                capture: status.id(),
            }),
        }
    }
}

/// How a capture restricts the rest of the process
/// (`CUstreamCaptureMode`): which threads may not make "potentially unsafe"
/// calls (synchronizes, which would implicitly wait on captured work) while
/// it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum CaptureMode {
    /// No thread may make potentially unsafe calls while the capture lasts
    /// (CUDA's default).
    Global,
    /// The thread that began the capture may not make them.
    ThreadLocal,
    /// No restriction beyond the capturing streams themselves: what
    /// inference servers use, since other threads keep serving.
    #[default]
    Relaxed,
}

/// A backend graph handle (a `CUgraph`, or a tagged index on the simulated
/// device), made by [`Gpu::end_capture`](crate::gpu::Gpu::end_capture).
/// [`Graph`](crate::gpu::Graph) owns one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawGraph(u64);

/// A backend executable-graph handle (a `CUgraphExec`, or a tagged index on
/// the simulated device), made by
/// [`Gpu::graph_instantiate`](crate::gpu::Gpu::graph_instantiate).
/// [`GraphExec`](crate::gpu::GraphExec) owns one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawGraphExec(u64);

macro_rules! raw_handle {
    ($t:ident) => {
        impl $t {
            #[cfg(feature = "cuda")]
            pub(crate) fn cuda(bits: u64) -> Self {
                $t(bits)
            }

            pub(crate) fn sim(index: usize) -> Self {
                $t(crate::types::SIM_HANDLE | index as u64)
            }

            /// The handle's bits.
            pub fn get(self) -> u64 {
                self.0
            }

            pub(crate) fn sim_index(self) -> Option<usize> {
                (self.0 & crate::types::SIM_HANDLE != 0)
                    .then_some((self.0 & !crate::types::SIM_HANDLE) as usize)
            }
        }
    };
}

raw_handle!(RawGraph);
raw_handle!(RawGraphExec);

/// The driver's codes for capture failures (`CUresult`), named in one
/// place; the simulated device reports the same.
pub mod capture_code {
    /// `CUDA_ERROR_ILLEGAL_STATE`: ending a capture on a stream that is not
    /// capturing, beginning one on a stream that already is.
    pub const ILLEGAL_STATE: i32 = 401;
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: a call not allowed on (or,
    /// in global or thread-local mode, during) a capture, such as
    /// synchronizing a capturing stream. Invalidates the capture.
    pub const UNSUPPORTED: i32 = 900;
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`: the capture was invalidated
    /// by an earlier illegal call; `end_capture` reports it.
    pub const INVALIDATED: i32 = 901;
    /// `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED`: the capture was not begun on
    /// this stream (it only joined it).
    pub const UNMATCHED: i32 = 903;
    /// `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`: a stream that joined the
    /// capture was not joined back into the origin stream before its end.
    pub const UNJOINED: i32 = 904;
    /// `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`: a dependency would cross from
    /// one capture into another.
    pub const ISOLATION: i32 = 905;
    /// `CUDA_ERROR_CAPTURED_EVENT`: a query or synchronize of an event
    /// whose latest record was captured (it never "completes" on the host).
    pub const CAPTURED_EVENT: i32 = 907;
    /// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`: a global or thread-local
    /// capture ended from another thread than the one that began it.
    pub const WRONG_THREAD: i32 = 908;

    /// Whether `code` is one of the capture failures above.
    pub fn is_capture_error(code: i32) -> bool {
        matches!(
            code,
            UNSUPPORTED
                | INVALIDATED
                | UNMATCHED
                | UNJOINED
                | ISOLATION
                | CAPTURED_EVENT
                | WRONG_THREAD
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_says_whether_a_stream_is_capturing() {
        let id = CaptureId::new(7);
        assert!(!CaptureStatus::None.is_capturing());
        assert!(CaptureStatus::Active(id).is_capturing());
        assert!(CaptureStatus::Invalidated.is_capturing());
        assert_eq!(CaptureStatus::Active(id).id(), Some(id));
        assert_eq!(CaptureStatus::Invalidated.id(), None);
        assert_eq!(id.get(), 7);
        assert_eq!(id.to_string(), "capture 7");
    }

    #[test]
    fn sim_handles_round_trip() {
        let g = RawGraph::sim(3);
        assert_eq!(g.sim_index(), Some(3));
        assert_eq!(RawGraphExec::sim(0).sim_index(), Some(0));
    }
}
