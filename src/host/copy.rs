//! Copies between host buffers and device buffers, one future each.

// The backend's copy calls, each argued where it is made.
#![allow(unsafe_code)]

use super::buffer::HostBuffer;
use super::element::HostElement;
use crate::buffer::Buffer;
use crate::error::{ResourceError, ResourceResult};
use crate::futures::{AsyncResource, EventFuture};
use crate::resource::DeviceMemoryResource;
use crate::types::StreamId;

impl<R: DeviceMemoryResource + ?Sized + 'static> AsyncResource<R> {
    /// Queues, on `stream`, a copy of the host buffer `src` into the device
    /// buffer `dst`, and returns a future that completes when the GPU has
    /// run it. A [`CudaBuffer`](crate::CudaBuffer) is taken too (it derefs
    /// to its `Buffer`).
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds) when the lengths differ;
    /// [`ForeignHostBuffer`](ResourceError::ForeignHostBuffer) when `src`'s
    /// pool is on another backend; [`HostBufferBusy`](ResourceError::HostBufferBusy)
    /// when a copy to the host on another stream, not seen complete, may
    /// still write `src` (await it first, or copy on its stream); as
    /// [`launch`](AsyncResource::launch) for `dst` and the stream (a
    /// capturing stream included); the driver's error. Nothing is queued
    /// on error, except when the error comes after the driver took the
    /// copy: then `src` is kept from the host and from its pool for good
    /// (the essay of `src/host/` says why).
    ///
    /// # Cancel safety
    /// The future is a completion like [`completion`](AsyncResource::completion):
    /// dropping it cancels nothing (the copy runs) and proves nothing (the
    /// host buffer stays busy until a notification or
    /// [`HostBuffer::ready`] shows the copy done).
    ///
    /// # Stream ordering
    /// As a launch writing `dst` on `stream`; the host must not write `src`
    /// until the copy completed, which [`HostBuffer::as_mut_slice`]
    /// enforces.
    pub fn copy_to_device<T: HostElement>(
        &self,
        src: &HostBuffer<T>,
        dst: &mut Buffer<T>,
        stream: StreamId,
    ) -> ResourceResult<EventFuture> {
        self.check_host_copy(src, dst.len())?;
        let pending = src.uses.conflicts(false, Some(stream));
        if pending > 0 {
            return Err(ResourceError::HostBufferBusy { pending });
        }
        let (device, host, bytes) = (dst.block().ptr(), src.addr(), src.num_bytes());
        let gpu = self.gpu().clone();
        let mut queued = false;
        let out = self.launch(stream).write(dst).enqueue(|raw| {
            // SAFETY: `raw` is the live stream of `stream` (the launch
            // resolved it in this resource's pool); `device..+bytes` is
            // `dst`'s live block (its launch orders the copy after the
            // block's allocation and conflicting uses, and its free after
            // the copy); `host..+bytes` lies in `src`'s block, pinned by
            // this very backend (checked above), which goes back to its
            // pool only once this copy is seen complete; the host cannot
            // write it until then (`as_mut_slice` checks the use noted
            // below, `&src` keeps a slice from being written now).
            let r = unsafe { gpu.copy_to_device_async(device, host, bytes, raw) };
            queued = r.is_ok();
            r.map_err(ResourceError::from)
        });
        self.finish_host_copy(src, out, queued, stream, false)
    }

    /// Queues, on `stream`, a copy of the device buffer `src` into the host
    /// buffer `dst`, and returns a future that completes when the GPU has
    /// run it; then [`dst.as_slice()`](HostBuffer::as_slice) reads the
    /// result.
    ///
    /// # Errors
    /// As [`copy_to_device`](Self::copy_to_device), `HostBufferBusy` when a
    /// copy of `dst` on another stream is not seen complete.
    ///
    /// # Cancel safety
    /// As [`copy_to_device`](Self::copy_to_device).
    ///
    /// # Stream ordering
    /// As a launch reading `src` on `stream`; the host may read `dst` once
    /// the copy was seen complete.
    pub fn copy_to_host<T: HostElement>(
        &self,
        src: &Buffer<T>,
        dst: &mut HostBuffer<T>,
        stream: StreamId,
    ) -> ResourceResult<EventFuture> {
        self.check_host_copy(dst, src.len())?;
        let pending = dst.uses.conflicts(true, Some(stream));
        if pending > 0 {
            return Err(ResourceError::HostBufferBusy { pending });
        }
        let (device, host, bytes) = (src.block().ptr(), dst.addr(), dst.num_bytes());
        let gpu = self.gpu().clone();
        let mut queued = false;
        let out = self.launch(stream).read(src).enqueue(|raw| {
            // SAFETY: as in `copy_to_device`, with `src` read and `dst`
            // written: `&mut dst` keeps every host access away now, and
            // `as_slice`/`as_mut_slice` refuse until this copy is seen
            // complete; no copy of `dst` on another stream is unseen
            // (checked above), so the device writes it alone.
            let r = unsafe { gpu.copy_to_host_async(host, device, bytes, raw) };
            queued = r.is_ok();
            r.map_err(ResourceError::from)
        });
        self.finish_host_copy(dst, out, queued, stream, true)
    }

    /// The checks before any copy: the host buffer's pool is on this
    /// resource's backend, and the lengths agree.
    fn check_host_copy<T>(&self, host: &HostBuffer<T>, device_len: usize) -> ResourceResult<()> {
        if !host.pool.same_backend(self.gpu()) {
            return Err(ResourceError::ForeignHostBuffer);
        }
        if host.len() != device_len {
            return Err(ResourceError::OutOfBounds {
                start: 0,
                end: host.len(),
                len: device_len,
            });
        }
        if host.is_tainted() {
            return Err(ResourceError::HostBufferBusy { pending: 1 });
        }
        Ok(())
    }

    /// Notes the copy's point on the host buffer, or, when the copy was
    /// queued but the launch failed after it, keeps the buffer from the
    /// host and its pool for good.
    fn finish_host_copy<T>(
        &self,
        host: &HostBuffer<T>,
        out: ResourceResult<((), EventFuture)>,
        queued: bool,
        stream: StreamId,
        writes: bool,
    ) -> ResourceResult<EventFuture> {
        match out {
            Ok(((), done)) => {
                host.note_copy(self.core(), stream, done.seq(), writes);
                Ok(done)
            }
            Err(e) => {
                if queued {
                    host.taint();
                }
                Err(e)
            }
        }
    }
}
