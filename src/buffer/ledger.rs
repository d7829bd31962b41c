//! The use ledger: how a buffer orders its uses on other streams, including
//! uses whose end it never sees.
//!
//! # State
//! [`BufferCore`] holds the block, its home resource, and the *deferred*
//! uses: uses prepared on a stream whose work was queued by someone else
//! (cudarc, through the [`DevicePtr`](cudarc::driver::DevicePtr) traits),
//! so that no code of this crate runs once that work is queued. cudarc's
//! guard type ([`SyncOnDrop`](cudarc::driver::SyncOnDrop)) is a closed
//! enum: it can record a cudarc event or synchronize, not call back.
//!
//! # Who changes it
//! - [`BufferCore::begin`] prepares a use (the resource queues the waits on
//!   the last write, and for a write on every read) and, for a deferred use,
//!   notes it.
//! - A deferred use is *finished* (the resource records an event after it)
//!   at the next access that could conflict with it, which Rust's borrows
//!   place after cudarc's guard is gone:
//!   - a deferred **write** came through `&mut` and its guard borrowed the
//!     buffer mutably, so any later access at all comes after it: every
//!     `begin` finishes it first;
//!   - a deferred **read** came through `&`, so another `&` access may
//!     overlap it; only a `&mut` access (a write) or the buffer's end
//!     (`Drop`, `into_block`) comes surely after it, and those finish it.
//!     Reads need no ordering among themselves.
//! - Uses made through the crate's own guards are finished in the guard's
//!   `Drop`, exactly, and never noted here.
//!
//! # Failure
//! A failed prepare notes nothing. A failed finish is returned to the
//! caller of the access that ran it, or, in `Drop`, reported to
//! [`drop_errors`](super::drop_error_count).
//!
//! # Bounded
//! At most one deferred write and one deferred read per stream of the pool.
//! The lock is held only across the few non-blocking driver calls of one
//! flush and prepare (event records and stream waits), so that a concurrent
//! reader cannot prepare between another's flush and its record.

use std::sync::Arc;

use crate::util::sync::{Mutex, MutexGuard};

use super::home::{BufferHome, refuse_capturing};
use crate::error::{ResourceError, ResourceResult};
use crate::futures::DoneAt;
use crate::types::{Access, DeviceBlock, StreamId};

/// Uses prepared on a stream whose end this crate did not see, and what
/// the crate knows of when the GPU is done with the block.
#[derive(Debug, Default)]
struct Deferred {
    write: Option<StreamId>,
    reads: Vec<StreamId>,
    /// The point, on the block's stream, of the completion future of the
    /// last launch that used the block, when no use began after it: once
    /// that point settles, the GPU is done with every use (stream order
    /// covers the earlier ones on this stream).
    done_at: Option<DoneAt>,
    /// A use began on another stream: its end is not covered by a point of
    /// the block's stream, so no point ever says the GPU is done.
    elsewhere: bool,
}

impl Deferred {
    /// The streams of the uses noted.
    fn streams(&self) -> impl Iterator<Item = StreamId> + '_ {
        self.write.into_iter().chain(self.reads.iter().copied())
    }

    /// Notes a use on `stream` to be finished later.
    fn note(&mut self, stream: StreamId, access: Access) {
        match access {
            Access::Write => self.write = Some(stream),
            Access::Read if !self.reads.contains(&stream) => self.reads.push(stream),
            Access::Read => {}
        }
    }
}

/// Whether a [`BufferCore::begin`] is for a use whose end the crate sees
/// (its own guard) or not (cudarc's guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The caller finishes the use itself, when its guard drops.
    Guarded,
    /// The use is finished at the next conflicting access (see the module
    /// documentation).
    Deferred,
}

/// The state a buffer and all its views share.
pub(crate) struct BufferCore {
    pub(crate) block: DeviceBlock,
    pub(crate) home: Arc<dyn BufferHome>,
    tracking: bool,
    // Guarded by itself; held across the non-blocking driver calls of one
    // flush + prepare, never across a synchronize.
    deferred: Mutex<Deferred>,
}

impl std::fmt::Debug for BufferCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferCore")
            .field("block", &self.block)
            .field("deferred", &*self.lock())
            .finish()
    }
}

