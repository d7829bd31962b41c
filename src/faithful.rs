//! [`FaithfulLayer`]: layers whose resource allocates only through the one
//! it wraps, so that a stack built from them on a device is on that device.

use crate::adaptors::{
    BudgetLayer, CachingLayer, DebugGuardLayer, Identity, Layer, RetryOnOomLayer, Stack,
    StatsLayer, TracingLayer,
};
use crate::builder::ResourceBuilder;

/// A [`Layer`] whose resource hands out only blocks of the resource it was
/// given, and resolves streams only through it.
///
/// It lets [`AsyncResource::build`](crate::AsyncResource::build)
/// stack layers over a resource it made on a device itself, safely: the
/// futures layer queues work on that device's backend with the stack's
/// blocks and streams, which no backend can check.
///
/// # Safety
/// An implementation promises that `layer(inner)` returns a resource that
/// (1) hands out only memory of `inner`'s device obtained through `inner`
/// (a block `inner` handed out, a part of one, or memory the caching tier
/// maps through `inner`'s [`device_access`](crate::DeviceMemoryResource::device_access)),
/// and (2) resolves streams only through `inner`. Every layer of this crate
/// keeps both.
pub unsafe trait FaithfulLayer<R>: Layer<R> {}

// Each decorator layer below returns its decorator around `inner`, and
// every decorator of this crate allocates and resolves streams through
// the resource it wraps.

// SAFETY: `Identity` returns `inner` itself.
unsafe impl<R> FaithfulLayer<R> for Identity {}
// SAFETY: a budget counts `inner`'s blocks and forwards every call to it.
unsafe impl<R: crate::DeviceMemoryResource + 'static> FaithfulLayer<R> for BudgetLayer {}
// SAFETY: counts around `inner`'s calls, which it forwards.
unsafe impl<R> FaithfulLayer<R> for StatsLayer {}
// SAFETY: events around `inner`'s calls, which it forwards.
unsafe impl<R> FaithfulLayer<R> for TracingLayer {}
// SAFETY: retries of `inner`'s calls.
unsafe impl<R> FaithfulLayer<R> for RetryOnOomLayer {}
// SAFETY: a quarantine of `inner`'s own blocks, freed through it.
unsafe impl<R: crate::DeviceMemoryResource> FaithfulLayer<R> for DebugGuardLayer {}
// SAFETY: a cache of `inner`'s blocks, or of memory it maps through
// `inner`'s `device_access`, on `inner`'s streams.
unsafe impl<R: crate::DeviceMemoryResource> FaithfulLayer<R> for CachingLayer {}
// SAFETY: two faithful layers composed: each keeps both promises.
unsafe impl<R, Inner, Outer> FaithfulLayer<R> for Stack<Inner, Outer>
where
    Inner: FaithfulLayer<R>,
    Outer: FaithfulLayer<Inner::Resource>,
{
}
// SAFETY: the builder applies its faithful layer.
unsafe impl<R, L: FaithfulLayer<R>> FaithfulLayer<R> for ResourceBuilder<L> {}
// SAFETY: a reference applies the layer it names.
unsafe impl<R, L: FaithfulLayer<R> + ?Sized> FaithfulLayer<R> for &L {}
