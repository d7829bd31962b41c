//! Marks the code that runs inside a poll of the crate's futures, so that
//! what it calls can choose not to block.
//!
//! A future's `poll` runs on an executor thread: a synchronize or a sleep
//! there parks the runtime (a current-thread runtime stops altogether). The
//! futures layer calls code it does not own inside its polls (the wrapped
//! resource's `allocate`, a decorator's `reap_through`), and some of that
//! code blocks when called from plain threads by design:
//! [`reap_pending`](crate::DeviceMemoryResource::reap_pending) synchronizes
//! the streams with queued frees, and `RetryOnOom` and the cache call it on
//! their out-of-memory paths.
//!
//! So every poll (and the dispatcher, which may run inside the reaper's
//! task) [enters](PollScope::enter) a scope, and the stream-ordered
//! resource's `reap_pending`, inside one, drains only what is already known
//! done instead of synchronizing: the waiting allocation is served when the
//! completion notifications report the frees. The simulated device counts
//! the synchronizes called inside a scope
//! ([`SimGpu::blocking_calls_in_polls`](crate::gpu::sim::SimGpu::blocking_calls_in_polls)),
//! so that tests catch a blocking call that comes back.
//!
//! The scope is a per-thread depth counter (tokio detects a `block_on`
//! inside a runtime the same way): nested scopes are fine, and a scope never
//! leaks to another thread.

use std::cell::Cell;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// The current thread is inside a poll of the crate's futures until this is
/// dropped. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct PollScope {
    /// Not `Send`: the scope belongs to the thread that entered it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl PollScope {
    /// Enters a scope on the current thread.
    pub(crate) fn enter() -> PollScope {
        DEPTH.with(|d| d.set(d.get() + 1));
        PollScope {
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for PollScope {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Whether the current thread is inside a poll of the crate's futures: then
/// nothing may block.
pub(crate) fn in_poll() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_stay_on_their_thread() {
        assert!(!in_poll());
        let outer = PollScope::enter();
        {
            let _inner = PollScope::enter();
            assert!(in_poll());
        }
        assert!(in_poll());
        assert!(!std::thread::spawn(in_poll).join().unwrap());
        drop(outer);
        assert!(!in_poll());
    }
}
