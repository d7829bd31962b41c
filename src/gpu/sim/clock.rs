//! Vector clocks: the happens-before order of the simulated device.
//!
//! Every stream has a clock; queuing an operation ticks the stream's own
//! component. A record captures the recording stream's clock in the event; a
//! wait joins that clock into the waiting stream's. What the host has seen
//! complete (a synchronize, a successful query, a host function that ran) is
//! joined into one host clock, and every operation queued after that is
//! ordered after it. All of this is known when an operation is *queued*, so
//! races are found deterministically, whatever order the device runs in.

/// A vector clock indexed by simulated stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct VectorClock(Vec<u64>);

impl VectorClock {
    pub(crate) fn get(&self, stream: usize) -> u64 {
        self.0.get(stream).copied().unwrap_or(0)
    }

    pub(crate) fn tick(&mut self, stream: usize) -> u64 {
        if self.0.len() <= stream {
            self.0.resize(stream + 1, 0);
        }
        self.0[stream] += 1;
        self.0[stream]
    }

    /// A clock that knows only `stream`'s own ticks.
    pub(crate) fn own_part(&self, stream: usize) -> VectorClock {
        let mut own = VectorClock(vec![0; stream + 1]);
        own.0[stream] = self.get(stream);
        own
    }

    pub(crate) fn join(&mut self, other: &VectorClock) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            *mine = (*mine).max(*theirs);
        }
    }

    /// Whether the event `epoch` of `stream` happened before this clock.
    pub(crate) fn covers(&self, epoch: Epoch) -> bool {
        self.get(epoch.stream) >= epoch.tick
    }
}

/// One operation's place in its stream: (stream, tick).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Epoch {
    pub(crate) stream: usize,
    pub(crate) tick: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_and_cover() {
        let mut a = VectorClock::default();
        let mut b = VectorClock::default();
        let ea = Epoch {
            stream: 0,
            tick: a.tick(0),
        };
        b.tick(1);
        assert!(!b.covers(ea));
        b.join(&a);
        assert!(b.covers(ea));
        a.tick(0);
        assert!(!b.covers(Epoch { stream: 0, tick: 2 }));
    }
}