impl BufferCore {
    pub(crate) fn new(block: DeviceBlock, home: Arc<dyn BufferHome>) -> Self {
        BufferCore {
            tracking: home.tracks_uses(),
            block,
            home,
            deferred: Mutex::new(Deferred::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Deferred> {
        self.deferred.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Orders a use of the block with `access` on `stream` against every
    /// earlier use. `Access::Write` is only passed by callers holding the
    /// buffer mutably (so no deferred read can still be running its guard).
    ///
    /// # Errors
    /// [`TrackingUnsupported`](ResourceError::TrackingUnsupported) for a use
    /// on another stream than the block's when the stack cannot track it; an
    /// error finishing a deferred use; the resource's prepare error. Nothing
    /// is noted on error.
    pub(crate) fn begin(&self, stream: StreamId, access: Access, end: End) -> ResourceResult<()> {
        let block = self.block.id();
        if stream != self.block.stream() && !self.tracking {
            return Err(ResourceError::TrackingUnsupported { block, stream });
        }
        let mut deferred = self.lock();
        self.flush(&mut deferred, access == Access::Write)?;
        self.home.prepare(block, stream, access)?;
        // Work of this use may follow any point noted before.
        deferred.done_at = None;
        deferred.elsewhere |= stream != self.block.stream();
        if end == End::Deferred {
            deferred.note(stream, access);
        }
        Ok(())
    }

    /// A guarded use on `stream` whose finish failed (or may not have run:
    /// its launch unwound): its work may be queued, so it is noted as a
    /// deferred use, finished again at the next conflicting access or at
    /// the buffer's end, which keeps the block rather than free it
    /// unordered if that fails too. Finishing a use twice only records one
    /// more event after it.
    pub(crate) fn defer_end(&self, stream: StreamId, access: Access) {
        self.lock().note(stream, access);
    }

    /// A launch on `stream` that used the block ends at `done_at` (its
    /// completion future's point on that stream): once the point settles, the
    /// GPU is done with the block, unless a use began on another stream or
    /// begins after this.
    pub(crate) fn note_launch_point(&self, stream: StreamId, done_at: DoneAt) {
        let mut deferred = self.lock();
        if stream == self.block.stream() && !deferred.elsewhere {
            deferred.done_at = Some(done_at);
        }
    }

    /// The point of the block's stream whose settling says the GPU is done
    /// with the block, if one does. Callers own the buffer (`Drop`).
    pub(crate) fn done_at(&mut self) -> Option<DoneAt> {
        self.deferred
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .done_at
    }

    /// Finishes a guarded use: records where it ends.
    pub(crate) fn end(&self, stream: StreamId, access: Access) -> ResourceResult<()> {
        self.home.finish(self.block.id(), stream, access)
    }

    /// Finishes every deferred use. Callers own the buffer (`Drop`,
    /// `into_block`), so no lock is taken: the common case, nothing
    /// deferred, costs a length check.
    ///
    /// # Errors
    /// [`StreamCapturing`](ResourceError::StreamCapturing), finishing
    /// nothing, when the stream of a deferred use is inside a capture now:
    /// the use may have been queued before the capture, and an event
    /// recorded during it would be captured, not recorded, so the block's
    /// free would not be ordered after the use (the caller finishes once
    /// the capture ended: [`take_deferred`](Self::take_deferred)). The first
    /// error of a finish otherwise; what failed stays noted.
    pub(crate) fn finish_all(&mut self) -> ResourceResult<()> {
        let deferred = self.deferred.get_mut().unwrap_or_else(|p| p.into_inner());
        if deferred.write.is_none() && deferred.reads.is_empty() {
            return Ok(());
        }
        let mut taken = std::mem::take(deferred);
        let capturing = taken
            .streams()
            .try_for_each(|s| refuse_capturing(&*self.home, s));
        let r = capturing.and_then(|()| self.flush(&mut taken, true));
        *self.deferred.get_mut().unwrap_or_else(|p| p.into_inner()) = taken;
        r
    }

    /// The deferred uses left, taken out: `(stream, access)`, the write
    /// first. Callers own the buffer and finish them elsewhere (a drop
    /// during a capture: after it).
    pub(crate) fn take_deferred(&mut self) -> Vec<(StreamId, Access)> {
        let deferred = std::mem::take(self.deferred.get_mut().unwrap_or_else(|p| p.into_inner()));
        let write = deferred.write.map(|s| (s, Access::Write));
        write
            .into_iter()
            .chain(deferred.reads.into_iter().map(|s| (s, Access::Read)))
            .collect()
    }

    /// Finishes the deferred write, and with `reads` the deferred reads too.
    /// Every one is tried; the first error is returned, and what failed
    /// stays noted so that a later flush tries again.
    fn flush(&self, deferred: &mut Deferred, reads: bool) -> ResourceResult<()> {
        let block = self.block.id();
        let mut first = Ok(());
        if let Some(s) = deferred.write {
            match self.home.finish(block, s, Access::Write) {
                Ok(()) => deferred.write = None,
                Err(e) => first = Err(e),
            }
        }
        if reads {
            let mut kept = Vec::new();
            for s in deferred.reads.drain(..) {
                if let Err(e) = self.home.finish(block, s, Access::Read) {
                    kept.push(s);
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
            }
            deferred.reads = kept;
        }
        first
    }

    /// Number of deferred uses noted now (tests).
    #[cfg(test)]
    pub(crate) fn deferred_count(&self) -> usize {
        let d = self.lock();
        d.reads.len() + usize::from(d.write.is_some())
    }
}

#[cfg(test)]
mod tests {
    //! The deferred path, as cudarc drives it, on the simulated device.

    use std::sync::Arc;

    use super::End;
    use crate::gpu::sim::{MemAccess, SimGpu};
    use crate::types::{Access, AllocTag, StreamId};
    use crate::{Device, DeviceMemoryResource, SimResource};

    fn setup() -> (Arc<SimGpu>, Arc<SimResource>, Vec<StreamId>) {
        let gpu = SimGpu::builder().manual().build();
        let device = Device::simulated(&gpu, 3);
        let pool = device.streams().clone();
        let res = Arc::new(SimResource::new(&device));
        (gpu, res, pool.ids().collect())
    }

    /// What cudarc does with `device_ptr(&stream)`: prepare, hand out the
    /// address, queue the work, drop its guard (which calls nothing here).
    fn cudarc_use(
        gpu: &SimGpu,
        res: &SimResource,
        core: &super::BufferCore,
        s: StreamId,
        a: Access,
        end: End,
    ) {
        core.begin(s, a, end).unwrap();
        let raw = res.stream_pool().raw(s).unwrap();
        let ptr = core.block.ptr();
        gpu.launch_kernel(raw, &[MemAccess { ptr, access: a }])
            .unwrap();
    }

    #[test]
    fn deferred_reads_on_two_streams_are_recorded_before_the_free() {
        let (gpu, res, s) = setup();
        let buf = res
            .allocate_buffer::<f32>(64, s[0], AllocTag::UNTAGGED)
            .unwrap();
        cudarc_use(&gpu, &res, &buf.core, s[0], Access::Write, End::Deferred);
        cudarc_use(&gpu, &res, &buf.core, s[1], Access::Read, End::Deferred);
        cudarc_use(&gpu, &res, &buf.core, s[2], Access::Read, End::Deferred);
        assert_eq!(
            buf.core.deferred_count(),
            2,
            "the write was finished by the first read"
        );
        drop(buf);
        gpu.run_until_idle();
        res.reap_pending().unwrap();
        assert_eq!(res.bytes_outstanding(), 0);
        assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    }

    #[test]
    fn a_write_after_deferred_reads_waits_for_them() {
        let (gpu, res, s) = setup();
        let mut buf = res
            .allocate_buffer::<f32>(64, s[0], AllocTag::UNTAGGED)
            .unwrap();
        cudarc_use(&gpu, &res, &buf.core, s[1], Access::Read, End::Deferred);
        cudarc_use(&gpu, &res, &buf.core, s[2], Access::Read, End::Deferred);
        buf.fill_bytes_on(s[0], 0).unwrap();
        assert_eq!(buf.core.deferred_count(), 0);
        drop(buf);
        gpu.run_until_idle();
        assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    }

    /// The control: a use that is prepared but never recorded lets the free
    /// race it, and the detector says so.
    #[test]
    fn an_unrecorded_use_races_the_free() {
        let (gpu, res, s) = setup();
        let buf = res
            .allocate_buffer::<f32>(64, s[0], AllocTag::UNTAGGED)
            .unwrap();
        cudarc_use(&gpu, &res, &buf.core, s[1], Access::Read, End::Guarded);
        drop(buf);
        assert!(!gpu.take_races().is_empty());
        gpu.run_until_idle();
    }
}
