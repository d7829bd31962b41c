//! [`HostPool`]: pinned host blocks by size class, handed out again once
//! the host saw their copies complete.
//!
//! [`HostPool::allocate`] takes an idle block or pins a new one (the pin,
//! a slow driver call, is made without the lock, its bytes counted first
//! so that two allocations never pass the cap together); a failed pin
//! gives its counted bytes back and changes nothing else.
//! [`HostPool::trim`] and the cap's relief unpin idle blocks. The books
//! live in [`blocks`](super::blocks).

use std::sync::Arc;

use super::blocks::{Shared, State};
use super::buffer::HostBuffer;
use super::config::HostPoolConfig;
use super::element::HostElement;
use super::stats::{HostPoolStats, HostTagStats};
use crate::device::Device;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{Gpu, HostMemory};
use crate::types::AllocTag;
use crate::util::sync::Mutex;

const MIN_CLASS: usize = 4096;

/// The size class of a request of `bytes`: the next power of two, at
/// least a page (as PyTorch's host allocator rounds), or `None` past the
/// largest power of two of `usize`.
pub(super) fn size_class(bytes: usize) -> Option<usize> {
    bytes.max(MIN_CLASS).checked_next_power_of_two()
}

/// A pool of pinned host memory: [`HostBuffer`]s for staging copies, whose
/// blocks come back to the pool once the host saw every copy of them
/// complete. The essay of `src/host/` says how.
///
/// Cloning shares the pool. One pool serves one backend: its buffers are
/// copied by resources on that backend (the same `Arc` of the device).
/// When the last handle and the last buffer are gone, the idle blocks are
/// unpinned (a driver call that may wait for the device: let a pool go
/// outside latency-critical polls); blocks whose copies were never seen
/// complete stay pinned rather than be freed under a copy.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), streamalloc::ResourceError> {
/// use streamalloc::{HostPool, HostPoolConfig};
/// use streamalloc::{AllocTag, AsyncResource, Device, gpu::sim::SimGpu};
///
/// let device = Device::sim(&SimGpu::new(), 1);
/// let res = AsyncResource::on(&device)?;
/// let pool = HostPool::new(&device, HostPoolConfig::new().cap(64 << 20));
/// let s = device.stream(0)?;
///
/// let mut input = pool.allocate::<f32>(1024, AllocTag("input"))?;
/// input.as_mut_slice()?.fill(1.0);                     // the host writes it
/// let mut x = res.allocate_buffer::<f32>(1024, s, AllocTag("x")).await?;
/// res.copy_to_device(&input, &mut x, s)?.await?;       // the GPU read it
/// drop(input);                                         // back to the pool, idle
/// assert_eq!(pool.stats().idle_bytes, 4096);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct HostPool {
    shared: Arc<Shared>,
}

impl HostPool {
    /// A pool pinning memory through `device`'s backend.
    pub fn new<G: Gpu>(device: &Device<G>, config: HostPoolConfig) -> Self {
        let gpu: Arc<dyn Gpu> = device.gpu().clone();
        Self::with_gpu(gpu, config)
    }

