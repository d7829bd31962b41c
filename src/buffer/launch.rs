//! [`BufferLaunch`]: one launch over buffers on an [`AsyncResource`], one
//! completion future for the whole launch.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::ledger::{BufferCore, End};
use super::owned::Buffer;
use super::view::{BufferView, BufferViewMut};
use crate::error::ResourceError;
use crate::futures::{AsyncResource, DoneAt, EventFuture};
use crate::launch::LaunchRecorder;
use crate::resource::DeviceMemoryResource;
use crate::types::{Access, DeviceBlock, RawStream, StreamId};

/// Declares what one launch on a stream reads and writes (buffers, views,
/// or bare blocks), orders it against every other use, and returns one
/// [`EventFuture`] that completes when the GPU has run it.
///
/// Made by [`AsyncResource::launch`]. It runs the
/// [`LaunchRecorder`] protocol (preflight → prepare → enqueue → finish) and
/// borrows each buffer as it is used: shared for a read, exclusive for a
/// write, so no one can free or write a buffer while the launch is being
/// queued.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use streamalloc::AsyncResource;
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, SimResource};
///
/// let gpu = SimGpu::new();
/// let device = Device::simulated(&gpu, 2);
/// let pool = device.streams().clone();
/// let res = AsyncResource::new(Arc::new(SimResource::new(&device)))?;
/// let (a, b) = (pool.id(0).unwrap(), pool.id(1).unwrap());
/// let mut x = res.allocate_buffer::<f32>(256, a, AllocTag::UNTAGGED).await?;
/// let mut y = res.allocate_buffer::<f32>(256, b, AllocTag::UNTAGGED).await?;
/// x.fill_bytes_on(a, 0)?;
///
/// // A kernel on b reads x (written on a) and writes y: one future.
/// let (xp, yp) = (x.block().clone(), y.block().clone());
/// let ((), done) = res.launch(b).read(&x).write(&mut y).enqueue(|raw| {
///     use streamalloc::gpu::sim::MemAccess;
///     gpu.launch_kernel(raw, &[MemAccess::read(&xp), MemAccess::write(&yp)])
///         .map_err(|e| e.for_request(0, b))
/// })?;
/// done.await?;
/// drop((x, y));
/// res.reap_pending().await?;
/// assert_eq!(res.bytes_outstanding(), 0);
/// assert!(gpu.races().is_empty());
/// # Ok(()) }
/// ```
///
/// # Stream ordering
/// As [`LaunchRecorder`]: the launch waits for the allocation of every
/// declared block and the uses that conflict with it; later conflicting
/// uses and the frees wait for the launch.
#[must_use = "a BufferLaunch queues nothing until `enqueue`"]
pub struct BufferLaunch<'a, R: ?Sized> {
    res: &'a AsyncResource<R>,
    stream: StreamId,
    buffers: Vec<(&'a BufferCore, Access)>,
    blocks: Vec<(DeviceBlock, Access)>,
}

impl<R: DeviceMemoryResource + ?Sized + 'static> AsyncResource<R> {
    /// Starts declaring a launch on `stream` (see [`BufferLaunch`]).
    pub fn launch(&self, stream: StreamId) -> BufferLaunch<'_, R> {
        BufferLaunch {
            res: self,
            stream,
            buffers: Vec::new(),
            blocks: Vec::new(),
        }
    }
}

