//! A stack of Budget, Stats and DebugGuardResource against a small reference model:
//! random allocations, frees, bad frees, flushes and reaps keep every count
//! equal to the model's.

mod common;

use std::collections::VecDeque;

use proptest::prelude::*;
use streamalloc::{AllocTag, DeviceBlock, DeviceMemoryResource, ResourceBuilder, ResourceError};
use streamalloc::{Budget, GuardConfig, Stats};

const LIMIT: usize = 16 << 10;
const CAP: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: usize, stream: usize },
    Free { pick: usize },
    FreeAgain { pick: usize },
    Flush,
    Reap,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..4096, 0usize..2).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        3 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Op::FreeAgain { pick }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reap),
    ]
}

/// What the stack should hold: live blocks, the quarantine (FIFO), bytes
/// whose free is queued but not reaped.
#[derive(Default)]
struct Model {
    live: Vec<DeviceBlock>,
    freed: Vec<DeviceBlock>,
    quarantine: VecDeque<usize>,
    pending: usize,
}

impl Model {
    fn live_bytes(&self) -> usize {
        self.live.iter().map(DeviceBlock::size).sum()
    }
    fn held_bytes(&self) -> usize {
        self.live_bytes() + self.quarantine.iter().sum::<usize>() + self.pending
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn the_stack_matches_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        let f = common::sim(2);
        let budget = Budget::new(LIMIT);
        let stats = Stats::new();
        let r = ResourceBuilder::new()
            .budget(&budget)
            .stats_with(&stats)
            .debug_guard(GuardConfig::new().max_blocks(CAP))
            .build(f.resource.clone());
        let guard = r.inner().inner();
        let mut m = Model::default();
        for op in ops {
            match op {
                Op::Alloc { size, stream } => {
                    // A refusal first asks the stack for its idle memory:
                    // the guard gives its quarantine back, and (off a poll)
                    // when that gave bytes back they are reaped, with every
                    // free pending before them. A quarantine of 0-byte
                    // blocks gives nothing back: its frees are queued and
                    // nothing is reaped (the budget's relief reaps only
                    // after bytes came back, so that a refusal with nothing
                    // idle never blocks on the GPU).
                    if m.held_bytes() + size > LIMIT && !m.quarantine.is_empty() {
                        let given: usize = m.quarantine.drain(..).sum();
                        if given > 0 {
                            m.pending = 0;
                        }
                    }
                    match r.allocate(size, f.stream(stream), AllocTag("p")) {
                        Ok(b) => {
                            prop_assert!(m.held_bytes() + size <= LIMIT);
                            m.live.push(b);
                        }
                        Err(ResourceError::BudgetExceeded { in_use, .. }) => {
                            prop_assert_eq!(in_use, m.held_bytes());
                            prop_assert!(m.held_bytes() + size > LIMIT);
                        }
                        Err(e) => prop_assert!(false, "{}", e),
                    }
                }
                Op::Free { pick } if !m.live.is_empty() => {
                    let b = m.live.swap_remove(pick % m.live.len());
                    r.deallocate(b.clone()).unwrap();
                    if m.quarantine.len() == CAP {
                        m.pending += m.quarantine.pop_front().unwrap();
                    }
                    m.quarantine.push_back(b.size());
                    m.freed.push(b);
                }
                Op::FreeAgain { pick } if !m.freed.is_empty() => {
                    let b = m.freed[pick % m.freed.len()].clone();
                    let id = b.id();
                    prop_assert_eq!(r.deallocate(b), Err(ResourceError::DoubleFree { block: id }));
                }
                Op::Flush => {
                    guard.flush().unwrap();
                    m.pending += m.quarantine.drain(..).sum::<usize>();
                }
                Op::Reap => {
                    r.reap_pending().unwrap();
                    m.pending = 0;
                }
                _ => {}
            }
            prop_assert_eq!(budget.in_use(), m.held_bytes());
            prop_assert_eq!(r.bytes_outstanding(), m.held_bytes());
            prop_assert_eq!(stats.snapshot().overall.current_bytes, m.live_bytes());
            prop_assert_eq!(stats.snapshot().overall.current_blocks, m.live.len());
            prop_assert_eq!(guard.quarantined().len(), m.quarantine.len());
            prop_assert!(budget.peak() <= LIMIT);
        }
    }
}
