//! [`DeviceElement`]: what a buffer may hold.

/// Plain data a [`Buffer`](super::Buffer) may hold.
///
/// With the `cuda` feature it is cudarc's
/// [`DeviceRepr`](cudarc::driver::DeviceRepr) (what cudarc copies to and
/// from the device and passes to kernels; implement that for your own
/// `#[repr(C)]` types). Without it (the simulated device only) any `Copy`
/// type: the crate never reads an element on the host, so nothing more is
/// needed. Code that must build both ways should hold `DeviceRepr` types.
#[cfg(feature = "cuda")]
pub trait DeviceElement: cudarc::driver::DeviceRepr {}

#[cfg(feature = "cuda")]
impl<T: cudarc::driver::DeviceRepr> DeviceElement for T {}

/// Plain data a [`Buffer`](super::Buffer) may hold: without the `cuda`
/// feature, any `Copy` type (the crate never reads an element on the host).
#[cfg(not(feature = "cuda"))]
pub trait DeviceElement: Copy + 'static {}

#[cfg(not(feature = "cuda"))]
impl<T: Copy + 'static> DeviceElement for T {}