    /// A pool pinning memory through `gpu` (the backend an
    /// [`AsyncResource::gpu`](crate::AsyncResource::gpu) names).
    pub fn with_gpu(gpu: Arc<dyn Gpu>, config: HostPoolConfig) -> Self {
        HostPool {
            shared: Arc::new(Shared {
                gpu,
                config,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The books the pool's handles and buffers share.
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The pool's configuration.
    pub fn config(&self) -> HostPoolConfig {
        self.shared.config
    }

    /// A host buffer of `len` elements of `T` tagged `tag`: an idle block
    /// of its size class when there is one (no driver call), else newly
    /// pinned and zeroed. A reused block holds what its last owner left.
    ///
    /// # Errors
    /// [`EmptyHostBuffer`](ResourceError::EmptyHostBuffer) for zero
    /// elements; [`SizeOverflow`](ResourceError::SizeOverflow) when the
    /// bytes overflow; [`HostPoolFull`](ResourceError::HostPoolFull) past
    /// the cap (after taking back what it can); the driver's error when
    /// pinning fails (out of memory included). Nothing changes on error.
    ///
    /// # Stream ordering
    /// The buffer is the caller's at once: the host saw every copy of its
    /// block complete before the block became idle.
    ///
    /// Pinning and unpinning are slow driver calls (unpinning may wait for
    /// the device): allocate outside the polls of latency-critical futures
    /// once the pool is warm, or warm it first.
    pub fn allocate<T: HostElement>(
        &self,
        len: usize,
        tag: AllocTag,
    ) -> ResourceResult<HostBuffer<T>> {
        if len == 0 {
            return Err(ResourceError::EmptyHostBuffer);
        }
        let elem_size = std::mem::size_of::<T>().max(1);
        let overflow = ResourceError::SizeOverflow { len, elem_size };
        let bytes = len.checked_mul(elem_size).ok_or(overflow.clone())?;
        let class = size_class(bytes)
            .filter(|&c| c <= isize::MAX as usize)
            .ok_or(overflow)?;
        let block = self.allocate_block(class, tag)?;
        Ok(HostBuffer::new(block, len, tag, self.shared.clone()))
    }

    /// A block of `class` bytes (a size class) handed out to `tag`: an
    /// idle one (noted to the backend as reused), else newly pinned and
    /// zeroed.
    pub(super) fn allocate_block(&self, class: usize, tag: AllocTag) -> ResourceResult<HostMemory> {
        let shared = &self.shared;
        if let Some(block) = self.take(class, tag) {
            shared.gpu.note_host_reuse(block.addr);
            return Ok(block);
        }
        self.reserve(class)?;
        match shared.gpu.host_alloc(class, shared.config.numa_node) {
            Ok(block) => {
                // Zeroed on the allocating thread: the slices are of
                // initialized elements from the first, and first touch
                // places the pages (see `HostPoolConfig::numa_node`).
                HostBuffer::<u8>::zero(&block);
                let mut st = shared.lock();
                st.pins += 1;
                st.peak_held = st.peak_held.max(st.held);
                st.hand_out(class, tag);
                drop(st);
                Ok(block)
            }
            Err(e) => {
                shared.lock().held -= class;
                Err(ResourceError::from(e))
            }
        }
    }

    /// An idle block of `class`, handed out to `tag`, collecting the
    /// pending blocks seen complete first when there is none.
    fn take(&self, class: usize, tag: AllocTag) -> Option<HostMemory> {
        for collected in [false, true] {
            if collected {
                self.shared.collect();
            }
            let mut st = self.shared.lock();
            if let Some(block) = st.take_idle(class) {
                st.reuses += 1;
                st.hand_out(class, tag);
                return Some(block);
            }
        }
        None
    }

    /// Counts `class` more bytes held, unpinning idle blocks to stay under
    /// the cap.
    fn reserve(&self, class: usize) -> ResourceResult<()> {
        let cap = self.shared.config.cap;
        let fits = |st: &State| st.held.checked_add(class).is_some_and(|h| h <= cap);
        let relief = {
            let mut st = self.shared.lock();
            if fits(&st) {
                st.held += class;
                return Ok(());
            }
            st.drain_idle()
        };
        self.shared.unpin(relief);
        let mut st = self.shared.lock();
        if fits(&st) {
            st.held += class;
            return Ok(());
        }
        Err(ResourceError::HostPoolFull {
            requested: class,
            cap,
            held: st.held,
        })
    }

    /// Takes back the pending blocks seen complete, then unpins every idle
    /// block; returns the bytes unpinned. Live buffers and blocks whose
    /// copies are not seen complete stay.
    ///
    /// # Errors
    /// None so far: a failed unpin is logged and its block counted as
    /// leaked (see [`HostPoolStats::leaked_bytes`]).
    pub fn trim(&self) -> ResourceResult<usize> {
        self.shared.collect();
        let idle = self.shared.lock().drain_idle();
        Ok(self.shared.unpin(idle))
    }

    /// The pool's statistics, after taking back the pending blocks seen
    /// complete.
    pub fn stats(&self) -> HostPoolStats {
        self.shared.collect();
        let st = self.shared.lock();
        let mut tags: Vec<(AllocTag, HostTagStats)> =
            st.tags.iter().map(|(t, s)| (*t, *s)).collect();
        tags.sort_by_key(|(t, _)| *t);
        HostPoolStats {
            held_bytes: st.held,
            peak_held_bytes: st.peak_held,
            in_use_bytes: st.in_use,
            idle_bytes: st.idle_bytes,
            pending_bytes: st.pending_bytes,
            leaked_bytes: st.leaked,
            pins: st.pins,
            unpins: st.unpins,
            reuses: st.reuses,
            cap: self.shared.config.cap,
            numa_node: self.shared.config.numa_node,
            tags,
        }
    }
}
