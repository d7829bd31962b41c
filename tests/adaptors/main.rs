//! The decorators (budget, stats, retry, debug guard), their auto traits,
//! the builder, and stacks of them in every order. Tracing has its own
//! binary (`tests/adaptor_tracing.rs`): its tests read events, and tests
//! here reach the same callsites with no subscriber.

#[path = "../support/mod.rs"]
mod support;

mod budget;
mod builder;
mod compose;
mod contract;
mod debug_guard;
mod forward_to_inner;
mod retry;
mod stack_orders;
mod stats;
mod traits;
