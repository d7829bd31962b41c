//! The arena tier ([`ArenaTier`](tier::ArenaTier)): one reserved address
//! range every stream places its blocks in ([`vmm`]: the shared arena and
//! its lock), its placement of addresses ([`placement`]), page table
//! ([`pages`]), fences ([`fences`]) and free tags ([`freed`]) with the
//! index of the buckets holding each stream's ([`by_tag`]), the blocks
//! each stream keeps ([`kept`]), and the tier's leases and their block-use
//! hooks ([`tier`]), and its sleep and wake ([`sleep`]).

#![deny(unsafe_code)]

pub(super) mod by_tag;
pub(super) mod fences;
pub(super) mod freed;
pub(super) mod kept;
pub(super) mod pages;
pub(super) mod placement;
pub(super) mod sleep;
pub(super) mod tier;
pub(super) mod vmm;
