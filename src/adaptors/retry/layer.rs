//! [`RetryOnOomLayer`]: wraps resources in [`RetryOnOom`].

use super::RetryOnOom;
use crate::adaptors::Layer;

/// Wraps every resource it is given in a [`RetryOnOom`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryOnOomLayer;

impl RetryOnOomLayer {
    /// The layer.
    pub fn new() -> Self {
        RetryOnOomLayer
    }
}

impl<R> Layer<R> for RetryOnOomLayer {
    type Resource = RetryOnOom<R>;

    fn layer(&self, inner: R) -> RetryOnOom<R> {
        RetryOnOom::new(inner)
    }
}
