//! Loom models of the notifier's lock-free paths (`scripts/model-check.sh`):
//! the settled mirror (`settled_below`, `any_failed`) read without the lock
//! while a notification or a fault settles points under it.

use std::task::{Wake, Waker};

use loom::sync::atomic::AtomicBool as LoomBool;

// Paths from the crate root: a `super::` here would read as an import
// of the folder above (tools/import-cycles.py sees the file, not the
// test module).
use std::sync::Arc;

use crate::error::{DriverCall, ResourceError, ResourceResult};
use crate::futures::kick::Kick;
use crate::futures::notifier::Notifier;
use crate::gpu::RawEvent;
use crate::types::{RawStream, StreamId};
use crate::util::sync::Ordering;

struct Flag(LoomBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

fn notifier() -> Notifier {
    let stream = StreamId::new(0, 0);
    let raw = RawStream::sim(0, 0);
    Notifier::with_handles(
        stream,
        (raw, raw, false),
        RawEvent::sim(0),
        Arc::new(Kick::default()),
    )
}

/// How a future ends its check-then-park: the outcome, if it saw one.
fn check_then_park(n: &Notifier, seq: u64, waker: &Waker) -> Option<ResourceResult<()>> {
    match n.check(seq) {
        Ok(outcome) => Some(outcome),
        Err(_) => n.register(seq, waker, None),
    }
}

/// A notification lands while a future checks the mirror and parks:
/// the future sees the point done, or is woken. Never neither.
#[test]
fn a_notification_racing_a_check_is_never_lost() {
    loom::model(|| {
        let n = Arc::new(notifier());
        let seq = n.mark();
        let host = {
            let n = n.clone();
            loom::thread::spawn(move || n.signal.deliver(seq))
        };
        let flag = Arc::new(Flag(LoomBool::new(false)));
        let waker = Waker::from(flag.clone());
        let seen = check_then_park(&n, seq, &waker);
        host.join().unwrap();
        match seen {
            Some(outcome) => assert_eq!(outcome, Ok(())),
            None => assert!(flag.0.load(Ordering::Acquire), "parked and never woken"),
        }
        assert_eq!(n.check(seq), Ok(Ok(())));
    });
}

/// A device fault fails the stream while a future checks: the future
/// sees the error or is woken to read it, and never reads "done" for a
/// point the GPU was not known to reach (the mirror's base moves past
/// failed points; `any_failed` is published first).
#[test]
fn a_fault_racing_a_check_is_never_read_as_done() {
    loom::model(|| {
        let n = Arc::new(notifier());
        let seq = n.mark();
        let error = ResourceError::Driver {
            call: DriverCall::EventQuery,
            code: 700,
            message: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        };
        let fallback = {
            let n = n.clone();
            let error = error.clone();
            loom::thread::spawn(move || n.fail_all(error))
        };
        let flag = Arc::new(Flag(LoomBool::new(false)));
        let waker = Waker::from(flag.clone());
        let seen = check_then_park(&n, seq, &waker);
        fallback.join().unwrap();
        match seen {
            Some(outcome) => {
                assert_eq!(outcome, Err(error.clone()), "a failed point read as done")
            }
            None => assert!(flag.0.load(Ordering::Acquire), "parked and never woken"),
        }
        assert_eq!(n.check(seq), Ok(Err(error)));
        assert!(n.failure().is_some());
    });
}
