//! [`TracingLayer`]: wraps resources in [`TracingResource`].

use super::TracingResource;
use crate::adaptors::Layer;

/// Wraps every resource it is given in a [`TracingResource`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLayer;

impl TracingLayer {
    /// The layer.
    pub fn new() -> Self {
        TracingLayer
    }
}

impl<R> Layer<R> for TracingLayer {
    type Resource = TracingResource<R>;

    fn layer(&self, inner: R) -> TracingResource<R> {
        TracingResource::new(inner)
    }
}
