//! The size-class tier: freed blocks of the inner resource kept per stream
//! in free lists by [`SizeClass`] ([`class`]), under one cap ([`tier`]).

#![deny(unsafe_code)]

mod class;
pub(super) mod tier;

pub use class::{MIN_CLASS_SIZE, SizeClass};
