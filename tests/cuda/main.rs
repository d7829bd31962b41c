//! Every GPU-only test file: each test is `#[ignore = "needs a CUDA GPU"]`
//! and runs on the GPU machine with `--include-ignored`
//! (`scripts/gpu-run.sh suites`, `scripts/gpu-call.sh`). Tests of other
//! binaries that have a CUDA variant are ignored the same way (`--ignored`
//! runs them).

#[path = "../support/mod.rs"]
mod support;

mod adaptors;
mod buffer;
mod futures;
mod graph;
mod host;
mod resource;
mod safety;
mod sleep;
