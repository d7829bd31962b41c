//! Marks the code that runs inside a poll of the crate's futures, so that
//! what it calls can choose not to block.
//!
//! A future's `poll` runs on an executor thread: a synchronize or a sleep
//! there parks the runtime (a current-thread runtime stops altogether). The
//! futures layer calls code it does not own inside its polls (the wrapped
//! resource's `allocate`, a decorator's `reap_through`), and some of that
//! code blocks when called from plain threads by design:
//! [`reap_pending`](crate::DeviceMemoryResource::reap_pending) synchronizes
//! the streams with queued frees, and `RetryOnOomResource` and the cache call it on
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
//! A poll that tries an allocation which will *wait* when refused (the
//! head of the futures layer's queue) also marks the try
//! ([`WaitingTry`]): a refusal for lack of memory is then the start or the
//! continuation of a wait, not a failure, and the statistics and tracing
//! layers below count and log it as such ([`in_waiting_try`]).
//!
//! The scope is a per-thread depth counter (tokio detects a `block_on`
//! inside a runtime the same way): nested scopes are fine, and a scope never
//! leaks to another thread.

use std::cell::Cell;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static WAITING_TRY: Cell<bool> = const { Cell::new(false) };
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

/// The current thread is trying an allocation that waits when refused for
/// lack of memory, until this is dropped. See the
/// [module documentation](self).
#[derive(Debug)]
pub(crate) struct WaitingTry {
    /// What was marked before (a try inside a try stays marked).
    outer: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl WaitingTry {
    /// Marks the current thread's try.
    pub(crate) fn enter() -> WaitingTry {
        WaitingTry {
            outer: WAITING_TRY.with(|w| w.replace(true)),
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for WaitingTry {
    fn drop(&mut self) {
        WAITING_TRY.with(|w| w.set(self.outer));
    }
}

/// Whether the allocation being tried on this thread waits when refused
/// for lack of memory: a refusal then is not a failure. Read only on the
/// refusal's path.
pub(crate) fn in_waiting_try() -> bool {
    WAITING_TRY.with(|w| w.get())
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

    #[test]
    fn a_waiting_try_is_marked_until_it_ends_and_nests() {
        assert!(!in_waiting_try());
        let outer = WaitingTry::enter();
        {
            let _inner = WaitingTry::enter();
            assert!(in_waiting_try());
        }
        assert!(in_waiting_try(), "the inner try's end unmarked the outer");
        assert!(!std::thread::spawn(in_waiting_try).join().unwrap());
        drop(outer);
        assert!(!in_waiting_try());
    }
}
