//! Kernels that take time, side by side on several streams.
//!
//! By default the device thread runs one operation at a time and sleeps a
//! kernel's latency after running it: every stream waits while one kernel
//! "runs", as on a device with a single engine. That hides what a real GPU
//! shows when streams run small kernels at once (its SMs share them out):
//! work made to wait on another stream's fence loses the overlap it would
//! have had, and a service whose requests queue behind such waits serves
//! fewer at a time. With [`KernelSlots`] (`SimGpuBuilder::concurrent_kernels`
//! above 1), a kernel instead occupies its stream for the latency while the
//! device thread goes on with the other streams, up to `slots` kernels at
//! once; the stream's next operation (a record, a host function, a free)
//! runs only once the kernel's time is up, so a host that sees the stream
//! past the kernel has waited the kernel's time.
//!
//! Only time changes: a kernel's effects on the happens-before order and
//! the race detector are taken when it is queued, as always.

use std::time::{Duration, Instant};

/// How many kernels run at once and how long each takes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KernelSlots {
    latency: Duration,
    slots: usize,
    running: usize,
}

impl KernelSlots {
    /// `slots` kernels at once (at least 2: one at a time is the default
    /// engine), each `latency` long.
    pub(crate) fn new(latency: Duration, slots: usize) -> Self {
        KernelSlots {
            latency,
            slots: slots.max(2),
            running: 0,
        }
    }

    /// Kernels running now.
    pub(crate) fn running(&self) -> usize {
        self.running
    }

    /// Whether a kernel may start now.
    pub(crate) fn free(&self) -> bool {
        self.running < self.slots
    }

    /// A kernel starts now: when its stream may go on.
    pub(crate) fn start(&mut self, now: Instant) -> Instant {
        self.running += 1;
        now + self.latency
    }

    /// A kernel's time is up.
    pub(crate) fn finish(&mut self) {
        self.running -= 1;
    }
}
