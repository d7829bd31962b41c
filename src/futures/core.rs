//! The state every future, handle and background task of one
//! [`AsyncResource`](super::AsyncResource) shares.
//!
//! [`Core`] holds the wrapped resource (type-erased, so that the public
//! futures are not generic), the backend, the stream pool, one
//! [`Notifier`] per pool stream (each with the spare events of its
//! completion points), and the [queue of waiting allocations](super::wait_queue). Futures hold it by
//! `Arc`; the [watchdog](super::watchdog) and the [`Reaper`](super::Reaper)
//! hold it weakly, so that dropping the last user handle drops it.
//!
//! [`dispatch`](Core::dispatch) is the one place where landed notifications
//! become accounting: it applies completed frees to the inner resource
//! (`reap_through`), wakes the head of the allocation queue when bytes came
//! back, and queues the next notification of every stream that still has
//! something pending. It runs on the reaper, the watchdog, or inside a poll,
//! never inside a host function.

use std::sync::Arc;

use super::kick::Kick;
use super::notifier::Notifier;
use super::wait_policy::SharedPolicy;
use super::wait_queue::AllocQueue;
use super::watchdog::{self, Patrolled};
use crate::device::StreamPool;
use crate::error::{DriverCall, ResourceError, ResourceResult};
use crate::gpu::Gpu;
use crate::resource::DeviceMemoryResource;
use crate::types::StreamId;

/// Shared state of one async resource. See the [module documentation](self).
pub(crate) struct Core {
    pub(crate) inner: Arc<dyn DeviceMemoryResource>,
    pub(crate) gpu: Arc<dyn Gpu>,
    pub(crate) pool: Arc<StreamPool>,
    notifiers: Vec<Notifier>,
    pub(crate) allocs: AllocQueue,
    pub(crate) kick: Arc<Kick>,
    /// How new completion points wait before parking.
    pub(crate) policy: SharedPolicy,
    /// Total device memory, to refuse at once a request that could never fit.
    pub(crate) capacity: usize,
    /// Whether a free through `inner` may queue frees on other streams
    /// (see [`DeviceMemoryResource::frees_across_streams`]).
    frees_across: bool,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("streams", &self.notifiers.len())
            .field("waiting_allocations", &self.allocs.len())
            .finish_non_exhaustive()
    }
}

impl Core {
    pub(crate) fn new(
        inner: Arc<dyn DeviceMemoryResource>,
        gpu: Arc<dyn Gpu>,
        pool: Arc<StreamPool>,
    ) -> ResourceResult<Arc<Core>> {
        ResourceError::check_device(inner.device_ordinal(), pool.device())?;
        ResourceError::check_device(inner.device_ordinal(), gpu.ordinal())?;
        let kick = Arc::new(Kick::default());
        let mut notifiers = Vec::with_capacity(pool.len());
        for id in pool.ids() {
            let made = pool
                .raw(id)
                .and_then(|raw| Notifier::new(&*gpu, id, raw, kick.clone()));
            match made {
                Ok(n) => notifiers.push(n),
                Err(e) => {
                    notifiers.iter().for_each(|n| n.release_handles(&*gpu));
                    return Err(e);
                }
            }
        }
        let capacity = gpu.mem_info().map_or(usize::MAX, |(_, total)| total);
        let inner_across = inner.frees_across_streams();
        let core = Arc::new(Core {
            inner,
            gpu,
            pool,
            notifiers,
            allocs: AllocQueue::default(),
            kick: kick.clone(),
            policy: SharedPolicy::default(),
            capacity,
            frees_across: inner_across,
        });
        let patrolled: std::sync::Weak<dyn Patrolled> = Arc::downgrade(&core) as _;
        watchdog::spawn(patrolled, kick).map_err(|e| ResourceError::Driver {
            call: DriverCall::Init,
            code: -1,
            message: format!("cannot start the watchdog thread: {e}"),
        })?;
        Ok(core)
    }

    /// The notifier of `stream`, after checking the stream belongs to the
    /// pool.
    pub(crate) fn notifier(&self, stream: StreamId) -> ResourceResult<&Notifier> {
        // Each notifier knows its stream, so a stream of the pool is
        // recognised without reading the pool (one cache line fewer on
        // every `completion()`); the pool names what is wrong otherwise.
        match self.notifiers.get(stream.index() as usize) {
            Some(n) if n.stream == stream => Ok(n),
            _ => {
                self.pool.raw(stream)?;
                Err(ResourceError::UnknownStream {
                    stream,
                    pool_len: self.notifiers.len(),
                })
            }
        }
    }

    /// The notifier of a stream already checked by [`notifier`](Self::notifier)
    /// (the pool never shrinks).
    pub(crate) fn checked_notifier(&self, stream: StreamId) -> Option<&Notifier> {
        self.notifiers.get(stream.index() as usize)
    }

    pub(crate) fn notifiers(&self) -> &[Notifier] {
        &self.notifiers
    }

    /// After a call of the inner resource that may have queued frees on
    /// streams other than `except` (an eviction, a cache giving its blocks
    /// back on memory pressure): when the inner resource does that at all,
    /// gives each such free a point on its own stream, so that its
    /// notification reaps it like any other.
    pub(crate) fn mark_frees_elsewhere(&self, except: Option<StreamId>) {
        if !self.frees_across {
            return;
        }
        for n in self.notifiers.iter().filter(|n| Some(n.stream) != except) {
            if n.mark_free_if_new(self.inner.pending_free_seq(n.stream)) {
                n.launch(&*self.gpu);
            }
        }
    }

    /// Applies frees known done to `stream`'s accounting up to `free_seq`.
    pub(crate) fn reap(&self, stream: StreamId, free_seq: u64) {
        if free_seq == 0 {
            return;
        }
        let drained = self.inner.reap_through(stream, free_seq);
        if let Ok(n) = self.notifier(stream) {
            n.note_reaped(free_seq);
        }
        if drained > 0 {
            self.allocs.memory_returned();
        }
    }

    /// Applies landed notifications and queues the next ones.
    pub(crate) fn dispatch(&self) {
        for n in &self.notifiers {
            if let Some(to) = n.take_reap() {
                // `reap` calls the inner resource (user decorators
                // included): if it panics, the number goes back for the
                // next dispatch instead of being lost with the frees.
                let undo = RestoreReap { n, to: Some(to) };
                self.reap(n.stream, to);
                undo.done();
            }
            n.launch(&*self.gpu);
        }
    }
}

/// Puts a taken reap number back on its notifier unless [`done`](Self::done).
struct RestoreReap<'a> {
    n: &'a Notifier,
    to: Option<u64>,
}

impl RestoreReap<'_> {
    fn done(mut self) {
        self.to = None;
    }
}

impl Drop for RestoreReap<'_> {
    fn drop(&mut self) {
        if let Some(to) = self.to {
            self.n.restore_reap(to);
        }
    }
}

impl Patrolled for Core {
    fn patrol(&self, fallback: bool) {
        self.dispatch();
        if !fallback {
            return;
        }
        let mut failed = false;
        for n in &self.notifiers {
            if n.has_pending() {
                failed |= n.fallback_check(&*self.gpu);
            }
        }
        if failed {
            // Waiting allocations retry, and see the device's error.
            self.allocs.memory_returned();
        }
        self.dispatch();
    }

    /// Whether any stream waits on a notification.
    fn has_pending(&self) -> bool {
        self.notifiers.iter().any(Notifier::has_pending)
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        self.kick.close();
        for n in &self.notifiers {
            n.release_handles(&*self.gpu);
        }
    }
}
