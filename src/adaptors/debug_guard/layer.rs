//! [`GuardConfig`] and [`DebugGuardLayer`].

use std::fmt;
use std::sync::Arc;

use super::{DebugGuardResource, PoisonFill};
use crate::adaptors::Layer;
use crate::resource::DeviceMemoryResource;

/// How much a [`DebugGuardResource`] holds, and what it fills blocks with.
#[derive(Clone)]
pub struct GuardConfig {
    pub(super) max_blocks: usize,
    pub(super) max_bytes: usize,
    pub(super) poison: Option<Arc<dyn PoisonFill>>,
}

impl GuardConfig {
    /// At most 64 blocks and 256 MiB in quarantine, no poison.
    pub fn new() -> Self {
        GuardConfig {
            max_blocks: 64,
            max_bytes: 256 << 20,
            poison: None,
        }
    }

    /// Caps the quarantine at `n` blocks (0 frees at once, keeping only the
    /// double-free and foreign-block checks).
    pub fn max_blocks(mut self, n: usize) -> Self {
        self.max_blocks = n;
        self
    }

    /// Caps the quarantine at `bytes`; a larger block is freed at once.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// Fills every quarantined block with `poison`.
    pub fn poison(mut self, poison: impl PoisonFill) -> Self {
        self.poison = Some(Arc::new(poison));
        self
    }

    /// The block cap.
    pub fn block_cap(&self) -> usize {
        self.max_blocks
    }

    /// The byte cap.
    pub fn byte_cap(&self) -> usize {
        self.max_bytes
    }
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for GuardConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardConfig")
            .field("max_blocks", &self.max_blocks)
            .field("max_bytes", &self.max_bytes)
            .field("poison", &self.poison.is_some())
            .finish()
    }
}

/// Wraps every resource it is given in a [`DebugGuardResource`] configured by a
/// [`GuardConfig`].
#[derive(Debug, Clone, Default)]
pub struct DebugGuardLayer {
    config: GuardConfig,
}

impl DebugGuardLayer {
    /// A layer with `config`.
    pub fn new(config: GuardConfig) -> Self {
        DebugGuardLayer { config }
    }

    /// The configuration.
    pub fn config(&self) -> &GuardConfig {
        &self.config
    }
}

impl<R: DeviceMemoryResource> Layer<R> for DebugGuardLayer {
    type Resource = DebugGuardResource<R>;

    fn layer(&self, inner: R) -> DebugGuardResource<R> {
        DebugGuardResource::new(inner, self.config.clone())
    }
}
