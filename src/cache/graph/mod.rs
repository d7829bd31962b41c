//! The cache under CUDA graph capture: the memory a capture's graph holds
//! ([`pool`]) and its release once the graph is gone ([`release`]).

#![deny(unsafe_code)]

pub(super) mod pool;
pub(super) mod release;
