//! Relief lists: where a shared limit (a [`Budget`](crate::Budget))
//! finds the resources it may ask for idle memory.
//!
//! A limit shared by several stacks refuses a request on one of them while
//! another holds memory no caller uses (a cache's idle blocks and pages, a
//! debug guard's quarantine). Its [`BudgetRelief`] lists those *holders*,
//! each a weak reference with an id to unregister:
//!
//! - every [`BudgetResource`](crate::BudgetResource), which
//!   reaches the stack below it;
//! - every stack under the futures layer that charges the limit, the whole
//!   stack, so that a cache *above* the budget resource is reached too. A
//!   stack reports the limits it charges through
//!   [`DeviceMemoryResource::budget_reliefs`](super::DeviceMemoryResource::budget_reliefs),
//!   which every decorator forwards, so a stack built by hand registers
//!   exactly as one built by [`AsyncResource::build`](crate::AsyncResource::build).
//!
//! The list lives in the resource layer, below the adaptor that owns the
//! budget, because the futures layer registers a whole stack from what the
//! resource trait reports: the trait names this type, so it cannot live
//! above it.
//!
//! # Who changes it
//!
//! A holder registers when it is made and unregisters when its
//! [`HolderRegistration`] drops. [`BudgetRelief::relieve`] copies the live
//! holders out under the list's lock, releases the lock, and asks each to
//! [`give_back_idle`](IdleHolder::give_back_idle).
//!
//! # Bounded
//!
//! One pass over the holders per call; no lock is held across a holder's
//! call (which makes driver calls), and a relief inside a relief (a holder
//! whose stack charges the same limit again, refused while giving back)
//! does nothing: a thread-local flag marks a thread inside a relief.

use std::cell::Cell;
use std::sync::{Arc, Weak};

use crate::util::sync::{AtomicU64, Mutex, MutexGuard, Ordering};
use crate::waiters::Scope;

/// A resource under a shared limit that may hold memory no caller uses.
pub(crate) trait IdleHolder: Send + Sync {
    /// Gives idle memory back to the device and releases from the limit
    /// what left it; returns the bytes released. Never blocks inside a
    /// poll.
    fn give_back_idle(&self) -> usize;

    /// The stream pool whose whole stack this holder is (`None` for a
    /// budget resource, which reaches only the stack below it): a request
    /// refused on that pool does not ask it, as the stack may be inside
    /// that very request (and its cache trims itself when it is refused).
    fn whole_stack_of(&self) -> Option<u64> {
        None
    }
}

type HolderList = Vec<(u64, Weak<dyn IdleHolder>)>;

struct Holders {
    /// Registered holders, by registration id.
    list: Mutex<HolderList>,
    next_id: AtomicU64,
    /// The list's identity in the process, never reused: the
    /// [scope](crate::waiters::Scope) that the budget's releases wake.
    id: u64,
}

/// Ids of relief lists (an address could be reused by a later list while a
/// queue still names the old one).
static NEXT_LIST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Default for Holders {
    fn default() -> Self {
        Holders {
            list: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            id: NEXT_LIST.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

/// The relief list of one shared limit: the holders of idle memory it asks
/// when it refuses a request. Reported by the resources that charge the
/// limit ([`DeviceMemoryResource::budget_reliefs`](super::DeviceMemoryResource::budget_reliefs));
/// opaque outside the crate. Clones name the same list.
#[derive(Clone, Default)]
pub struct BudgetRelief {
    holders: Arc<Holders>,
}

impl std::fmt::Debug for BudgetRelief {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetRelief")
            .field("holders", &self.lock().len())
            .finish()
    }
}

impl PartialEq for BudgetRelief {
    /// The same list (one limit reported by two layers of a stack).
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.holders, &other.holders)
    }
}

impl Eq for BudgetRelief {}

thread_local! {
    /// Whether this thread is inside a relief.
    static RELIEVING: Cell<bool> = const { Cell::new(false) };
}

/// Registered with a relief list until dropped.
#[derive(Debug)]
pub(crate) struct HolderRegistration {
    relief: BudgetRelief,
    id: u64,
}

impl Drop for HolderRegistration {
    fn drop(&mut self) {
        self.relief.lock().retain(|(id, _)| *id != self.id);
    }
}

impl BudgetRelief {
    fn lock(&self) -> MutexGuard<'_, HolderList> {
        self.holders.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The scope of the limit's bytes: a release wakes the waiters of the
    /// stacks that charge it ([`crate::waiters`]).
    pub(crate) fn scope(&self) -> Scope {
        Scope::Budget(self.holders.id)
    }

    /// Registers `holder` to be asked for idle memory, until the
    /// registration is dropped.
    pub(crate) fn register(&self, holder: Weak<dyn IdleHolder>) -> HolderRegistration {
        let id = self.holders.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().push((id, holder));
        HolderRegistration {
            relief: self.clone(),
            id,
        }
    }

    /// Asks every live holder (but whole stacks on the pool `refused_on`,
    /// which the refused request may be inside) to give idle memory back;
    /// returns the bytes they released. Does nothing inside a relief.
    pub(crate) fn relieve(&self, refused_on: Option<u64>) -> usize {
        if RELIEVING.with(Cell::get) {
            return 0;
        }
        // Copied out: no lock is held while the holders make driver calls
        // (and a holder's drop, which unregisters, may run meanwhile).
        let live: Vec<Arc<dyn IdleHolder>> = self
            .lock()
            .iter()
            .filter_map(|(_, h)| h.upgrade())
            .filter(|h| refused_on.is_none() || h.whole_stack_of() != refused_on)
            .collect();
        RELIEVING.with(|r| r.set(true));
        struct Leave;
        impl Drop for Leave {
            fn drop(&mut self) {
                RELIEVING.with(|r| r.set(false));
            }
        }
        let _leave = Leave;
        live.iter().map(|h| h.give_back_idle()).sum()
    }
}
