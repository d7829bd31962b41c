//! One handle for a built stack: its layers' handles by type, `close`, and
//! a `shutdown` to zero.
//!
//! # Layers by type
//!
//! Each layer of a stack shows its handle to
//! [`DeviceMemoryResource::visit_layers`]: a statistics layer its
//! [`Stats`], a budget its [`Budget`], a cache its [`CacheStats`] as of the
//! call. [`AsyncResource::layer`] returns the outermost one of the type
//! asked for, whatever the order of the layers, instead of counting
//! `inner()`s; a layer of the user's own shows its own handle the same way.
//!
//! # Closing, and the life of a shutdown
//!
//! [`AsyncResource::close`] sets a flag every new allocation, reservation
//! and waiting request reads at its next poll: they fail with
//! [`Closed`](crate::ResourceError::Closed). Frees, completions and buffers held
//! go on as before, so the requests being served finish.
//! [`AsyncResource::shutdown`] then, without blocking a thread:
//!
//! 1. closes;
//! 2. awaits every pending free (`reap_pending`);
//! 3. in rounds, awaits the end of each stream of the pool, asks the stack
//!    for its idle memory (a cache's blocks and pages) and awaits the
//!    frees that queued, until two rounds in a row give nothing back. A
//!    cache's idle pages rest on the work last queued on them, and inside
//!    a poll a cache unmaps only what the host saw the GPU finish: the
//!    streams' ends make that fact (a stream being captured into a graph
//!    is not awaited: what rests on it stays);
//! 4. returns the final figures ([`ShutdownReport`]): what is still
//!    outstanding (0 B once every buffer was dropped), the statistics, the
//!    cache's and the budget's, the queue's.

#![forbid(unsafe_code)]

use std::any::Any;

use super::async_resource::AsyncResource;
use super::queue_stats::QueueStats;
use crate::adaptors::{Budget, Stats, StatsSnapshot};
use crate::cache::CacheStats;
use crate::error::{ResourceError, ResourceResult};
use crate::resource::DeviceMemoryResource;
use crate::util::poll_scope::PollScope;

/// The final figures of a stack, returned by
/// [`AsyncResource::shutdown`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Bytes the stack still holds on the device: 0 once every block and
    /// buffer was freed; more is what users still hold (or what a layer
    /// could not give back).
    pub bytes_outstanding: usize,
    /// Idle bytes the stack gave back during the shutdown.
    pub released_idle: usize,
    /// The outermost statistics layer's figures, if the stack has one.
    pub stats: Option<StatsSnapshot>,
    /// The outermost cache's figures, if the stack has one.
    pub cache: Option<CacheStats>,
    /// The outermost budget's bytes in use, if the stack has one.
    pub budget_in_use: Option<usize>,
    /// The wait queue's figures.
    pub queue: QueueStats,
}

impl<R: DeviceMemoryResource + ?Sized + 'static> AsyncResource<R> {
    /// The handle of the outermost layer of type `T` in the stack:
    /// [`Stats`], [`Budget`], [`CacheStats`] (the cache's figures now), or
    /// a handle a layer of your own shows to
    /// [`visit_layers`](DeviceMemoryResource::visit_layers). `None` when
    /// no layer shows one.
    ///
    /// # Examples
    /// ```
    /// use streamalloc::{Budget, Stats};
    /// use streamalloc::ResourceBuilder;
    /// use streamalloc::{CacheConfig, CacheStats};
    /// use streamalloc::{AsyncResource, Device, gpu::sim::SimGpu};
    ///
    /// let device = Device::sim(&SimGpu::new(), 1);
    /// let layers = ResourceBuilder::new()
    ///     .stats()
    ///     .cache(CacheConfig::default())
    ///     .budget(&Budget::new(1 << 30));
    /// let res = AsyncResource::build(&device, &layers)?.into_any();
    /// assert!(res.layer::<Stats>().is_some());
    /// assert_eq!(res.layer::<Budget>().unwrap().limit(), 1 << 30);
    /// assert_eq!(res.layer::<CacheStats>().unwrap().hits, 0);
    /// # Ok::<(), streamalloc::ResourceError>(())
    /// ```
    pub fn layer<T: Any + Clone>(&self) -> Option<T> {
        let mut found = None;
        self.inner().visit_layers(&mut |layer| {
            if found.is_none() {
                found = layer.downcast_ref::<T>().cloned();
            }
        });
        found
    }

    /// Refuses new allocations and reservations from now on
    /// ([`Closed`](crate::ResourceError::Closed)), and fails those waiting.
    /// Frees, completions and buffers already held work as before. Every
    /// clone of the resource is closed.
    pub fn close(&self) {
        self.core().close();
    }

    /// Closes, drains every pending free, awaits the work queued on every
    /// stream of the pool, gives the stack's idle memory back (a cache's
    /// blocks and pages) and returns the final figures, without blocking a
    /// thread. Once every buffer was dropped, the report's
    /// `bytes_outstanding` is 0, however far behind the host the GPU was.
    ///
    /// A running [`Reaper`](super::Reaper) may stay; shut it down after.
    ///
    /// # Errors
    /// The driver's error when a stream's device faulted (the figures are
    /// then lost; the resource is closed either way).
    ///
    /// # Cancel safety
    /// Cancel safe: dropped, it leaves the resource closed, with the frees
    /// and releases done so far done.
    pub async fn shutdown(&self) -> ResourceResult<ShutdownReport> {
        self.close();
        self.reap_pending().await?;
        let mut released_idle = 0;
        let mut rounds_without = 0;
        // Bounded: each round awaits every stream's end, then gives back
        // what became idle (a cache's pages once their blocks' frees ran,
        // and once the host saw the GPU done with them). Inside a poll a
        // cache unmaps only pages under a fence the host saw complete, and
        // records fences over the others: a round may give nothing yet let
        // the next one, after those fences, give the pages back. Two rounds
        // in a row that give nothing end it.
        for _ in 0..8 {
            self.reach_every_stream().await?;
            let given = {
                let _scope = PollScope::enter();
                let given = self.inner().release_idle()?;
                self.core().adopt_frees();
                given
            };
            self.reap_pending().await?;
            released_idle += given;
            rounds_without = if given == 0 { rounds_without + 1 } else { 0 };
            if rounds_without == 2 {
                break;
            }
        }
        if released_idle > 0 {
            // A cache's pages go back to the device by no drain of frees:
            // allocations waiting there, in other stacks, may fit now.
            self.core().device_memory_returned();
        }
        Ok(ShutdownReport {
            bytes_outstanding: self.bytes_outstanding(),
            released_idle,
            stats: self.layer::<Stats>().map(|s| s.snapshot()),
            cache: self.layer::<CacheStats>(),
            budget_in_use: self.layer::<Budget>().map(|b| b.in_use()),
            queue: self.queue_stats(),
        })
    }

    /// Awaits the current end of every stream of the pool, but those being
    /// captured (a point there could never be awaited outside the graph).
    async fn reach_every_stream(&self) -> ResourceResult<()> {
        let mut points = Vec::new();
        for stream in self.stream_pool().ids() {
            match self.completion(stream) {
                Ok(point) => points.push(point),
                Err(ResourceError::StreamCapturing { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        for point in points {
            point.await?;
        }
        Ok(())
    }
}
