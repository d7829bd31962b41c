//! [`LentMappings`]: the charge a [`BudgetResource`](super::BudgetResource)
//! adds to the device it lends a tier above it.
//!
//! A cache over a budget builds its virtual-memory arena on the device the
//! budget lends ([`device_access`](crate::DeviceMemoryResource::device_access)),
//! and charges this before every `cuMemCreate` and releases it after every
//! `cuMemRelease`. The bytes go straight to the [`Budget`], not to the
//! resource's `charged` (which follows what the layers *below* hold, read
//! from their
//! [`bytes_outstanding`](crate::DeviceMemoryResource::bytes_outstanding),
//! and settles against it): the mappings are beside those layers, so a
//! settle never sees them and never releases them early. `Budget::in_use`
//! is then the blocks charged plus the memory mapped, each counted once.
//!
//! A refusal is the budget's own: first the other resources under the
//! budget are asked for their idle memory (whole stacks on the lending
//! pool excepted: the growth may be inside one of them), as a refused
//! allocation does, then the charge is tried once more and a second
//! refusal is [`BudgetExceeded`](crate::ResourceError::BudgetExceeded)
//! with the numbers compared. A release goes through [`Budget::release`],
//! which wakes the allocations waiting under the budget.

use super::Budget;
use crate::error::ResourceResult;
use crate::resource::MappingCharge;

/// What a budget charges for the memory a tier above creates on the
/// device it lends.
#[derive(Debug)]
pub(crate) struct LentMappings {
    pub(crate) budget: Budget,
    /// The pool of the lent device's streams: stacks on it are not asked
    /// for idle memory by a refused charge (the growth may be inside one).
    pub(crate) pool: Option<u64>,
}

impl MappingCharge for LentMappings {
    fn try_charge(&self, bytes: usize) -> ResourceResult<()> {
        let reservation = match self.budget.try_reserve(bytes) {
            Ok(reservation) => reservation,
            Err(_) => {
                self.budget.release_idle_for(self.pool);
                self.budget.try_reserve(bytes)?
            }
        };
        reservation.commit();
        Ok(())
    }

    fn release(&self, bytes: usize) {
        self.budget.release(bytes);
    }
}
