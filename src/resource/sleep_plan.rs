//! [`SleepPlan`] and [`SleepMode`]: which tags a cache puts to sleep, and
//! what becomes of each one's contents.
//!
//! A plan names tags one by one ([`SleepPlan::tag`]) or all of them
//! ([`SleepPlan::all`]), each with the mode its blocks' contents get: kept
//! in pinned host memory and copied back at the wake
//! ([`SleepMode::Offload`], vLLM's weights at sleep level 1), zeroed at the
//! wake ([`SleepMode::Zero`]), or left undefined ([`SleepMode::Discard`],
//! a KV cache). See [`CachingResource::sleep`](crate::CachingResource::sleep)
//! and [`AsyncResource::sleep`](crate::AsyncResource::sleep).
//!
//! The offloads' pinned host memory comes from the plan's
//! [`OffloadHost`] when it names one ([`SleepPlan::offload_to`], a
//! [`HostPool`](crate::HostPool)), and is pinned per block otherwise.

#![forbid(unsafe_code)]

use std::sync::Arc;

use super::offload_host::OffloadHost;
use crate::types::AllocTag;

/// What becomes of a sleeping block's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SleepMode {
    /// Copied to pinned host memory before the pages go, and back at the
    /// wake: the block reads as before.
    Offload,
    /// Zero at the wake.
    Zero,
    /// Undefined at the wake (what the new pages hold).
    Discard,
}

/// The tags a sleep takes, each with its [`SleepMode`].
///
/// ```
/// use streamalloc::AllocTag;
/// use streamalloc::{SleepMode, SleepPlan};
///
/// let plan = SleepPlan::new()
///     .tag(AllocTag("weights"), SleepMode::Offload)
///     .tag(AllocTag("kv"), SleepMode::Discard);
/// assert_eq!(plan.mode_of(AllocTag("kv")), Some(SleepMode::Discard));
/// assert_eq!(plan.mode_of(AllocTag("request")), None);
/// assert_eq!(SleepPlan::all(SleepMode::Zero).mode_of(AllocTag("any")), Some(SleepMode::Zero));
/// ```
#[derive(Debug, Clone, Default)]
pub struct SleepPlan {
    tags: Vec<(AllocTag, SleepMode)>,
    /// The mode of every tag not named, when the plan takes them all.
    rest: Option<SleepMode>,
    /// Where the offloads' host memory comes from (pinned per block when
    /// `None`).
    host: Option<Arc<dyn OffloadHost>>,
}

/// Two plans are equal when they take the same tags in the same modes and
/// offload to the same lender (the same object) or both to none.
impl PartialEq for SleepPlan {
    fn eq(&self, other: &Self) -> bool {
        let same_host = match (&self.host, &other.host) {
            (None, None) => true,
            (Some(a), Some(b)) => std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b)),
            _ => false,
        };
        self.tags == other.tags && self.rest == other.rest && same_host
    }
}

impl Eq for SleepPlan {}

impl SleepPlan {
    /// A plan that takes no tag yet.
    pub fn new() -> Self {
        SleepPlan::default()
    }

    /// A plan that takes every tag, in `mode` (tags named after it with
    /// [`tag`](Self::tag) get their own).
    pub fn all(mode: SleepMode) -> Self {
        SleepPlan {
            tags: Vec::new(),
            rest: Some(mode),
            host: None,
        }
    }

    /// Takes `tag` too, in `mode` (a tag named twice keeps the last mode).
    #[must_use]
    pub fn tag(mut self, tag: AllocTag, mode: SleepMode) -> Self {
        self.tags.retain(|(t, _)| *t != tag);
        self.tags.push((tag, mode));
        self
    }

    /// The mode of `tag`'s blocks, or `None` when the plan leaves them
    /// awake.
    pub fn mode_of(&self, tag: AllocTag) -> Option<SleepMode> {
        self.tags
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|&(_, m)| m)
            .or(self.rest)
    }

    /// Takes the offloads' pinned host memory from `host` (a
    /// [`HostPool`](crate::host::HostPool) of the cache's backend) and
    /// gives it back there after the wake, instead of pinning per block
    /// at each sleep: repeated sleeps and wakes reuse the same memory, and
    /// the pool's cap and statistics per tag count it.
    #[must_use]
    pub fn offload_to(mut self, host: impl OffloadHost + 'static) -> Self {
        self.host = Some(Arc::new(host));
        self
    }

    /// The lender of the offloads' host memory, when the plan names one.
    pub fn offload_host(&self) -> Option<&Arc<dyn OffloadHost>> {
        self.host.as_ref()
    }

    /// Whether the plan takes no tag at all.
    pub fn is_empty(&self) -> bool {
        self.tags.is_empty() && self.rest.is_none()
    }
}
