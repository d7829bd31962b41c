//! Randomized models: the whole API, the adaptor stack and the resource,
//! each against a reference model (proptest keeps each file's regressions
//! beside it, `NAME.proptest-regressions`).

#[path = "../support/mod.rs"]
mod support;

mod adaptor_model;
mod api_model;
mod resource_model;
