//! [`Reaper`]: the background task that turns notifications into
//! accounting.
//!
//! Host functions only flip flags and wake; somebody must then apply the
//! completed frees to the inner resource, wake the allocations waiting for
//! that memory, and queue the next notification of each stream. The reaper
//! is that somebody on a tokio runtime: a task parked on a
//! [`tokio::sync::Notify`] that the host functions signal — driven by the
//! notifications, not by a timer. Without a reaper the
//! [watchdog](super::watchdog) thread does the same work.
//!
//! The task holds the resource only weakly: dropping the resource while the
//! reaper runs ends the task instead of keeping the resource alive.

use std::sync::{Arc, Weak};

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::async_resource::AsyncResource;
use super::core::Core;
use super::dealloc::ReapFuture;
use super::kick::Kick;
use crate::error::{ResourceError, ResourceResult};
use crate::resource::DeviceMemoryResource;
use crate::util::sync::Ordering;

/// A running background reaper: a tokio task, woken by completion
/// notifications, that applies completed frees to the accounting, wakes the
/// allocations waiting for that memory and queues the next notifications
/// (step 5 of "How a completion reaches a task" in the essay of
/// `src/futures/`).
/// It holds the resource weakly: dropping the resource ends it.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), streamalloc::ResourceError> {
/// use streamalloc::{AsyncResource, Reaper};
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, SimResource};
///
/// let gpu = SimGpu::new();
/// let device = Device::simulated(&gpu, 1);
/// let res = AsyncResource::on(&device)?;
/// let reaper = Reaper::spawn(&res);
/// let block = res.try_allocate(4096, device.stream(0)?, AllocTag("x"))?;
/// drop(res.deallocate(block)?); // not awaited: the reaper accounts it
/// reaper.shutdown().await?;     // drains every pending free, then stops
/// assert_eq!(res.bytes_outstanding(), 0);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "dropping the Reaper stops it at once: bind it, and `shutdown().await` it to drain the pending frees"]
pub struct Reaper {
    stop: Arc<Notify>,
    task: Option<JoinHandle<ResourceResult<()>>>,
}

impl Reaper {
    /// Spawns the reaper of `resource` on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime, as [`tokio::spawn`] does; use
    /// [`spawn_on`](Self::spawn_on) to name a runtime.
    pub fn spawn<R: DeviceMemoryResource + ?Sized + 'static>(
        resource: &AsyncResource<R>,
    ) -> Reaper {
        Self::spawn_on(resource, &tokio::runtime::Handle::current())
    }

    /// Spawns the reaper of `resource` on the runtime of `handle`.
    pub fn spawn_on<R: DeviceMemoryResource + ?Sized + 'static>(
        resource: &AsyncResource<R>,
        handle: &tokio::runtime::Handle,
    ) -> Reaper {
        let core = resource.core();
        let kick = core.kick.clone();
        // Counted before the task starts, so that no notification goes to
        // the watchdog in between and is missed by both.
        kick.reapers.fetch_add(1, Ordering::AcqRel);
        let stop = Arc::new(Notify::new());
        let task = handle.spawn(run(Arc::downgrade(core), kick, stop.clone()));
        Reaper {
            stop,
            task: Some(task),
        }
    }

    /// Whether the task has ended (stopped, or its resource was dropped).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Stops the reaper after draining: resolves once every free pending at
    /// the call has executed and left the accounting.
    ///
    /// # Errors
    /// The driver's error when a stream faulted while draining;
    /// [`Shutdown`](ResourceError::Shutdown) when the task panicked.
    ///
    /// # Cancel safety
    /// Dropping the returned future stops the reaper anyway: the drain goes
    /// on in the background and nobody learns its outcome.
    pub async fn shutdown(mut self) -> ResourceResult<()> {
        self.stop.notify_one();
        match self.task.take() {
            Some(task) => task.await.unwrap_or(Err(ResourceError::Shutdown)),
            None => Ok(()),
        }
    }
}

impl Drop for Reaper {
    /// Stops the task without waiting (it drains in the background).
    fn drop(&mut self) {
        self.stop.notify_one();
    }
}

/// Decrements the reaper count however the task ends (even if aborted).
struct Registered(Arc<Kick>);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.reapers.fetch_sub(1, Ordering::AcqRel);
        // Anything signalled in between is picked up by the watchdog.
        self.0.dispatch();
    }
}

async fn run(core: Weak<Core>, kick: Arc<Kick>, stop: Arc<Notify>) -> ResourceResult<()> {
    let registered = Registered(kick.clone());
    loop {
        tokio::select! {
            biased;
            _ = stop.notified() => break,
            _ = kick.notify.notified() => {}
        }
        if kick.is_closed() {
            return Ok(());
        }
        match core.upgrade() {
            Some(core) => core.dispatch(),
            None => return Ok(()),
        }
    }
    // From here on the watchdog dispatches (the drain below only waits).
    drop(registered);
    // Drain: the future holds the core until the frees are known executed;
    // the fallback bounds that wait when the device is dead.
    let drain = match core.upgrade() {
        Some(core) => ReapFuture::new(core),
        None => return Ok(()),
    };
    drain.await
}
