//! Composition as types: the [`Layer`] trait, [`Identity`] and [`Stack`].
//!
//! A layer is a recipe for one decorator: given an inner resource it returns
//! the decorated one. Layers are plain values (they hold configuration and
//! shared handles such as a [`Budget`](super::Budget)), so one layer can wrap
//! many resources, for instance one per device.
//!
//! [`Stack`] nests two layers and [`Identity`] is the empty one; the
//! [`ResourceBuilder`](crate::ResourceBuilder) is a thin wrapper
//! that grows a `Stack` one layer at a time, as tower's `ServiceBuilder` does.

#![forbid(unsafe_code)]

/// Wraps a resource of type `R` in a decorator.
///
/// # Examples
/// ```
/// use streamalloc::{Layer, StatsLayer};
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, DeviceMemoryResource, SimResource};
///
/// let gpu = SimGpu::new();
/// let device = Device::simulated(&gpu, 1);
/// let stats = StatsLayer::new();
/// let resource = stats.layer(SimResource::new(&device));
/// let block = resource.allocate(64, device.stream(0)?, AllocTag("x"))?;
/// assert_eq!(stats.stats().snapshot().overall.current_bytes, 64);
/// # resource.deallocate(block)?;
/// # Ok::<(), streamalloc::ResourceError>(())
/// ```
pub trait Layer<R> {
    /// The decorated resource.
    type Resource;

    /// Wraps `inner`.
    fn layer(&self, inner: R) -> Self::Resource;
}

impl<R, L: Layer<R> + ?Sized> Layer<R> for &L {
    type Resource = L::Resource;

    fn layer(&self, inner: R) -> Self::Resource {
        (**self).layer(inner)
    }
}

/// The layer that adds nothing: `Identity.layer(r)` is `r`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Identity;

impl Identity {
    /// The empty layer.
    pub fn new() -> Self {
        Identity
    }
}

impl<R> Layer<R> for Identity {
    type Resource = R;

    fn layer(&self, inner: R) -> R {
        inner
    }
}

/// Two layers, one inside the other: `Stack::new(inner, outer).layer(r)` is
/// `outer.layer(inner.layer(r))`.
///
/// # Order
/// `inner` wraps the resource first and so sees every call last; `outer`
/// sees every call first. See the
/// [builder's `# Order` section](crate::ResourceBuilder#order) for
/// why the order changes behaviour.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stack<Inner, Outer> {
    inner: Inner,
    outer: Outer,
}

impl<Inner, Outer> Stack<Inner, Outer> {
    /// `outer` around `inner`.
    pub fn new(inner: Inner, outer: Outer) -> Self {
        Stack { inner, outer }
    }

    /// The layer applied first (closest to the resource).
    pub fn inner(&self) -> &Inner {
        &self.inner
    }

    /// The layer applied last (what callers meet first).
    pub fn outer(&self) -> &Outer {
        &self.outer
    }
}

impl<R, Inner, Outer> Layer<R> for Stack<Inner, Outer>
where
    Inner: Layer<R>,
    Outer: Layer<Inner::Resource>,
{
    type Resource = Outer::Resource;

    fn layer(&self, resource: R) -> Self::Resource {
        self.outer.layer(self.inner.layer(resource))
    }
}
