//! [`BudgetLayer`]: wraps resources in [`BudgetResource`]s of one budget.

use super::{Budget, BudgetResource};
use crate::adaptors::Layer;

/// Wraps every resource it is given in a [`BudgetResource`] counting
/// against the same [`Budget`].
#[derive(Debug, Clone)]
pub struct BudgetLayer {
    budget: Budget,
}

impl BudgetLayer {
    /// A layer that charges `budget` (a clone shares the count).
    pub fn new(budget: &Budget) -> Self {
        BudgetLayer {
            budget: budget.clone(),
        }
    }

    /// The budget charged.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }
}

impl<R: crate::DeviceMemoryResource + 'static> Layer<R> for BudgetLayer {
    type Resource = BudgetResource<R>;

    fn layer(&self, inner: R) -> BudgetResource<R> {
        BudgetResource::new(inner, &self.budget)
    }
}
