//! Relief: a refused request asks every resource under its budget to give
//! idle memory back.
//!
//! # State
//!
//! - The budget's shared handle keeps a list of *holders* (its
//!   [`BudgetRelief`](crate::BudgetRelief), a type of the
//!   resource layer, which reports it): one per live
//!   [`BudgetResource`](super::BudgetResource), a weak reference to the
//!   part of it that reaches the stack below it (a cache's idle blocks and
//!   arena pages, a debug guard's quarantine), and one per stack built by
//!   [`AsyncResource::build`](crate::AsyncResource::build) whose
//!   layers charge the budget, the whole stack (so that a cache *above*
//!   the budget is reached too), each with an id to unregister. A stack
//!   reports the budgets it charges through
//!   [`budget_reliefs`](crate::DeviceMemoryResource::budget_reliefs), so a
//!   stack built by hand and wrapped by
//!   [`AsyncResource::from_arc`](crate::AsyncResource::from_arc)
//!   registers too.
//! - A thread-local flag marks a thread inside a relief.
//!
//! # Who changes it
//!
//! A `BudgetResource` registers when it is made and unregisters when it is
//! dropped. [`Budget::release_idle`] (called by a `BudgetResource` whose
//! reservation was refused, before it tries once more) copies the live
//! holders out under the list's lock, releases the lock, and asks each to
//! [`give_back_idle`](IdleHolder::give_back_idle): the resource below
//! gives back what no caller holds
//! ([`release_idle`](crate::DeviceMemoryResource::release_idle)), and the
//! holder settles, releasing what left the device. A release wakes every
//! allocation waiting under the budget ([`Budget::release`]), on every
//! device.
//!
//! So one budget shared by two devices, each with a cache below its
//! budget resource or above it, serves a request refused on one device
//! from idle memory cached on the other, and a waiting allocation is woken
//! once it could be served. A whole stack is not asked for a request
//! refused on its own stream pool: that request may be running inside it
//! (its cache trims itself when refused).
//!
//! # Failure
//!
//! A holder's error is logged and the others are still asked; what was
//! given back stays given back.
//!
//! # Bounded
//!
//! One pass over the holders per refused reservation; no lock is held
//! across a holder's call (which makes driver calls), and a relief inside
//! a relief (a holder whose stack holds another budget resource of the same
//! budget, refused while giving back) does nothing. Off a poll, a holder
//! that gave memory back reaps (its frees are queued: a cache's trimmed
//! blocks, a guard's quarantine), as a cache does when its own request is
//! refused, and that reap drains every free pending below it. Inside a poll
//! of the crate's futures nothing blocks: a cache's `release_idle` gives
//! back only the pages the GPU is known done with, and nothing is reaped
//! (a queued free is released when its notification reaps it).

use std::sync::Weak;

use super::Budget;
use crate::resource::relief::{HolderRegistration, IdleHolder};

impl Budget {
    /// Registers `holder` to be asked for idle memory when a request under
    /// this budget is refused, until the registration is dropped.
    pub(crate) fn register_holder(&self, holder: Weak<dyn IdleHolder>) -> HolderRegistration {
        self.relief().register(holder)
    }
    /// Asks every resource charging this budget (each
    /// [`BudgetResource`](super::BudgetResource) of it, on any device) to
    /// give the memory it holds for no caller back to the device: a cache's
    /// idle blocks and arena pages, a debug guard's quarantine. Returns the
    /// bytes the budget got back at once (a free queued on a stream is
    /// released when it is reaped).
    ///
    /// A [`BudgetResource`](super::BudgetResource) whose reservation is
    /// refused calls this before it tries once more, so that idle memory
    /// anywhere under the budget serves the request, and a release wakes the
    /// allocations waiting under the budget on every device.
    ///
    /// # Examples
    /// ```
    /// use streamalloc::{Budget, BudgetResource};
    /// use streamalloc::CachingResource;
    /// use streamalloc::{AllocTag, Device, DeviceMemoryResource, gpu::sim::SimGpu, SimResource};
    ///
    /// let gpu = SimGpu::new();
    /// let device = Device::simulated(&gpu, 1);
    /// let budget = Budget::new(64 << 20);
    /// let r = BudgetResource::new(CachingResource::new(SimResource::new(&device)), &budget);
    /// let block = r.allocate(4096, device.stream(0)?, AllocTag::UNTAGGED)?;
    /// r.deallocate(block)?;
    /// assert!(budget.in_use() > 0, "cached: its page stays mapped");
    /// gpu.run_until_idle();
    /// budget.release_idle();
    /// assert_eq!(budget.in_use(), 0);
    /// # Ok::<(), streamalloc::ResourceError>(())
    /// ```
    ///
    /// # Stream ordering
    /// Nothing is given back that the GPU may still use: a cache frees its
    /// idle blocks stream-ordered and unmaps only pages whose last use is
    /// known done. Inside a poll of the crate's futures it never waits.
    pub fn release_idle(&self) -> usize {
        self.release_idle_for(None)
    }

    /// [`release_idle`](Self::release_idle) for a request refused on a
    /// stream of the pool `refused_on`: whole stacks on that pool are not
    /// asked (the request may be inside one of them).
    pub(crate) fn release_idle_for(&self, refused_on: Option<u64>) -> usize {
        self.relief().relieve(refused_on)
    }
}
