//! [`LaunchRecorder`]: preflight → prepare → enqueue → finish.

use crate::device::Device;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::Gpu;
use crate::resource::DeviceMemoryResource;
use crate::types::{Access, BlockId, BlockState, DeviceBlock, RawStream, StreamId};
use std::cell::Cell;

/// One declared use of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchBlockUse {
    /// The block.
    pub block: BlockId,
    /// Its allocation stream.
    pub alloc_stream: StreamId,
    /// Its device.
    pub device: u32,
    /// How the launch touches it (a block both read and written is a write).
    pub access: Access,
}

/// Declares the blocks one launch on `stream` reads and writes, and orders
/// the launch against every other use of them.
///
/// Generic over any [`DeviceMemoryResource`] (a bare resource or a stack of
/// adaptors); it borrows the resource for the launch.
///
/// # Examples
/// ```
/// use streamalloc::gpu::sim::{MemAccess, SimGpu};
/// use streamalloc::LaunchRecorder;
/// use streamalloc::{AllocTag, Device, DeviceMemoryResource, SimResource};
///
/// let gpu = SimGpu::builder().manual().build();
/// let device = Device::simulated(&gpu, 2);
/// let r = SimResource::new(&device);
/// let (a, b) = (device.stream(0)?, device.stream(1)?);
/// let input = r.allocate(1024, a, AllocTag::UNTAGGED)?;
/// let output = r.allocate(1024, b, AllocTag::UNTAGGED)?;
///
/// // A kernel on stream b reads `input` (allocated on a), writes `output`.
/// LaunchRecorder::new(&r, b)
///     .read(&input)
///     .write(&output)
///     .launch(&device, |raw| -> Result<(), Box<dyn std::error::Error>> {
///         gpu.launch_kernel(raw, &[MemAccess::read(&input), MemAccess::write(&output)])?;
///         Ok(())
///     })?;
/// r.deallocate(input)?; // waits for the kernel on b
/// r.deallocate(output)?;
/// gpu.run_until_idle();
/// assert!(gpu.races().is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Stream ordering
/// After [`prepare`](Self::prepare) the launch stream waits for the
/// allocation of every declared block and for the uses that conflict with
/// this one (the last write; for a write, also the reads on other streams).
/// After [`finish`](Self::finish), a free of any declared block, and any
/// later conflicting use, waits for this launch.
#[derive(Debug)]
pub struct LaunchRecorder<'r, R: DeviceMemoryResource + ?Sized> {
    resource: &'r R,
    stream: StreamId,
    uses: Vec<LaunchBlockUse>,
}

impl<'r, R: DeviceMemoryResource + ?Sized> LaunchRecorder<'r, R> {
    /// A launch on `stream` of `resource`'s device, with nothing declared.
    pub fn new(resource: &'r R, stream: StreamId) -> Self {
        LaunchRecorder {
            resource,
            stream,
            uses: Vec::new(),
        }
    }

    /// Declares that the launch reads `block`.
    pub fn read(self, block: &DeviceBlock) -> Self {
        self.declare(block, Access::Read)
    }

    /// Declares that the launch writes (and maybe reads) `block`.
    pub fn write(self, block: &DeviceBlock) -> Self {
        self.declare(block, Access::Write)
    }

    /// Declares `block` with `access`; a block declared twice is used once,
    /// as a write if either declaration is one.
    pub fn declare(mut self, block: &DeviceBlock, access: Access) -> Self {
        match self.uses.iter_mut().find(|u| u.block == block.id()) {
            Some(u) => {
                if access == Access::Write {
                    u.access = Access::Write;
                }
            }
            None => self.uses.push(LaunchBlockUse {
                block: block.id(),
                alloc_stream: block.stream(),
                device: block.device(),
                access,
            }),
        }
        self
    }

