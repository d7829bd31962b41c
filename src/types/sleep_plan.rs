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

#![forbid(unsafe_code)]

use super::block::AllocTag;

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SleepPlan {
    tags: Vec<(AllocTag, SleepMode)>,
    /// The mode of every tag not named, when the plan takes them all.
    rest: Option<SleepMode>,
}

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

    /// Whether the plan takes no tag at all.
    pub fn is_empty(&self) -> bool {
        self.tags.is_empty() && self.rest.is_none()
    }
}
