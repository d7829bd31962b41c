//! Sleep and wake through the futures layer: the sleep of the stack's
//! cache (wherever it sits among the layers, reached through
//! [`DeviceMemoryResource::begin_sleep`]), awaited rather than waited for.
//!
//! [`CachingResource::begin_sleep`] queues the sleep's work and names the
//! streams it went on; the host learns that work complete through a
//! completion point on each ([`AsyncResource::completion`], the same
//! notifications every launch's future rests on: no thread is parked and
//! no stream synchronized), and only then does
//! [`CachingResource::settle_sleep`] query the fences and unmap. The wake
//! is the same over [`CachingResource::wake`]'s restores.

use super::async_resource::AsyncResource;
#[cfg(doc)]
use crate::cache::CachingResource;
use crate::error::ResourceResult;
use crate::resource::DeviceMemoryResource;
use crate::resource::SleepPlan;
use crate::types::StreamId;

impl<R: DeviceMemoryResource + ?Sized + 'static> AsyncResource<R> {
    /// Puts the blocks of the tags `plan` names to sleep and gives their
    /// physical memory back, as [`CachingResource::sleep`] does, awaiting
    /// the work queued before it instead of blocking a thread. The stack's
    /// outermost cache sleeps, whatever layers sit above it. Once the pages
    /// went back, the allocations waiting for memory on the device, in any
    /// stack, are woken.
    ///
    /// ```
    /// use streamalloc::{CacheConfig, SleepMode, SleepPlan};
    /// use streamalloc::{AllocTag, AsyncResource, Device, ResourceBuilder};
    /// use streamalloc::gpu::sim::SimGpu;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), streamalloc::ResourceError> {
    /// let device = Device::sim(&SimGpu::new(), 2);
    /// let res = AsyncResource::build(&device, &ResourceBuilder::new().cache(CacheConfig::default()))?;
    /// let s = device.stream(0)?;
    /// let weights = res.allocate(64 << 20, s, AllocTag("weights")).await?;
    /// let held = res.bytes_outstanding();
    /// res.sleep(&SleepPlan::new().tag(AllocTag("weights"), SleepMode::Offload)).await?;
    /// assert!(res.bytes_outstanding() < held);
    /// res.wake().await?;
    /// assert!(res.bytes_outstanding() >= 64 << 20);
    /// drop(res.deallocate(weights)?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`CachingResource::sleep`]; an error of a completion point after
    /// the work was queued (a device fault): the sleep is in effect, its
    /// memory not given back yet ([`settle_sleep`](DeviceMemoryResource::settle_sleep)
    /// gives it back later, [`wake`](Self::wake) ends it).
    /// [`SleepRefused`](crate::ResourceError::SleepRefused) when no layer
    /// of the stack can sleep.
    ///
    /// # Cancel safety
    /// Dropping the future after its first poll leaves the sleep in
    /// effect, not settled: [`settle_sleep`](DeviceMemoryResource::settle_sleep) or the next
    /// sleep-related call gives the memory back once the host sees the
    /// GPU done, and [`wake`](Self::wake) ends it.
    pub async fn sleep(&self, plan: &SleepPlan) -> ResourceResult<()> {
        let streams = self.inner().begin_sleep(plan)?;
        self.reach(&streams).await?;
        // The host saw every stream past the sleep's fences: the query
        // inside says so, and the mappings go.
        let settled = self.inner().settle_sleep()?;
        if settled {
            // The pages went back to the device, by no drain of frees:
            // allocations waiting there, in any stack, may fit now.
            self.core().device_memory_returned();
        }
        Ok(())
    }

    /// Wakes the sleep in effect, as [`CachingResource::wake`] does, and
    /// awaits the restores (so their host memory goes back too).
    ///
    /// The offloads' host memory goes back to the plan's lender
    /// ([`SleepPlan::offload_to`], a host pool: a push under its lock) or,
    /// when the plan named none, is unpinned here (`cuMemFreeHost`, about
    /// as slow as pinning: on an H100 it made a wake of 1.5 GiB of weights
    /// 4.5× allocating and copying them in again). Give the plan a pool.
    ///
    /// # Errors
    /// As [`CachingResource::wake`]; an error of a completion point (the
    /// blocks are awake; their host memory is freed by a later call).
    ///
    /// # Cancel safety
    /// Dropping the future after its first poll loses nothing: the blocks
    /// are awake and stream-ordered after their restores. The offloads'
    /// host memory then goes back at a later
    /// [`settle_sleep`](DeviceMemoryResource::settle_sleep) or sleep, once
    /// the host saw the copies back done.
    pub async fn wake(&self) -> ResourceResult<()> {
        let streams = self.inner().wake()?;
        self.reach(&streams).await?;
        self.inner().settle_sleep().map(drop)
    }

    /// Awaits the current end of each of `streams`.
    async fn reach(&self, streams: &[StreamId]) -> ResourceResult<()> {
        let points = streams
            .iter()
            .map(|&s| self.completion(s))
            .collect::<ResourceResult<Vec<_>>>()?;
        for point in points {
            point.await?;
        }
        Ok(())
    }
}
