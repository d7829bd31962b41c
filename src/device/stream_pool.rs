//! [`StreamPool`]: the streams of one device, resolved by [`StreamId`].

// Unsafe here: `StreamPool::from_raw` trusts the caller's raw streams.
#![allow(unsafe_code)]

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use super::deferred_frees::DeferredFrees;
use super::graph_memory::KeptGraphMemory;
use super::stream_handles::StreamHandles;
use crate::error::{ResourceError, ResourceResult};
use crate::types::{RawStream, StreamId};

/// The streams of one device, resolved by [`StreamId`].
///
/// A resource orders every allocation, free and wait on a stream of its pool.
/// The pool owns its streams (for CUDA, cudarc `CudaStream`s) and keeps them
/// alive as long as any resource holds the pool.
///
/// Most pools are made full and never change. An *open-ended* pool
/// ([`StreamPool::open_ended`]) starts empty and takes streams created
/// elsewhere as they appear ([`StreamPool::register`]): an allocator
/// plugged into a framework that makes its own streams (PyTorch's) learns
/// them one call at a time.
pub struct StreamPool {
    device: u32,
    /// This pool's identity, carried by the ids it hands out (never 0, never
    /// reused in the process).
    pool: u64,
    raw: StreamHandles,
    // Keeps the backend streams alive; never read, only dropped.
    _owners: Vec<Arc<dyn Any + Send + Sync>>,
    #[cfg(feature = "cuda")]
    cuda: Vec<Arc<cudarc::driver::CudaStream>>,
    /// Allocations captures on these streams made and did not free: who
    /// frees each replay's instance (shared by every resource and graph on
    /// the pool).
    kept: KeptGraphMemory,
    /// Frees of dropped buffers a capture refused, applied once it ends.
    deferred: DeferredFrees,
    /// The context the streams belong to ([`Gpu::context_id`](crate::gpu::Gpu::context_id)), where the
    /// crate made or checked them; `None` for streams a caller vouched for
    /// ([`from_raw`](StreamPool::from_raw)).
    context: Option<u64>,
}

impl StreamPool {
    /// A pool of already-created backend streams of device `device`.
    ///
    /// `owners` are kept alive as long as the pool (pass the objects that own
    /// the streams); most users call [`StreamPool::cuda`] or
    /// [`SimGpu::stream_pool`](crate::gpu::sim::SimGpu::stream_pool) instead.
    ///
    /// # Safety
    /// The resources built on the pool hand these handles to the driver
    /// without further checks, so:
    /// 1. every handle in `raw` is a live stream of device `device`: a
    ///    `CUstream` of the context of the [`CudaGpu`](crate::gpu::cuda::CudaGpu)
    ///    it is used with, or a stream of the simulated device it is used
    ///    with;
    /// 2. each stays valid as long as the pool lives (kept alive by
    ///    `owners`, or by the caller), and nobody destroys it meanwhile.
    pub unsafe fn from_raw(
        device: u32,
        raw: Vec<RawStream>,
        owners: Vec<Arc<dyn Any + Send + Sync>>,
    ) -> Self {
        Self::from_checked(device, raw, owners)
    }

    /// A pool of handles the crate made and keeps valid itself (simulated
    /// streams, which the simulator checks on every call).
    pub(crate) fn from_checked(
        device: u32,
        raw: Vec<RawStream>,
        owners: Vec<Arc<dyn Any + Send + Sync>>,
    ) -> Self {
        StreamPool {
            device,
            pool: fresh_pool_id(),
            raw: StreamHandles::fixed(&raw),
            _owners: owners,
            kept: KeptGraphMemory::default(),
            deferred: DeferredFrees::default(),
            context: None,
            #[cfg(feature = "cuda")]
            cuda: Vec::new(),
        }
    }

    /// This pool, known to hold streams of the context `context`.
    pub(crate) fn in_context(mut self, context: u64) -> Self {
        self.context = Some(context);
        self
    }

    /// The context the pool's streams belong to, where the crate made or
    /// checked them (`None` for a pool made by
    /// [`from_raw`](Self::from_raw), whose caller vouched for them).
    pub fn context_id(&self) -> Option<u64> {
        self.context
    }

    #[cfg(feature = "cuda")]
    /// Creates `count` new non-blocking streams on the CUDA context `ctx`.
    ///
    /// # Errors
    /// [`ResourceError::Driver`] when the driver refuses to create a stream.
    pub fn cuda(ctx: &Arc<cudarc::driver::CudaContext>, count: usize) -> ResourceResult<Arc<Self>> {
        let mut cuda = Vec::with_capacity(count);
        for _ in 0..count {
            let stream = ctx.new_stream().map_err(|e| {
                ResourceError::from(crate::gpu::cuda::cuda_error(
                    crate::error::DriverCall::Init,
                    e,
                ))
            })?;
            cuda.push(stream);
        }
        let raw: Vec<_> = cuda
            .iter()
            .map(|s| RawStream(s.cu_stream() as u64))
            .collect();
        Ok(Arc::new(StreamPool {
            device: ctx.ordinal() as u32,
            pool: fresh_pool_id(),
            raw: StreamHandles::fixed(&raw),
            _owners: Vec::new(),
            kept: KeptGraphMemory::default(),
            deferred: DeferredFrees::default(),
            context: Some(ctx.cu_ctx() as u64),
            cuda,
        }))
    }

