//! [`GraphCapture`]: a capture in progress on one of the pool's streams.

#![allow(unsafe_code)]

use super::captured::{CapturedGraph, release_capture};
use crate::error::{ResourceError, ResourceResult};
use crate::futures::AsyncResource;
use crate::gpu::{CaptureId, CaptureMode, CaptureStatus, Graph};
use crate::resource::DeviceMemoryResource;
use crate::types::{RawStream, StreamId};

/// A capture in progress: work queued on its stream is recorded into a
/// graph instead of running, until [`end`](Self::end) turns it into a
/// [`CapturedGraph`].
///
/// Made by [`AsyncResource::begin_capture`]. Dropping it without ending it
/// ends the capture and throws the graph away (a panic inside the captured
/// code leaves no stream capturing), and releases the memory handed out
/// during it.
#[must_use = "a capture records until it is ended; dropping it throws the graph away"]
#[derive(Debug)]
pub struct GraphCapture<R: DeviceMemoryResource + ?Sized + 'static> {
    res: AsyncResource<R>,
    stream: StreamId,
    raw: RawStream,
    id: CaptureId,
    ended: bool,
}

impl<R: DeviceMemoryResource + ?Sized + 'static> AsyncResource<R> {
    /// Begins capturing `stream` (one of this resource's pool) into a CUDA
    /// graph, in `mode` ([`CaptureMode::Relaxed`] lets other threads go on
    /// synchronizing their own streams, as inference servers need).
    ///
    /// # Errors
    /// [`UnknownStream`](ResourceError::UnknownStream); the driver's error
    /// (`CUDA_ERROR_ILLEGAL_STATE` when the stream is already capturing,
    /// `CUDA_ERROR_NOT_SUPPORTED` for a backend that cannot capture).
    pub fn begin_capture(
        &self,
        stream: StreamId,
        mode: CaptureMode,
    ) -> ResourceResult<GraphCapture<R>> {
        let raw = self.stream_pool().raw(stream)?;
        let gpu = self.gpu();
        // SAFETY: `raw` was resolved through this resource's pool, which the
        // capture holds (through `res`) and which keeps its streams alive.
        unsafe { gpu.begin_capture(raw, mode) }?;
        // SAFETY: as above.
        let id = match unsafe { gpu.capture_status(raw) } {
            Ok(CaptureStatus::Active(id)) => Ok(id),
            Ok(other) => Err(ResourceError::Driver {
                call: crate::DriverCall::StreamGetCaptureInfo,
                code: crate::gpu::capture_code::ILLEGAL_STATE,
                message: format!("a capture just begun reports {other:?}"),
            }),
            Err(e) => Err(e.into()),
        };
        match id {
            Ok(id) => Ok(GraphCapture {
                res: self.clone(),
                stream,
                raw,
                id,
                ended: false,
            }),
            Err(e) => {
                // Nothing was recorded: end the capture (its graph, if any,
                // drops here) so the stream runs work again.
                // SAFETY: as above.
                let _ = unsafe { Graph::end_capture(gpu, raw) };
                Err(e)
            }
        }
    }

    /// Captures what `record` queues on `stream` into a graph, ended and
    /// instantiated: [`begin_capture`](Self::begin_capture), `record`, then
    /// [`GraphCapture::end`]. When `record` fails (or panics) the capture is
    /// ended and thrown away.
    ///
    /// # Errors
    /// `record`'s error; [`begin_capture`](Self::begin_capture)'s and
    /// [`end`](GraphCapture::end)'s.
    pub fn capture_graph<T, E>(
        &self,
        stream: StreamId,
        mode: CaptureMode,
        record: impl FnOnce(&GraphCapture<R>) -> Result<T, E>,
    ) -> Result<(T, CapturedGraph<R>), E>
    where
        E: From<ResourceError>,
    {
        let capture = self.begin_capture(stream, mode)?;
        let value = record(&capture)?;
        Ok((value, capture.end()?))
    }
}

impl<R: DeviceMemoryResource + ?Sized + 'static> GraphCapture<R> {
    /// The capturing stream.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The capturing stream's backend handle, to queue work on it (kernel
    /// launches, copies).
    pub fn raw_stream(&self) -> RawStream {
        self.raw
    }

    /// The driver's id of this capture.
    pub fn id(&self) -> CaptureId {
        self.id
    }

    /// Whether the capture is still valid: [`CaptureStatus::Active`] until
    /// an illegal call (a synchronize of the stream, a query of an event
    /// recorded in it) invalidates it.
    ///
    /// # Errors
    /// The driver's error asking.
    pub fn status(&self) -> ResourceResult<CaptureStatus> {
        // SAFETY: `self.raw` is a stream of the pool `self.res` holds.
        Ok(unsafe { self.res.gpu().capture_status(self.raw) }?)
    }

    /// Ends the capture and instantiates its graph. Buffers dropped during
    /// the capture whose frees it refused (a block another capture kept,
    /// say) are freed then.
    ///
    /// # Errors
    /// The driver's: `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when an
    /// illegal call invalidated the capture,
    /// `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` when a stream forked from it was
    /// not joined back, an instantiation error. The capture is over either
    /// way, and the memory handed out during it is released.
    pub fn end(mut self) -> ResourceResult<CapturedGraph<R>> {
        self.ended = true;
        let gpu = self.res.gpu();
        // SAFETY: `self.raw` is a stream of the pool `self.res` holds.
        let exec =
            unsafe { Graph::end_capture(gpu, self.raw) }.and_then(|graph| graph.instantiate());
        // Buffers dropped during the capture whose frees it refused are
        // freed now (`device::deferred_frees`).
        self.res.stream_pool().deferred_frees().retry();
        match exec {
            Ok(exec) => Ok(CapturedGraph::new(self.res.clone(), exec, self.stream)),
            Err(e) => {
                release_capture(&self.res, self.id, self.stream);
                Err(e.into())
            }
        }
    }
}

impl<R: DeviceMemoryResource + ?Sized + 'static> Drop for GraphCapture<R> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // Ended unfinished (an error or a panic in the captured code): end
        // the capture so the stream runs work again; the graph (if any)
        // drops here.
        // SAFETY: `self.raw` is a stream of the pool `self.res` holds.
        if let Err(e) = unsafe { Graph::end_capture(self.res.gpu(), self.raw) } {
            tracing::debug!(capture = %self.id, error = %e, "abandoned capture ended");
        }
        release_capture(&self.res, self.id, self.stream);
        self.res.stream_pool().deferred_frees().retry();
    }
}
