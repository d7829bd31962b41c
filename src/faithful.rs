//! [`FaithfulLayer`]: layers whose resource allocates only through the one
//! it wraps, so that a stack built from them on a device is on that device.

use crate::adaptors::{
    BudgetLayer, CacheLayer, DebugGuardLayer, Identity, Layer, RetryOnOomLayer, Stack, StatsLayer,
    TracingLayer,
};
use crate::builder::ResourceBuilder;

/// A [`Layer`] whose resource hands out only blocks of the resource it was
/// given, and resolves streams only through it.
///
/// It lets [`AsyncResource::build`](crate::futures::AsyncResource::build)
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

// SAFETY (each below): the layer returns its decorator around `inner`, and
// every decorator of this crate allocates and resolves streams through
// the resource it wraps (a budget, a quarantine, counts, events, retries
// and a cache of `inner`'s own blocks); `Identity` returns `inner` itself;
// a stack and a builder compose faithful layers, a reference forwards.
unsafe impl<R> FaithfulLayer<R> for Identity {}
unsafe impl<R: crate::DeviceMemoryResource + 'static> FaithfulLayer<R> for BudgetLayer {}
unsafe impl<R> FaithfulLayer<R> for StatsLayer {}
unsafe impl<R> FaithfulLayer<R> for TracingLayer {}
unsafe impl<R> FaithfulLayer<R> for RetryOnOomLayer {}
unsafe impl<R: crate::DeviceMemoryResource> FaithfulLayer<R> for DebugGuardLayer {}
unsafe impl<R: crate::DeviceMemoryResource> FaithfulLayer<R> for CacheLayer {}
unsafe impl<R, Inner, Outer> FaithfulLayer<R> for Stack<Inner, Outer>
where
    Inner: FaithfulLayer<R>,
    Outer: FaithfulLayer<Inner::Resource>,
{
}
unsafe impl<R, L: FaithfulLayer<R>> FaithfulLayer<R> for ResourceBuilder<L> {}
unsafe impl<R, L: FaithfulLayer<R> + ?Sized> FaithfulLayer<R> for &L {}
