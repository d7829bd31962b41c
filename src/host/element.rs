//! [`HostElement`]: what a host buffer may hold.

// `unsafe impl`s only, each argued where it is.
#![allow(unsafe_code)]

use crate::buffer::DeviceElement;

/// Plain data a [`HostBuffer`](super::HostBuffer) may hold: an
/// [`DeviceElement`] of which every bit pattern, zero included, is a value.
///
/// The host reads what the device wrote into a host buffer, and a fresh
/// block holds zeros or what its previous owner left: a type with invalid
/// bit patterns (`bool`, `char`, references, enums) would make those reads
/// undefined behaviour. Implemented for the integer and floating-point
/// types and arrays of them.
///
/// # Safety
/// Whoever implements it for a type promises:
/// 1. every bit pattern of `size_of::<T>()` bytes is a valid `T` (no
///    padding bytes, no invalid values, no pointers whose validity
///    matters);
/// 2. `T` has no `Drop` and may be copied bytewise (it is
///    [`Copy`]);
/// 3. `align_of::<T>()` is at most 256 (the alignment a pinned block is
///    guaranteed).
pub unsafe trait HostElement: DeviceElement + Copy {}

macro_rules! host_elements {
    ($($t:ty),*) => {
        $(
            // SAFETY: a primitive integer or float: every bit pattern is
            // a value, no padding, `Copy`.
            unsafe impl HostElement for $t {}
        )*
    };
}

host_elements!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, f32, f64);

// SAFETY: an array of host elements has no padding between them and every
// bit pattern of each element is a value.
unsafe impl<T: HostElement, const N: usize> HostElement for [T; N] where [T; N]: DeviceElement {}
