//! What a trace asks for: its live requested bytes after each operation, and
//! their peak, the figure held memory is measured against.

use std::collections::HashMap;

use super::format::{OpKind, Trace};

/// The live requested bytes of a trace, operation by operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requested {
    /// Live requested bytes after each operation (`after[i]` after
    /// `trace.ops[i]`).
    pub after: Vec<usize>,
    /// The most bytes live at once.
    pub peak: usize,
}

impl Requested {
    /// Follows `trace` (a checked trace: every free names a live block).
    pub fn of(trace: &Trace) -> Requested {
        let mut sizes: HashMap<u64, usize> = HashMap::with_capacity(1 << 12);
        let mut live = 0usize;
        let mut peak = 0usize;
        let after = trace
            .ops
            .iter()
            .map(|op| {
                match op.kind {
                    OpKind::Alloc => {
                        sizes.insert(op.id, op.size);
                        live += op.size;
                        peak = peak.max(live);
                    }
                    OpKind::Free => live -= sizes.remove(&op.id).unwrap_or(0),
                }
                live
            })
            .collect();
        Requested { after, peak }
    }
}
