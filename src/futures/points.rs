//! The awaited points of one stream, in sequence order.
//!
//! Points are handed out in increasing sequence numbers and end in any
//! order, but the stream reaches them in order: knowing that point `n` is
//! reached settles every point at or below it. So the points live in a ring
//! ([`VecDeque`]) indexed by `seq - base`, with no allocation per point and
//! no map: a new point is a `push_back`, reaching `n` walks the front, and
//! the front is popped as soon as nobody needs its slot.
//!
//! A slot outlives its point's completion only while an earlier slot is
//! still pending: a **done** slot at the front is popped (its owner reads
//! "below `base`" as done), and a **failed** one too, its error moving to a
//! side map until its owner lets go of it. So the ring holds no more than
//! the points from the oldest pending one on; the [notifier](super::notifier)
//! asks for a notification when that span grows long.

use std::collections::{BTreeMap, VecDeque};
use std::task::Waker;

use crate::error::{ResourceError, ResourceResult};
use crate::gpu::RawEvent;

#[derive(Debug)]
enum State {
    /// Not known reached.
    Pending,
    /// Reached; kept only while an earlier slot is still kept.
    Done,
    /// The stream failed before the point was known reached.
    Failed(Box<ResourceError>),
    /// Its owner is gone.
    Gone,
}

#[derive(Debug)]
struct Slot {
    state: State,
    /// Set only by a parked owner.
    waker: Option<Waker>,
    /// The parked owner's event, recorded at this point: a notification
    /// for this point alone can wait on it.
    event: Option<RawEvent>,
}

/// The points of one stream. Not synchronized: the notifier keeps it under
/// its lock. Laid out in declaration order (`repr(C)`): the fields a new
/// point touches come first (see the notifier's state).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Points {
    /// Sequence number of `slots[0]`; everything below it is done, gone,
    /// or failed with its error in `failed`.
    base: u64,
    slots: VecDeque<Slot>,
    /// A point ever failed (sticky: the stream is dead after a fault).
    ever_failed: bool,
    /// Errors of failed points below `base` whose owners have not let go.
    failed: BTreeMap<u64, ResourceError>,
}

impl Default for Points {
    fn default() -> Self {
        Points {
            base: 1,
            slots: VecDeque::new(),
            failed: BTreeMap::new(),
            ever_failed: false,
        }
    }
}

impl Points {
    fn slot_mut(&mut self, seq: u64) -> Option<&mut Slot> {
        let at = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.slots.get_mut(at)
    }

    /// Adds point `seq`, which must be the next sequence number of the
    /// stream (one above every point added before).
    pub(crate) fn push(&mut self, seq: u64) {
        debug_assert_eq!(seq, self.base + self.slots.len() as u64);
        self.slots.push_back(Slot {
            state: State::Pending,
            waker: None,
            event: None,
        });
    }

    fn pop_settled(&mut self) {
        while let Some(front) = self.slots.front() {
            if matches!(front.state, State::Pending) {
                break;
            }
            if let Some(Slot {
                state: State::Failed(e),
                ..
            }) = self.slots.pop_front()
            {
                self.failed.insert(self.base, *e);
            }
            self.base += 1;
        }
    }

    /// The outcome of `seq` if it is settled.
    pub(crate) fn outcome(&self, seq: u64) -> Option<ResourceResult<()>> {
        if seq < self.base {
            return Some(self.failed.get(&seq).map_or(Ok(()), |e| Err(e.clone())));
        }
        let at = usize::try_from(seq - self.base).ok()?;
        match self.slots.get(at)?.state {
            State::Pending => None,
            State::Failed(ref e) => Some(Err((**e).clone())),
            State::Done | State::Gone => Some(Ok(())),
        }
    }

    /// Every point below it is settled (done, released, or failed with its
    /// error kept aside); the point at it, if any, is pending.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Whether a point ever failed: then "below the base" no longer means
    /// "done".
    pub(crate) fn any_failed(&self) -> bool {
        self.ever_failed
    }

    /// Slots in the ring: the points from the oldest pending one on.
    pub(crate) fn span(&self) -> usize {
        self.slots.len()
    }

    /// Whether a point before `seq` is not known reached (then, by stream
    /// order, neither is `seq`).
    pub(crate) fn has_pending_before(&self, seq: u64) -> bool {
        self.slots
            .iter()
            .take(usize::try_from(seq.saturating_sub(self.base)).unwrap_or(usize::MAX))
            .any(|s| matches!(s.state, State::Pending))
    }

    /// Parks `waker` on `seq` unless it is settled; returns the outcome if
    /// it is. `event`, when given, is the owner's event recorded at `seq`
    /// (see [`oldest_parked`](Self::oldest_parked)).
    pub(crate) fn register(
        &mut self,
        seq: u64,
        waker: &Waker,
        event: Option<RawEvent>,
    ) -> Option<ResourceResult<()>> {
        if let Some(outcome) = self.outcome(seq) {
            return Some(outcome);
        }
        let slot = self.slot_mut(seq)?;
        match &mut slot.waker {
            Some(w) if w.will_wake(waker) => {}
            w => *w = Some(waker.clone()),
        }
        if event.is_some() {
            slot.event = event;
        }
        None
    }

