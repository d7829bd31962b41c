//! [`RetryOnOomLayer`]: wraps resources in [`RetryOnOomResource`].

use super::RetryOnOomResource;
use crate::adaptors::Layer;

/// Wraps every resource it is given in a [`RetryOnOomResource`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryOnOomLayer;

impl RetryOnOomLayer {
    /// The layer.
    pub fn new() -> Self {
        RetryOnOomLayer
    }
}

impl<R> Layer<R> for RetryOnOomLayer {
    type Resource = RetryOnOomResource<R>;

    fn layer(&self, inner: R) -> RetryOnOomResource<R> {
        RetryOnOomResource::new(inner)
    }
}