    #[cfg(feature = "cuda")]
    /// A pool of CUDA streams the caller already has (registration of user
    /// streams): the resource then orders its allocations, frees and the
    /// uses of buffers on them, and cudarc calls given one of them resolve
    /// to its [`StreamId`] (index = position in `streams`).
    ///
    /// # Errors
    /// [`ResourceError::UnknownStream`] for an empty list, and
    /// [`ResourceError::WrongDevice`] when the streams are not all of one
    /// context; nothing is kept.
    pub fn from_cuda_streams(
        streams: Vec<Arc<cudarc::driver::CudaStream>>,
    ) -> ResourceResult<Arc<Self>> {
        let first = streams.first().ok_or(ResourceError::UnknownStream {
            stream: StreamId::new(0, 0),
            pool_len: 0,
        })?;
        let ctx = first.context().clone();
        let device = ctx.ordinal() as u32;
        for s in &streams {
            if s.context().cu_ctx() != ctx.cu_ctx() {
                return Err(ResourceError::WrongDevice {
                    expected: device,
                    found: s.context().ordinal() as u32,
                });
            }
        }
        let raw: Vec<_> = streams
            .iter()
            .map(|s| RawStream(s.cu_stream() as u64))
            .collect();
        Ok(Arc::new(StreamPool {
            device,
            pool: fresh_pool_id(),
            raw: StreamHandles::fixed(&raw),
            _owners: Vec::new(),
            kept: KeptGraphMemory::default(),
            deferred: DeferredFrees::default(),
            context: Some(ctx.cu_ctx() as u64),
            cuda: streams,
        }))
    }

    #[cfg(feature = "cuda")]
    /// The id of the cudarc stream `stream`, when this pool holds it (same
    /// `CUstream` handle and context).
    pub fn find_cuda(&self, stream: &cudarc::driver::CudaStream) -> Option<StreamId> {
        self.cuda
            .iter()
            .position(|s| {
                s.cu_stream() == stream.cu_stream()
                    && s.context().cu_ctx() == stream.context().cu_ctx()
            })
            .map(|i| self.tagged(i))
    }

    #[cfg(feature = "cuda")]
    /// The cudarc stream behind `id`, to launch work on it.
    ///
    /// # Errors
    /// As [`StreamPool::raw`], and [`ResourceError::UnknownStream`] for a pool
    /// that was not built by [`StreamPool::cuda`].
    pub fn cuda_stream(&self, id: StreamId) -> ResourceResult<&Arc<cudarc::driver::CudaStream>> {
        self.check(id)?;
        self.cuda
            .get(id.index() as usize)
            .ok_or(ResourceError::UnknownStream {
                stream: id,
                pool_len: self.cuda.len(),
            })
    }

    /// Device ordinal of every stream in the pool.
    pub fn device(&self) -> u32 {
        self.device
    }

    /// The allocations captures on this pool's streams made and did not
    /// free ([`KeptGraphMemory`]).
    pub(crate) fn kept_graph_memory(&self) -> &KeptGraphMemory {
        &self.kept
    }

    /// The frees of dropped buffers of this pool that a capture refused
    /// ([`DeferredFrees`]).
    pub(crate) fn deferred_frees(&self) -> &DeferredFrees {
        &self.deferred
    }

    /// The pool's identity, which its [`StreamId`]s carry.
    pub(crate) fn id_of_pool(&self) -> u64 {
        self.pool
    }

    /// Number of streams (for an open-ended pool, registered so far).
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether the pool holds no stream.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many streams the pool can ever hold: its length, unless it is
    /// [open-ended](Self::open_ended). Resources size their per-stream
    /// state by it.
    pub fn capacity(&self) -> usize {
        self.raw.capacity()
    }

    /// The id of the stream at `index`, if the pool has one there.
    pub fn id(&self, index: usize) -> Option<StreamId> {
        (index < self.raw.len()).then(|| self.tagged(index))
    }