    /// The oldest parked pending point that has its own event, with that
    /// event: a notification waiting on it wakes that point as soon as the
    /// stream reaches it, not when the stream reaches its end.
    pub(crate) fn oldest_parked(&self) -> Option<(u64, RawEvent)> {
        self.slots.iter().enumerate().find_map(|(i, s)| match s {
            Slot {
                state: State::Pending,
                waker: Some(_),
                event: Some(e),
            } => Some((self.base + i as u64, *e)),
            _ => None,
        })
    }

    /// Whether a point after `seq` is parked and pending.
    pub(crate) fn parked_after(&self, seq: u64) -> bool {
        let skip =
            usize::try_from(seq.saturating_add(1).saturating_sub(self.base)).unwrap_or(usize::MAX);
        self.slots
            .iter()
            .skip(skip)
            .any(|s| matches!(s.state, State::Pending) && s.waker.is_some())
    }

    /// The stream reached `through`: settles every pending point at or below
    /// it and hands back the wakers of the parked ones.
    pub(crate) fn reach(&mut self, through: u64, wake: &mut Vec<Waker>) {
        let count = through.saturating_add(1).saturating_sub(self.base);
        let count = usize::try_from(count).map_or(self.slots.len(), |c| c.min(self.slots.len()));
        for slot in self.slots.iter_mut().take(count) {
            if matches!(slot.state, State::Pending) {
                slot.state = State::Done;
                wake.extend(slot.waker.take());
            }
        }
        self.pop_settled();
    }

    /// Fails every pending point with `error`; hands back the parked wakers.
    pub(crate) fn fail_pending(&mut self, error: &ResourceError, wake: &mut Vec<Waker>) -> usize {
        let mut failed = 0;
        for slot in self.slots.iter_mut() {
            if matches!(slot.state, State::Pending) {
                slot.state = State::Failed(Box::new(error.clone()));
                wake.extend(slot.waker.take());
                failed += 1;
            }
        }
        self.ever_failed |= failed > 0;
        self.pop_settled();
        failed
    }

    /// The owner of `seq` let go of it.
    pub(crate) fn release(&mut self, seq: u64) {
        if seq < self.base {
            self.failed.remove(&seq);
        } else if let Some(slot) = self.slot_mut(seq) {
            slot.state = State::Gone;
            slot.waker = None;
            slot.event = None;
            self.pop_settled();
        }
    }

    /// Points not known reached.
    pub(crate) fn pending(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s.state, State::Pending))
            .count()
    }

    /// Whether any point is not known reached.
    pub(crate) fn any_pending(&self) -> bool {
        self.slots.iter().any(|s| matches!(s.state, State::Pending))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::Wake;

    use super::*;
    use crate::error::DriverCall;

    struct Flag;
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {}
    }

    fn waker() -> Waker {
        Arc::new(Flag).into()
    }

    fn points(n: u64) -> Points {
        let mut p = Points::default();
        (1..=n).for_each(|s| p.push(s));
        p
    }

    #[test]
    fn reaching_settles_in_order_and_wakes_only_parked_points() {
        let mut p = points(4);
        assert!(p.register(2, &waker(), None).is_none());
        let mut wake = Vec::new();
        p.reach(2, &mut wake);
        assert_eq!(wake.len(), 1);
        assert_eq!(p.outcome(1), Some(Ok(())));
        assert_eq!(p.outcome(2), Some(Ok(())));
        assert_eq!(p.outcome(3), None);
        assert!(!p.has_pending_before(3));
        assert!(p.has_pending_before(4));
        assert_eq!(p.pending(), 2);
        assert_eq!(p.slots.len(), 2, "reached slots are popped");
    }

    #[test]
    fn a_failed_point_keeps_its_error_until_released_but_not_its_slot() {
        let mut p = points(3);
        let e = ResourceError::Driver {
            call: DriverCall::EventQuery,
            code: 700,
            message: "fault".into(),
        };
        let mut wake = Vec::new();
        assert_eq!(p.fail_pending(&e, &mut wake), 3);
        p.reach(3, &mut wake);
        p.push(4);
        assert_eq!(p.slots.len(), 1, "failed slots leave the ring");
        assert_eq!(p.outcome(1), Some(Err(e.clone())));
        p.release(1);
        assert_eq!(p.outcome(1), Some(Ok(())));
        assert_eq!(p.outcome(3), Some(Err(e)));
        p.release(2);
        p.release(3);
        assert!(p.failed.is_empty());
        assert_eq!(p.base, 4);
    }

    #[test]
    fn a_released_point_does_not_hold_back_later_ones() {
        let mut p = points(3);
        p.release(1);
        assert!(!p.has_pending_before(2));
        assert!(p.has_pending_before(3));
        p.release(2);
        assert_eq!(p.slots.len(), 1);
        assert_eq!(p.outcome(3), None);
    }
}
