//! [`CachePadded`]: keeps a lock alone on its cache lines.
//!
//! Locks of neighbouring shards in one array share a 64-byte line (and
//! adjacent-line prefetch pairs lines), so two threads locking two different
//! shards would still bounce one line between their cores. 128-byte
//! alignment keeps each shard to itself.

/// `T`, aligned (and so padded) to 128 bytes.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for CachePadded<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}
