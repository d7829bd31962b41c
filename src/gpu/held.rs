//! [`HeldMemory`]: how much device memory a backend holds for the process.

/// Device memory a backend holds for the process: what the device gave it,
/// whether allocations use it right now or it sits idle in a pool.
///
/// This is the figure a memory budget of the whole card is about, and the one
/// to set against the bytes an application asked for (the trace replay of the
/// measurement crate reports their ratio). It is read from the backend, not
/// reconstructed by the allocator above it, so that memory held in the
/// driver's pool, in reserved chunks or in mapped virtual-memory pages is all
/// counted.
///
/// # Examples
/// ```
/// use streamalloc::gpu::Gpu;
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, DeviceMemoryResource, SimResource};
///
/// let gpu = SimGpu::builder().manual().build();
/// let device = Device::simulated(&gpu, 1);
/// let pool = device.streams().clone();
/// let resource = SimResource::new(&device);
/// let block = resource.allocate(1000, pool.id(0).unwrap(), AllocTag::UNTAGGED)?;
/// // The simulated device hands out 256-byte granules.
/// assert_eq!(gpu.memory_held()?.current, 1024);
/// resource.deallocate(block)?;
/// let held = gpu.memory_held()?;
/// assert_eq!((held.current, held.high), (0, 1024));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldMemory {
    /// Bytes held now.
    pub current: usize,
    /// The most bytes held at any time since the backend was created or
    /// since its last [`reset_memory_held_high`](super::Gpu::reset_memory_held_high).
    pub high: usize,
}
