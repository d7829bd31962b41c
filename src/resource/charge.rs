//! [`MappingCharge`]: what a layer that lends its device to a tier above
//! it charges for the physical memory that tier creates.
//!
//! A tier that maps memory itself (the cache's virtual-memory arena) does
//! not allocate through the layers below it: it takes the backend from
//! [`DeviceMemoryResource::device_access`](crate::DeviceMemoryResource::device_access)
//! and calls `cuMemCreate` and `cuMemRelease` on its own. A layer that must
//! see every byte the device holds for it (a [`Budget`](crate::Budget))
//! may still lend it the device, by adding a charge to the
//! [`DeviceAccess`](crate::DeviceAccess) it returns: the tier then asks
//! every charge before it creates physical memory and gives the bytes back
//! to each once that memory is released. So the layer sees the mappings as
//! exactly as it sees blocks: from before the memory exists until after it
//! is gone.
//!
//! # Contract
//!
//! - [`try_charge`](MappingCharge::try_charge) before the memory is
//!   created: an error (a budget's
//!   [`BudgetExceeded`](crate::ResourceError::BudgetExceeded)) means the
//!   tier creates nothing and reports that error, as the layer would for
//!   a refused allocation; an `Ok` counts the bytes.
//! - [`release`](MappingCharge::release) after the memory is released (or
//!   when its creation failed after the charge), with the bytes charged:
//!   never before the device has them back, so the layer never counts as
//!   free what the device still holds.
//!
//! A tier charges in the order the layers added their charges and gives a
//! refused growth's charges back to those that accepted it
//! ([`DeviceAccess::try_charge`](crate::DeviceAccess::try_charge)).

use crate::error::ResourceResult;

/// Counts the physical memory a tier above creates on a device lent to it
/// (see the module's essay for the contract).
///
/// Not `unsafe`: a charge decides what a layer *counts*, never which
/// memory the GPU touches.
pub trait MappingCharge: Send + Sync + std::fmt::Debug {
    /// Counts `bytes` about to be created, or refuses them with the
    /// error the tier reports (nothing is counted then).
    ///
    /// # Errors
    /// The layer's refusal: for a budget,
    /// [`BudgetExceeded`](crate::ResourceError::BudgetExceeded) with the
    /// numbers it compared.
    fn try_charge(&self, bytes: usize) -> ResourceResult<()>;

    /// Gives back `bytes` charged earlier, once the device has them back.
    fn release(&self, bytes: usize);
}
