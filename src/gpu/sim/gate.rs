//! Call gates: make the N-th call of a kind stop before it runs, until the
//! test lets it go, so that a test can act while another thread is inside
//! a driver call (what a slow call on a real GPU allows).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::DriverCall;

/// What a gate's two sides share.
#[derive(Debug, Default)]
struct GateState {
    /// A call reached the gate and waits there (or waited).
    entered: bool,
    /// The test let it go (or dropped its side).
    open: bool,
}

#[derive(Debug, Default)]
struct GateShared {
    state: Mutex<GateState>,
    changed: Condvar,
}

impl GateShared {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The test's side of a gate set with [`SimGpu::gate_nth`](super::SimGpu::gate_nth):
/// the gated call waits, before it does anything, until [`open`](Self::open)
/// is called or the gate is dropped (so that a failing test never leaves a
/// thread stuck).
#[derive(Debug)]
pub struct CallGate {
    shared: Arc<GateShared>,
}

impl CallGate {
    /// Waits up to `timeout` for the gated call to reach the gate; true
    /// once it has.
    pub fn wait_entered(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        while !st.entered {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Lets the gated call go on (at once, if it has not reached the gate
    /// yet).
    pub fn open(&self) {
        self.shared.lock().open = true;
        self.shared.changed.notify_all();
    }
}

impl Drop for CallGate {
    fn drop(&mut self) {
        self.open();
    }
}

/// The device's gates that no call reached yet.
#[derive(Debug, Default)]
pub(crate) struct Gates {
    /// Per gate: the call kind, how many more calls of it pass first, and
    /// the gate.
    waiting: Mutex<Vec<(DriverCall, u64, Arc<GateShared>)>>,
}

impl Gates {
    fn lock(&self) -> MutexGuard<'_, Vec<(DriverCall, u64, Arc<GateShared>)>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A gate on the `nth` call of kind `call` from now on (1 = the next).
    pub(crate) fn add(&self, call: DriverCall, nth: u64) -> CallGate {
        let shared = Arc::new(GateShared::default());
        self.lock().push((call, nth.max(1) - 1, shared.clone()));
        CallGate { shared }
    }

    /// Called first by a gated kind of call (before the device's lock is
    /// taken, so that other calls go on meanwhile): waits at a gate that
    /// this call reaches, until the test opens it.
    pub(crate) fn pass(&self, call: DriverCall) {
        let reached = {
            let mut waiting = self.lock();
            if waiting.is_empty() {
                return;
            }
            let mut reached = Vec::new();
            waiting.retain_mut(|(c, before, gate)| {
                if *c != call {
                    return true;
                }
                if *before == 0 {
                    reached.push(gate.clone());
                    return false;
                }
                *before -= 1;
                true
            });
            reached
        };
        for gate in reached {
            let mut st = gate.lock();
            st.entered = true;
            gate.changed.notify_all();
            while !st.open {
                st = gate.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}
