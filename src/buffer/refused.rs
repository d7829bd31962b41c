//! [`RefusedConversion`]: a conversion of a buffer that could not be made, with the
//! buffer handed back unchanged.

use crate::error::ResourceError;

/// Why a conversion of a buffer (`into_block`, `CudaBuffer::new`) was
/// refused, and the buffer, unchanged and still owning its block.
///
/// Converts into its [`ResourceError`] for `?` (the buffer is then dropped,
/// and frees its block as usual).
#[derive(Debug)]
pub struct RefusedConversion<B> {
    /// What went wrong.
    pub error: ResourceError,
    /// The buffer, as it was.
    pub buffer: Box<B>,
}

impl<B> RefusedConversion<B> {
    pub(crate) fn new(error: ResourceError, buffer: B) -> Self {
        RefusedConversion {
            error,
            buffer: Box::new(buffer),
        }
    }
}

impl<B> From<RefusedConversion<B>> for ResourceError {
    fn from(r: RefusedConversion<B>) -> Self {
        r.error
    }
}

impl<B: std::fmt::Debug> std::fmt::Display for RefusedConversion<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused: {}", self.error)
    }
}

impl<B: std::fmt::Debug> std::error::Error for RefusedConversion<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