    /// Every stream id of the pool, in index order (for an open-ended pool,
    /// those registered when the call was made).
    pub fn ids(&self) -> impl Iterator<Item = StreamId> + '_ {
        (0..self.raw.len()).map(|i| self.tagged(i))
    }

    /// An empty pool of device `device` with room for `capacity` streams,
    /// which join it through [`register`](Self::register) as they appear.
    ///
    /// Resources built on it ([`StreamOrderedResource`](crate::StreamOrderedResource)
    /// and the cache over it) serve every stream registered, before or
    /// after they were built. The futures layer ([`AsyncResource`](crate::AsyncResource))
    /// serves the streams registered when it was built and refuses later
    /// ones with [`ResourceError::UnknownStream`].
    ///
    /// # Examples
    /// ```
    /// use streamalloc::gpu::sim::SimGpu;
    /// use streamalloc::{AllocTag, Device, DeviceMemoryResource, SimResource, StreamPool};
    ///
    /// let gpu = SimGpu::new();
    /// let elsewhere = gpu.stream_pool(1); // a stream someone else created
    /// let theirs = elsewhere.raw(elsewhere.id(0).unwrap())?;
    /// let pool = StreamPool::open_ended(0, 8);
    /// let device = Device::new(gpu, pool.clone())?;
    /// let resource = SimResource::new(&device);
    /// // SAFETY: the simulated stream lives as long as `gpu`, which the
    /// // device holds.
    /// let stream = unsafe { pool.register(theirs) }?;
    /// let block = resource.allocate(4096, stream, AllocTag("late"))?;
    /// resource.deallocate(block)?;
    /// # Ok::<(), streamalloc::ResourceError>(())
    /// ```
    pub fn open_ended(device: u32, capacity: usize) -> Arc<Self> {
        Arc::new(StreamPool {
            device,
            pool: fresh_pool_id(),
            raw: StreamHandles::open(capacity),
            _owners: Vec::new(),
            kept: KeptGraphMemory::default(),
            deferred: DeferredFrees::default(),
            // Each stream's caller vouches for its context at `register`.
            context: None,
            #[cfg(feature = "cuda")]
            cuda: Vec::new(),
        })
    }

    /// The id of stream `raw` in this pool, adding it if it is new.
    ///
    /// Registering a handle twice returns the same id, so one stream never
    /// has two names in one pool. Safe to call from any thread, at any time,
    /// alongside every other call.
    ///
    /// # Errors
    /// [`ResourceError::StreamPoolFull`] when `raw` is new and the pool
    /// holds [`capacity`](Self::capacity) streams already (every fixed pool
    /// is full); nothing changes.
    ///
    /// # Safety
    /// As [`StreamPool::from_raw`], for `raw`:
    /// 1. `raw` is a live stream of device `device`: a `CUstream` of the
    ///    context of the [`CudaGpu`](crate::gpu::cuda::CudaGpu) it is used
    ///    with (the null handle names that context's legacy default
    ///    stream), or a stream of the simulated device it is used with. It
    ///    names one stream for every thread: never a per-thread pseudo-handle
    ///    (`CU_STREAM_PER_THREAD`), which is another stream on each thread.
    /// 2. It stays valid as long as the pool lives, and nobody destroys it
    ///    meanwhile.
    pub unsafe fn register(&self, raw: RawStream) -> ResourceResult<StreamId> {
        self.raw
            .join(raw, self.device)
            .map(|index| self.tagged(index))
    }

    /// The id of stream `raw`, if it is in this pool.
    pub fn find(&self, raw: RawStream) -> Option<StreamId> {
        self.raw.position(raw).map(|index| self.tagged(index))
    }

    /// Resolves `id` to the backend handle.
    ///
    /// # Errors
    /// [`ResourceError::WrongDevice`] for a stream of another device,
    /// [`ResourceError::ForeignStream`] for one of another pool or of none
    /// (made by [`StreamId::new`]),
    /// [`ResourceError::UnknownStream`] for an index past the pool's end.
    #[inline]
    pub fn raw(&self, id: StreamId) -> ResourceResult<RawStream> {
        self.check(id)?;
        // An index the check passed stays in use: the pool never shrinks.
        self.raw
            .get(id.index() as usize)
            .ok_or(ResourceError::UnknownStream {
                stream: id,
                pool_len: self.len(),
            })
    }

    /// Whether `id` names a stream of this pool (as [`raw`](Self::raw)
    /// would resolve it).
    pub fn contains(&self, id: StreamId) -> bool {
        self.check(id).is_ok()
    }

    fn tagged(&self, index: usize) -> StreamId {
        StreamId::in_pool(self.device, index as u32, self.pool)
    }

    #[inline]
    fn check(&self, id: StreamId) -> ResourceResult<()> {
        ResourceError::check_device(self.device, id.device())?;
        // Only this pool's own ids: a hand-made id (pool 0) or another
        // pool's would resolve to a stream the resource using the id does
        // not order on, or of another device instance.
        if id.pool() != self.pool {
            return Err(ResourceError::ForeignStream { stream: id });
        }
        if id.index() as usize >= self.len() {
            return Err(ResourceError::UnknownStream {
                stream: id,
                pool_len: self.len(),
            });
        }
        Ok(())
    }
}

/// A pool identity never handed out before in this process (64 bits do not
/// wrap: a pool a nanosecond would take centuries).
fn fresh_pool_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl fmt::Debug for StreamPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamPool")
            .field("device", &self.device)
            .field("streams", &self.len())
            .finish()
    }
}
