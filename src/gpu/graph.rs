//! Owning graph handles: [`Graph`] and [`GraphExec`] destroy what they hold
//! when dropped, so safe code cannot use a graph after its destruction nor
//! destroy it twice.
//!
//! They sit on the [`Gpu`] seam and know nothing of resources; the
//! user-facing capture API ([`crate::graph`]) builds on them and adds what
//! ties a graph to the memory it was given.

// Unsafe here: graph capture, instantiation and launch take raw driver handles.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex, MutexGuard};

use super::{CaptureId, CaptureStatus, Gpu, GpuError, GpuResult, RawGraph, RawGraphExec};
use crate::error::DriverCall;
use crate::gpu::capture_code;
use crate::types::RawStream;

/// The driver does not synchronize graph objects ("API calls accessing the
/// same graph object must be serialized externally"): every call on one
/// goes through this lock, which guards no data.
fn serial(lock: &Mutex<()>) -> MutexGuard<'_, ()> {
    lock.lock().unwrap_or_else(|p| p.into_inner())
}

/// A captured graph, owned: dropping it destroys it (`cuGraphDestroy`).
/// Executables instantiated from it outlive it.
pub struct Graph<G: Gpu + ?Sized> {
    gpu: Arc<G>,
    raw: RawGraph,
    capture: CaptureId,
    serial: Mutex<()>,
}

impl<G: Gpu + ?Sized> Graph<G> {
    /// Ends the capture begun on `stream` and takes ownership of its graph.
    ///
    /// # Errors
    /// As [`Gpu::end_capture`]: `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when
    /// an illegal call invalidated the capture (the capture ends all the
    /// same), `CUDA_ERROR_ILLEGAL_STATE` when `stream` is not capturing.
    ///
    /// # Safety
    /// 1. `stream` is a live stream of `gpu`.
    pub unsafe fn end_capture(gpu: &Arc<G>, stream: RawStream) -> GpuResult<Self> {
        // SAFETY: `stream` is live (this fn's Safety 1).
        let status = unsafe { gpu.capture_status(stream) }?;
        // SAFETY: as above.
        let ended = unsafe { gpu.end_capture(stream) };
        let raw = ended?;
        let capture = match status {
            CaptureStatus::Active(id) => id,
            // The driver ended a capture whose id it did not report: keep the
            // graph owned (so it is destroyed), under an id no capture has.
            _ => {
                // SAFETY: `raw` was just returned by `end_capture` and is
                // destroyed once, here.
                let _ = unsafe { gpu.graph_destroy(raw) };
                return Err(GpuError::driver(
                    DriverCall::StreamEndCapture,
                    capture_code::ILLEGAL_STATE,
                    "CUDA_ERROR_ILLEGAL_STATE: the stream was not capturing",
                ));
            }
        };
        Ok(Graph {
            gpu: gpu.clone(),
            raw,
            capture,
            serial: Mutex::new(()),
        })
    }

    /// The capture that recorded this graph.
    pub fn capture(&self) -> CaptureId {
        self.capture
    }

    /// The raw handle, for calls the seam does not offer. It stays valid
    /// while `self` lives; destroying it is `self`'s job alone.
    pub fn raw(&self) -> RawGraph {
        self.raw
    }

    /// The backend.
    pub fn gpu(&self) -> &Arc<G> {
        &self.gpu
    }

    /// Instantiates the graph into an executable one.
    ///
    /// # Errors
    /// The driver's, as [`Gpu::graph_instantiate`].
    pub fn instantiate(&self) -> GpuResult<GraphExec<G>> {
        let _serial = serial(&self.serial);
        // SAFETY: `self.raw` is live (owned, destroyed only in Drop) and the
        // lock serializes calls on it.
        let raw = unsafe { self.gpu.graph_instantiate(self.raw) }?;
        Ok(GraphExec {
            gpu: self.gpu.clone(),
            raw,
            capture: self.capture,
            serial: Mutex::new(()),
        })
    }
}

impl<G: Gpu + ?Sized> Drop for Graph<G> {
    fn drop(&mut self) {
        // SAFETY: the handle is owned and not used after this.
        if let Err(e) = unsafe { self.gpu.graph_destroy(self.raw) } {
            tracing::warn!(error = %e, capture = %self.capture, "destroying a graph failed");
        }
    }
}

impl<G: Gpu + ?Sized> std::fmt::Debug for Graph<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("raw", &self.raw)
            .field("capture", &self.capture)
            .finish()
    }
}

/// An executable graph, owned: dropping it destroys it
/// (`cuGraphExecDestroy`; replays already queued still run).
pub struct GraphExec<G: Gpu + ?Sized> {
    gpu: Arc<G>,
    raw: RawGraphExec,
    capture: CaptureId,
    serial: Mutex<()>,
}

impl<G: Gpu + ?Sized> GraphExec<G> {
    /// Queues one replay on `stream`.
    ///
    /// A raw launch: the frees of what the replay allocates and does not
    /// free are the caller's, before the next launch. The crate's
    /// [`CapturedGraph`](crate::CapturedGraph) does them for blocks a
    /// resource allocated in the capture.
    ///
    /// # Errors
    /// As [`Gpu::graph_launch`].
    ///
    /// # Safety
    /// 1. `stream` is a live stream of this graph's backend;
    /// 2. every memory range the graph's work touches that the graph did not
    ///    allocate itself is a live range when the replay runs.
    pub unsafe fn launch(&self, stream: RawStream) -> GpuResult<()> {
        let _serial = serial(&self.serial);
        // SAFETY: `self.raw` is live (owned) and the lock serializes calls
        // on it; `stream` and the memory are the caller's (Safety 1-2).
        unsafe { self.gpu.graph_launch(self.raw, stream) }
    }

    /// The capture that recorded the graph.
    pub fn capture(&self) -> CaptureId {
        self.capture
    }

    /// The raw handle; it stays valid while `self` lives.
    pub fn raw(&self) -> RawGraphExec {
        self.raw
    }

    /// The backend.
    pub fn gpu(&self) -> &Arc<G> {
        &self.gpu
    }
}

impl<G: Gpu + ?Sized> Drop for GraphExec<G> {
    fn drop(&mut self) {
        // SAFETY: the handle is owned and not used after this.
        if let Err(e) = unsafe { self.gpu.graph_exec_destroy(self.raw) } {
            tracing::warn!(error = %e, capture = %self.capture, "destroying a graph exec failed");
        }
    }
}

impl<G: Gpu + ?Sized> std::fmt::Debug for GraphExec<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExec")
            .field("raw", &self.raw)
            .field("capture", &self.capture)
            .finish()
    }
}