impl<'a, R: DeviceMemoryResource + ?Sized + 'static> BufferLaunch<'a, R> {
    /// The launch reads `buf`.
    pub fn read<T>(mut self, buf: &'a Buffer<T>) -> Self {
        self.buffers.push((&buf.core, Access::Read));
        self
    }

    /// The launch writes (and maybe reads) `buf`.
    pub fn write<T>(mut self, buf: &'a mut Buffer<T>) -> Self {
        self.buffers.push((&buf.core, Access::Write));
        self
    }

    /// The launch reads the view `view` (its whole buffer is ordered).
    pub fn read_view<T>(mut self, view: &'a BufferView<'_, T>) -> Self {
        self.buffers.push((view.core(), Access::Read));
        self
    }

    /// The launch writes the view `view` (its whole buffer is ordered).
    pub fn write_view<T>(mut self, view: &'a mut BufferViewMut<'_, T>) -> Self {
        self.buffers.push((view.core(), Access::Write));
        self
    }

    /// The launch touches the bare block `block` with `access` (a block the
    /// caller owns through [`Buffer::into_block`] or the raw allocation).
    pub fn block(mut self, block: &DeviceBlock, access: Access) -> Self {
        self.blocks.push((block.clone(), access));
        self
    }

    /// Runs the launch: checks every declaration (nothing queued on
    /// failure), queues the waits, calls `enqueue` with the stream's raw
    /// handle, records every use (even when `enqueue` fails or panics), and
    /// returns `enqueue`'s value with one future for the whole launch.
    ///
    /// # Errors
    /// A preflight error, an unknown stream, a stream being captured into a
    /// CUDA graph ([`StreamCapturing`](ResourceError::StreamCapturing)), a
    /// prepare error (before
    /// `enqueue` runs); `enqueue`'s error; an error recording the uses or
    /// making the future.
    pub fn enqueue<T, E>(
        self,
        enqueue: impl FnOnce(RawStream) -> Result<T, E>,
    ) -> Result<(T, EventFuture), E>
    where
        E: From<ResourceError>,
    {
        let mut recorder = LaunchRecorder::new(&**self.res.inner(), self.stream);
        for (core, access) in &self.buffers {
            recorder = recorder.declare(&core.block, *access);
        }
        for (block, access) in &self.blocks {
            recorder = recorder.declare(block, *access);
        }
        recorder.preflight()?;
        let raw = self.res.stream_pool().raw(self.stream)?;
        // The launch ends in a completion future, which a capture cannot
        // have: refused before anything is queued.
        self.res
            .core()
            .notifier(self.stream)?
            .refuse_capturing(&**self.res.gpu())?;
        // A buffer's own begin also finishes the uses cudarc made of it, and
        // holds its ledger while preparing (see `ledger`).
        for (core, access) in &self.buffers {
            core.begin(self.stream, *access, End::Guarded)?;
        }
        for (block, access) in &self.blocks {
            self.res
                .prepare_block_use(block.id(), self.stream, *access)?;
        }
        // From here the closure may have queued work on the buffers: until
        // their uses are known recorded, each is kept as a deferred use (so
        // an unwinding closure or a failed record never leaves a buffer
        // whose free is not ordered after work queued on it). A closure
        // that unwinds after which the recorder's own finish recorded every
        // use leaves nothing deferred: finishing again at the buffer's end
        // would record an event on a stream that may be capturing by then,
        // joining the free's stream to that capture.
        let finished_on_unwind = Cell::new(false);
        let mut unfinished = UnfinishedUses {
            buffers: &self.buffers,
            stream: self.stream,
            armed: true,
            finished_on_unwind: &finished_on_unwind,
        };
        let (out, finished) =
            recorder.enqueue_then_finish_noting(raw, enqueue, &finished_on_unwind);
        unfinished.armed = finished.is_err();
        drop(unfinished);
        let value = out?;
        finished?;
        let completion = self.res.completion_outside_capture(self.stream)?;
        // Once this future settles the GPU is done with the launch's
        // buffers (on their own stream): their drop may then say so. Points
        // are numbered per resource, and a buffer's drop asks its own: only
        // a buffer of this very resource may count on this one (another
        // `AsyncResource` over the same inner one has its own points).
        let this = Arc::as_ptr(self.res.core()).cast::<()>();
        let done_at = DoneAt {
            point: completion.seq(),
            hook_uses: self.res.core().hook_uses.load(Ordering::SeqCst),
        };
        for (core, _) in &self.buffers {
            if std::ptr::eq(Arc::as_ptr(&core.home).cast::<()>(), this) {
                core.note_launch_point(self.stream, done_at);
            }
        }
        Ok((value, completion))
    }
}

/// The buffers of a launch whose uses are not known recorded: dropped
/// while armed, it notes each use as deferred (see
/// [`BufferCore::defer_end`]).
struct UnfinishedUses<'a> {
    buffers: &'a [(&'a BufferCore, Access)],
    stream: StreamId,
    armed: bool,
    /// Set by the recorder when the closure unwound and its finish then
    /// recorded every use.
    finished_on_unwind: &'a Cell<bool>,
}

impl Drop for UnfinishedUses<'_> {
    fn drop(&mut self) {
        if !self.armed || self.finished_on_unwind.get() {
            return;
        }
        for (core, access) in self.buffers {
            core.defer_end(self.stream, *access);
        }
    }
}

impl<R: ?Sized> fmt::Debug for BufferLaunch<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferLaunch")
            .field("stream", &self.stream)
            .field(
                "buffers",
                &self
                    .buffers
                    .iter()
                    .map(|(c, a)| (c.block.id(), *a))
                    .collect::<Vec<_>>(),
            )
            .field("blocks", &self.blocks)
            .finish()
    }
}
