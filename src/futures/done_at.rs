//! [`DoneAt`]: where an owned buffer's block is known done with.

/// Where the GPU is known done with a buffer's block: the completion point
/// of its last launch on the block's stream, and the count of uses begun
/// through its resource's hooks at that launch (a use begun there since is
/// work the point does not cover).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DoneAt {
    /// The point of the block's stream.
    pub(crate) point: u64,
    /// The resource's count of hook uses when the launch was made.
    pub(crate) hook_uses: u64,
}
