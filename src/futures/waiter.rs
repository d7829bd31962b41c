//! One completion slot: what an awaiting future and a notification share.
//!
//! A [`Waiter`] is created when a future takes its place on a stream (it
//! carries the point's sequence number), is completed or failed exactly once
//! by whoever learns the outcome (a host-function notification, the fallback
//! query, or a device fault), and is read by the future. It owns no GPU state,
//! so a host function may drop the last reference to it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::Waker;

use ::futures::task::AtomicWaker;

use crate::error::{ResourceError, ResourceResult};

const PENDING: u8 = 0;
const DONE: u8 = 1;
const FAILED: u8 = 2;

/// A completion slot for the point `seq` of one stream.
#[derive(Debug)]
pub(crate) struct Waiter {
    seq: u64,
    state: AtomicU8,
    /// Written once, before `state` becomes `FAILED`.
    error: Mutex<Option<ResourceError>>,
    waker: AtomicWaker,
}

impl Waiter {
    pub(crate) fn new(seq: u64) -> Self {
        Waiter {
            seq,
            state: AtomicU8::new(PENDING),
            error: Mutex::new(None),
            waker: AtomicWaker::new(),
        }
    }

    /// The point's sequence number on its stream.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// Marks the point reached; returns the waker to wake (after unlocking).
    pub(crate) fn complete(&self) -> Option<Waker> {
        self.state
            .compare_exchange(PENDING, DONE, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        self.waker.take()
    }

    /// Marks the point failed with `error`; returns the waker to wake.
    pub(crate) fn fail(&self, error: ResourceError) -> Option<Waker> {
        {
            let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
            if self.state.load(Ordering::Acquire) != PENDING {
                return None;
            }
            *slot = Some(error);
        }
        self.state
            .compare_exchange(PENDING, FAILED, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        self.waker.take()
    }

    /// The outcome, once known.
    pub(crate) fn result(&self) -> Option<ResourceResult<()>> {
        match self.state.load(Ordering::Acquire) {
            PENDING => None,
            DONE => Some(Ok(())),
            _ => Some(Err(self
                .error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or(ResourceError::Shutdown))),
        }
    }

    /// Registers the task to wake when the outcome is known.
    pub(crate) fn register(&self, waker: &Waker) {
        self.waker.register(waker);
    }
}
