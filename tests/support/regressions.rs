//! Where proptest keeps the failing cases it found: beside each test file,
//! `NAME.proptest-regressions` (committed, replayed before new cases).
//!
//! Proptest's default (`SourceParallel`) looks up from the test file for a
//! `lib.rs` or `main.rs` and, finding a binary's `main.rs`, would write and
//! read `tests/proptest-regressions/BINARY/NAME.txt` instead, silently
//! missing the files kept beside the sources; so every proptest here names
//! this.

use proptest::test_runner::{FailurePersistence, FileFailurePersistence};

/// `NAME.proptest-regressions` beside the test file `NAME.rs`.
pub fn beside_source() -> Option<Box<dyn FailurePersistence>> {
    Some(Box::new(FileFailurePersistence::WithSource(
        "proptest-regressions",
    )))
}
