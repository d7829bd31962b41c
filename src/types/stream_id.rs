//! Stream names: the backend handle [`RawStream`] and the [`StreamId`] a
//! device's [`StreamPool`](crate::StreamPool) resolves.

// Unsafe here: `StreamId::from_cuda` trusts a raw CUDA stream handle.
#![allow(unsafe_code)]

use std::fmt;

/// A backend stream handle: a `CUstream` for CUDA, an index for the
/// simulated device. Plain `Copy` data; the [`StreamPool`](crate::StreamPool) keeps the stream
/// itself alive.
///
/// Handles are made by the crate (a pool, or [`SimGpu`](crate::gpu::sim::SimGpu))
/// or, for a stream created elsewhere, by the unsafe [`RawStream::from_cuda`],
/// so that a safe call never hands the driver a made-up pointer. Simulated
/// handles carry a tag bit, so neither backend accepts the other's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawStream(pub(crate) u64);

/// Marks handles of the simulated device (user-space pointers never have it).
pub(crate) const SIM_HANDLE: u64 = 1 << 63;

/// Bits of a simulated handle that name its host (above the index's 32), so
/// that one simulated host refuses another's stream of the same index.
const SIM_HOST_MASK: u64 = (1 << 31) - 1;

impl RawStream {
    #[cfg(feature = "cuda")]
    /// Wraps a `CUstream` created outside the crate.
    ///
    /// # Safety
    /// 1. `stream` is a valid `CUstream` of the context of the resource or
    ///    [`CudaGpu`](crate::gpu::cuda::CudaGpu) it is used with, or null.
    /// 2. It stays valid as long as the handle is used.
    pub unsafe fn from_cuda(stream: cudarc::driver::sys::CUstream) -> Self {
        RawStream(stream as u64)
    }

    /// Stream `index` of the simulated host `host`.
    pub(crate) fn sim(host: u32, index: usize) -> Self {
        RawStream(SIM_HANDLE | ((host as u64 & SIM_HOST_MASK) << 32) | (index as u64 & 0xFFFF_FFFF))
    }

    /// The simulated host and stream index, if this is a simulated handle.
    pub(crate) fn sim_parts(self) -> Option<(u32, usize)> {
        (self.0 & SIM_HANDLE != 0).then_some((
            ((self.0 >> 32) & SIM_HOST_MASK) as u32,
            (self.0 & 0xFFFF_FFFF) as usize,
        ))
    }

    /// The handle's bits (a `CUstream` pointer, or a tagged simulated index).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The simulated stream index, if this is a simulated handle (the CUDA
    /// backend refuses such a handle).
    #[cfg(feature = "cuda")]
    pub(crate) fn sim_index(self) -> Option<usize> {
        self.sim_parts().map(|(_, index)| index)
    }
}

/// Names one stream of one device's [`StreamPool`](crate::StreamPool).
///
/// The device ordinal travels with the id, so that a stream of another device
/// is refused with [`ResourceError::WrongDevice`](crate::ResourceError::WrongDevice)
/// instead of being resolved against the wrong pool; so does the pool that
/// handed the id out, so that any other pool refuses it with
/// [`ResourceError::ForeignStream`](crate::ResourceError::ForeignStream),
/// another pool of the same device and ordinal included (a second
/// [`Device`](crate::Device), a pool of another simulated device or CUDA
/// context). A stream is usable only through an id its own pool handed out
/// ([`Device::stream`](crate::Device::stream), [`StreamPool::id`](crate::StreamPool::id)),
/// so a resource and the backend that runs its work always agree on which
/// stream, of which device instance, an id names.
///
/// Identity (`==`, hashing, ordering) is the device and the index: the pool
/// is a check made when the id is resolved, not part of the name. An id
/// built by hand with [`StreamId::new`] names no pool: it compares and
/// prints, but no pool resolves it.
#[derive(Debug, Clone, Copy)]
pub struct StreamId {
    device: u32,
    index: u32,
    /// The pool that handed the id out; 0 for none.
    pool: u64,
}

impl PartialEq for StreamId {
    fn eq(&self, other: &Self) -> bool {
        (self.device, self.index) == (other.device, other.index)
    }
}

impl Eq for StreamId {}

impl std::hash::Hash for StreamId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.device, self.index).hash(state);
    }
}

impl PartialOrd for StreamId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for StreamId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.device, self.index).cmp(&(other.device, other.index))
    }
}

impl StreamId {
    /// The name of the stream at `index` of device `device`, in no pool: an
    /// id to compare with or to print. No pool resolves it (every call that
    /// takes it refuses it with
    /// [`ForeignStream`](crate::ResourceError::ForeignStream)); get ids to
    /// work with from [`Device::stream`](crate::Device::stream) or
    /// [`StreamPool::id`](crate::StreamPool::id).
    pub const fn new(device: u32, index: u32) -> Self {
        StreamId {
            device,
            index,
            pool: 0,
        }
    }

    /// The stream at `index` of the pool whose identity is `pool`.
    pub(crate) const fn in_pool(device: u32, index: u32, pool: u64) -> Self {
        StreamId {
            device,
            index,
            pool,
        }
    }

    /// Whether `self` and `other` are the same id of the same pool (`==`
    /// compares the names only).
    pub(crate) fn is(self, other: StreamId) -> bool {
        self == other && self.pool == other.pool
    }

    /// The identity of the pool that handed the id out (0 for none).
    pub(crate) const fn pool(self) -> u64 {
        self.pool
    }

    /// Device ordinal of the stream.
    pub const fn device(self) -> u32 {
        self.device
    }

    /// Index of the stream in its pool.
    pub const fn index(self) -> u32 {
        self.index
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {}:{}", self.device, self.index)
    }
}
