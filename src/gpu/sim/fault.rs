//! Fault injection: make the N-th call of a kind fail, or fault the device.

use std::collections::HashMap;

use crate::error::{DriverCall, driver_code};

/// What a faulted context reports.
pub(crate) const ILLEGAL_ADDRESS: i32 = driver_code::ILLEGAL_ADDRESS;
/// The code injected failures report.
pub(crate) const INJECTED: i32 = driver_code::UNKNOWN;

#[derive(Debug, Default)]
pub(crate) struct FaultPlan {
    calls: HashMap<DriverCall, u64>,
    fail_at: HashMap<DriverCall, Vec<u64>>,
    pub(crate) device_fault: bool,
}

impl FaultPlan {
    /// Counts one call of `call`; true when it must fail.
    pub(crate) fn on_call(&mut self, call: DriverCall) -> bool {
        let n = self.calls.entry(call).or_default();
        *n += 1;
        let n = *n;
        match self.fail_at.get_mut(&call) {
            Some(list) => {
                let before = list.len();
                list.retain(|&k| k != n);
                list.len() != before
            }
            None => false,
        }
    }

    pub(crate) fn fail_nth(&mut self, call: DriverCall, nth: u64) {
        let done = self.calls.get(&call).copied().unwrap_or(0);
        self.fail_at
            .entry(call)
            .or_default()
            .push(done + nth.max(1));
    }

    pub(crate) fn count(&self, call: DriverCall) -> u64 {
        self.calls.get(&call).copied().unwrap_or(0)
    }
}
