//! [`HostPoolConfig`]: a host pool's cap and placement.

/// How a [`HostPool`](super::HostPool) pins and how much it may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostPoolConfig {
    /// The most pinned bytes the pool holds at once: in use, idle and
    /// waiting for copies (each block counted by its size class). Default:
    /// no cap (`usize::MAX`).
    pub cap: usize,
    /// The host NUMA node the memory should live on, best-effort: the
    /// simulated host has one node and ignores it; on CUDA the pool pins
    /// with `cuMemHostAlloc`, whose pages the kernel places where they are
    /// first touched, and the pool zeroes a new block on the allocating
    /// thread, so run the allocating thread on the node (`numactl
    /// --cpunodebind=N`, or a thread pinned to its cores) to place them
    /// there. Kept in the pool's statistics. Default: none.
    pub numa_node: Option<u32>,
}

impl Default for HostPoolConfig {
    fn default() -> Self {
        HostPoolConfig {
            cap: usize::MAX,
            numa_node: None,
        }
    }
}

impl HostPoolConfig {
    /// The defaults: no cap, no NUMA node.
    pub fn new() -> Self {
        Self::default()
    }

    /// Caps the pinned bytes the pool holds.
    pub fn cap(mut self, bytes: usize) -> Self {
        self.cap = bytes;
        self
    }

    /// Asks for memory on host NUMA node `node` (best-effort, see
    /// [`numa_node`](Self::numa_node)).
    pub fn numa_node(mut self, node: u32) -> Self {
        self.numa_node = Some(node);
        self
    }
}
