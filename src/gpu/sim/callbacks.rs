//! The driver's callback thread: host functions that take time to come.
//!
//! By default the device thread runs a host function itself as soon as its
//! stream reaches it. A GPU does not: the stream signals the driver, whose
//! own thread runs the host functions of every stream, one after another,
//! some microseconds later, and the stream waits for it meanwhile. What
//! waits on a notification (a free's bytes back in the accounting, a
//! parked future's wake-up) waits that long too, and a service's memory
//! comes back later than the simulator said. With a latency
//! ([`SimGpuBuilder::host_fn_latency`](super::SimGpuBuilder::host_fn_latency)),
//! the device thread hands each host function to a thread of its own,
//! which runs them in the order their streams reached them, each no
//! earlier than the latency after; the stream stays busy until its host
//! function returns, and the other streams go on.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::gpu::HostFn;

/// Host functions the device thread handed over: `(due, stream, f)`.
#[derive(Default)]
pub(super) struct Callbacks {
    queue: Mutex<VecDeque<(Instant, usize, HostFn)>>,
    /// Signalled when one is queued, or at shutdown.
    ready: Condvar,
}

impl Callbacks {
    fn lock(&self) -> MutexGuard<'_, VecDeque<(Instant, usize, HostFn)>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stream `s` reached `f`: it runs `latency` from now at the earliest.
    pub(super) fn hand_over(&self, s: usize, f: HostFn, latency: Duration) {
        self.lock().push_back((Instant::now() + latency, s, f));
        self.ready.notify_one();
    }

    /// Wakes the callback thread to see the shutdown.
    pub(super) fn wake(&self) {
        let _queue = self.lock();
        self.ready.notify_all();
    }

    /// The next host function once it is due, or `None` when `stop` says
    /// so (what is still queued is dropped with the device).
    pub(super) fn next(&self, stop: impl Fn() -> bool) -> Option<(usize, HostFn)> {
        let mut queue = self.lock();
        loop {
            if stop() {
                return None;
            }
            match queue.front() {
                None => {
                    queue = self.ready.wait(queue).unwrap_or_else(|p| p.into_inner());
                }
                Some(&(due, _, _)) => {
                    let now = Instant::now();
                    if due <= now {
                        let (_, s, f) = queue.pop_front().expect("a front");
                        return Some((s, f));
                    }
                    queue = self
                        .ready
                        .wait_timeout(queue, due - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }
}