    /// The launch stream.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The resource.
    pub fn resource(&self) -> &'r R {
        self.resource
    }

    /// The declared uses, in declaration order.
    pub fn uses(&self) -> &[LaunchBlockUse] {
        &self.uses
    }

    /// Checks every declaration; queues nothing and changes nothing.
    ///
    /// # Errors
    /// - [`WrongDevice`](ResourceError::WrongDevice): the stream or a block
    ///   is of another device than the resource;
    /// - [`DoubleFree`](ResourceError::DoubleFree): a block is retired or
    ///   quarantined; [`UnknownBlock`](ResourceError::UnknownBlock): the
    ///   resource does not know it;
    /// - [`TrackingUnsupported`](ResourceError::TrackingUnsupported): a
    ///   block is used on a stream other than its allocation stream and the
    ///   stack does not track cross-stream use.
    pub fn preflight(&self) -> ResourceResult<()> {
        let device = self.resource.device_ordinal();
        ResourceError::check_device(device, self.stream.device())?;
        let tracking = self.resource.supports_block_use_tracking();
        for u in &self.uses {
            ResourceError::check_device(device, u.device)?;
            match self.resource.block_state(u.block) {
                Some(BlockState::Live) => {}
                Some(BlockState::Retired | BlockState::Quarantined) => {
                    return Err(ResourceError::DoubleFree { block: u.block });
                }
                None => return Err(ResourceError::UnknownBlock { block: u.block }),
            }
            if u.alloc_stream != self.stream && !tracking {
                return Err(ResourceError::TrackingUnsupported {
                    block: u.block,
                    stream: self.stream,
                });
            }
        }
        Ok(())
    }

    /// Queues, on the launch stream, the waits every declared use needs.
    /// Call after [`preflight`](Self::preflight), before queuing the launch.
    ///
    /// # Errors
    /// The resource's error; waits queued for earlier blocks stay queued
    /// (an extra wait is harmless).
    pub fn prepare(&self) -> ResourceResult<()> {
        for u in &self.uses {
            self.resource
                .prepare_block_use(u.block, self.stream, u.access)?;
        }
        Ok(())
    }

    /// Records, for every declared block, that the launch queued since
    /// [`prepare`](Self::prepare) uses it. Call after queuing the launch.
    ///
    /// Every block is recorded even when one fails, so that as many frees
    /// as possible stay ordered after the launch.
    ///
    /// # Errors
    /// The first error of the resource.
    pub fn finish(&self) -> ResourceResult<()> {
        let mut first = Ok(());
        for u in &self.uses {
            let r = self
                .resource
                .finish_block_use(u.block, self.stream, u.access);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Runs the whole protocol: [`preflight`](Self::preflight),
    /// [`prepare`](Self::prepare), `enqueue` with the launch stream's raw
    /// handle (resolved on `device`), [`finish`](Self::finish).
    ///
    /// `enqueue` should only queue work. When it fails, `finish` still runs
    /// (whatever it queued before failing is covered) and its error is
    /// returned.
    ///
    /// # Errors
    /// A preflight error or an unknown stream, before `enqueue` is called
    /// and before anything is queued; a prepare error, before `enqueue` is
    /// called; the error of `enqueue`; a finish error.
    pub fn launch<G: Gpu, T, E>(
        self,
        device: &Device<G>,
        enqueue: impl FnOnce(RawStream) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<ResourceError>,
    {
        self.preflight()?;
        let raw = device.raw(self.stream)?;
        self.prepare()?;
        let (out, finished) = self.enqueue_then_finish(raw, enqueue);
        let value = out?;
        finished?;
        Ok(value)
    }

    /// Runs `enqueue` with `raw`, then [`finish`](Self::finish), returning
    /// both results. Call after [`prepare`](Self::prepare).
    ///
    /// `finish` runs even when `enqueue` panics (from a drop guard, before
    /// the panic goes on): whatever it queued before panicking is recorded,
    /// so a later free of a declared block cannot race it.
    pub fn enqueue_then_finish<T>(
        &self,
        raw: RawStream,
        enqueue: impl FnOnce(RawStream) -> T,
    ) -> (T, ResourceResult<()>) {
        self.enqueue_then_finish_noting(raw, enqueue, &Cell::new(false))
    }

    /// [`enqueue_then_finish`](Self::enqueue_then_finish), setting
    /// `finished_on_unwind` when `enqueue` panicked and the `finish` run
    /// while unwinding recorded every use: a caller that keeps its own
    /// guard for uses not known recorded then knows they are.
    pub(crate) fn enqueue_then_finish_noting<T>(
        &self,
        raw: RawStream,
        enqueue: impl FnOnce(RawStream) -> T,
        finished_on_unwind: &Cell<bool>,
    ) -> (T, ResourceResult<()>) {
        let mut guard = FinishOnUnwind {
            recorder: self,
            armed: true,
            finished: finished_on_unwind,
        };
        let out = enqueue(raw);
        guard.armed = false;
        (out, self.finish())
    }
}

/// Finishes a launch whose enqueue closure unwinds.
struct FinishOnUnwind<'a, 'r, R: DeviceMemoryResource + ?Sized> {
    recorder: &'a LaunchRecorder<'r, R>,
    // Cleared once the closure returned: `finish` then runs normally.
    armed: bool,
    /// Set when the unwinding `finish` recorded every use.
    finished: &'a Cell<bool>,
}

impl<R: DeviceMemoryResource + ?Sized> Drop for FinishOnUnwind<'_, '_, R> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        match self.recorder.finish() {
            Ok(()) => self.finished.set(true),
            Err(e) => tracing::error!(error = %e, "finishing a launch whose enqueue panicked"),
        }
    }
}
