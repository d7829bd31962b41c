//! [`CachingLayer`]: the caching tier as a builder layer.

use super::layer::Layer;
use crate::cache::{CacheConfig, CachingResource};
use crate::resource::DeviceMemoryResource;

/// Wraps a resource in a [`CachingResource`] with its
/// [`CacheConfig`]; made by
/// [`ResourceBuilder::cache`](crate::ResourceBuilder::cache).
#[derive(Debug, Clone, Copy, Default)]
pub struct CachingLayer {
    config: CacheConfig,
}

impl CachingLayer {
    /// A cache with `config`.
    pub fn new(config: CacheConfig) -> Self {
        CachingLayer { config }
    }
}

impl<R: DeviceMemoryResource> Layer<R> for CachingLayer {
    type Resource = CachingResource<R>;

    fn layer(&self, inner: R) -> CachingResource<R> {
        CachingResource::with_config(inner, self.config)
    }
}
