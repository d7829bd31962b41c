//! Blocks: [`DeviceBlock`], its [`BlockId`], [`BlockState`], [`AllocTag`] and
//! the [`Access`] kind of a use.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::StreamId;

/// Identifies one resource instance, so that a block handed to the wrong
/// resource is recognised as foreign.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId(u64);

impl ResourceId {
    /// A fresh id, never returned before in this process.
    pub fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        ResourceId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Names one allocation of one resource. Ids are never reused by a resource,
/// so a stale id is recognised as such.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId {
    resource: ResourceId,
    serial: u64,
}

impl BlockId {
    /// The `serial`-th block of `resource`. Resources build ids; users get
    /// them from [`DeviceBlock::id`].
    pub const fn new(resource: ResourceId, serial: u64) -> Self {
        BlockId { resource, serial }
    }

    /// The resource that handed the block out.
    pub const fn resource(self) -> ResourceId {
        self.resource
    }

    /// The block's serial number within its resource: unique, never 0, not
    /// necessarily consecutive (resources may encode where they keep the
    /// block in it).
    pub const fn serial(self) -> u64 {
        self.serial
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {}#{}", self.resource.0, self.serial)
    }
}

/// Where a block is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BlockState {
    /// Allocated and usable on its stream.
    Live,
    /// Deallocated: its free is queued (or done); the memory is no longer the
    /// user's.
    Retired,
    /// Deallocated into a debug guard's quarantine; the real free comes later.
    Quarantined,
}

/// A label a caller attaches to an allocation, for statistics and tracing
/// (for instance "weights", "activations", "kv-cache").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct AllocTag(pub &'static str);

impl AllocTag {
    /// The tag of allocations that name none.
    pub const UNTAGGED: AllocTag = AllocTag("untagged");
}

impl fmt::Display for AllocTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "untagged"
        } else {
            self.0
        })
    }
}

/// How a use touches a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// The work only reads the block.
    Read,
    /// The work writes (and possibly reads) the block.
    Write,
}

/// One allocation handed out by a resource: its address, size, stream and tag.
///
/// A `DeviceBlock` is a descriptor, not an owner: dropping it frees nothing,
/// and the memory goes back only through
/// [`DeviceMemoryResource::deallocate`](crate::DeviceMemoryResource::deallocate).
/// It is `Clone` so that a launch can hold it while the owner keeps its own;
/// handing a clone to `deallocate` twice is reported as
/// [`ResourceError::DoubleFree`](crate::ResourceError::DoubleFree).
///
/// # Forging
/// [`DeviceBlock::new`] is safe, and so is `Clone`, because a descriptor is
/// a claim, not a capability: no safe call hands a block's address to the
/// driver on the descriptor's word. A block becomes a
/// [`Buffer`](crate::Buffer) (whose fills and copies write at its address)
/// only as its resource's [`allocate`](crate::DeviceMemoryResource::allocate)
/// returned it, which the resource's `unsafe impl` vouches for. A block
/// given back (`deallocate`, the block-use hooks, a launch's declared
/// blocks) is judged by the resource's own books, its id, address, size and
/// stream (pool included), and refused otherwise
/// ([`UnknownBlock`](crate::ResourceError::UnknownBlock),
/// [`ForeignBlock`](crate::ResourceError::ForeignBlock),
/// [`DoubleFree`](crate::ResourceError::DoubleFree)): item 3 of the trait's
/// `# Safety` list asks that of every implementation.
///
/// # Stream ordering
/// The block is valid on its [`stream`](DeviceBlock::stream) from the point
/// where the allocation was queued. Work on another stream must be ordered
/// after that point (the block-use hooks do it), and the block's memory may be
/// handed to another allocation as soon as the free is queued on the
/// allocation stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a DeviceBlock is a descriptor, not an owner: dropping it leaks its memory; deallocate it, or use an owned Buffer"]
pub struct DeviceBlock {
    id: BlockId,
    ptr: u64,
    size: usize,
    stream: StreamId,
    tag: AllocTag,
    state: BlockState,
}

impl DeviceBlock {
    /// Builds a descriptor. Resources call this; users receive blocks. Safe:
    /// a made-up descriptor reaches no driver call (see
    /// [Forging](DeviceBlock#forging)), resources refuse it.
    pub fn new(id: BlockId, ptr: u64, size: usize, stream: StreamId, tag: AllocTag) -> Self {
        DeviceBlock {
            id,
            ptr,
            size,
            stream,
            tag,
            state: BlockState::Live,
        }
    }

    /// The block's id, for the block-use hooks.
    pub fn id(&self) -> BlockId {
        self.id
    }

    /// Device address (a `CUdeviceptr`); 0 for a zero-byte block.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes, as requested.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The stream the block was allocated on, where it will be freed.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Device ordinal of the block.
    pub fn device(&self) -> u32 {
        self.stream.device()
    }

    /// The caller's tag.
    pub fn tag(&self) -> AllocTag {
        self.tag
    }

    /// The state this descriptor was handed out in (always
    /// [`BlockState::Live`]); ask the resource for the current state.
    pub fn state(&self) -> BlockState {
        self.state
    }
}
