//! The strategies: stacks, ops and their arguments, drawn so that every
//! list is valid and shrinks well.

use super::*;

pub(super) fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => (0..LIMITS.len()).prop_map(Kind::Budget),
        3 => any::<bool>().prop_map(|arena| Kind::Cache { arena }),
        1 => Just(Kind::Guard),
        1 => Just(Kind::Retry),
        1 => Just(Kind::Stats),
        1 => Just(Kind::Tracing),
        1 => Just(Kind::User),
    ]
}

pub(super) fn stack() -> impl Strategy<Value = Stack> {
    (
        proptest::collection::vec(kind(), 0..5),
        0..GRANULARITIES.len(),
        any::<bool>(),
        proptest::option::weighted(0.2, proptest::option::of(any::<bool>())),
        0..LIMITS.len(),
    )
        .prop_map(|(mut kinds, g, reaper, twin, limit)| {
            // A second device shares the outermost budget: there is one.
            let twin = twin.map(|cache| {
                if !kinds.iter().any(|k| matches!(k, Kind::Budget(_))) {
                    kinds.insert(0, Kind::Budget(limit));
                }
                TwinStack { cache }
            });
            Stack {
                kinds,
                granularity: GRANULARITIES[g],
                reaper,
                twin,
            }
        })
}

pub(super) fn place() -> impl Strategy<Value = Place> {
    prop_oneof![
        2 => Just(Place::Here),
        1 => Just(Place::Thread),
        1 => Just(Place::Runtime),
    ]
}

pub(super) fn then() -> impl Strategy<Value = Then> {
    prop_oneof![Just(Then::Keep), Just(Then::Drop), Just(Then::Await)]
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    let size = proptest::sample::select(SIZES.to_vec());
    let stream = 0..STREAMS;
    let slot = 0usize..8;
    let how = prop_oneof![
        2 => Just(AllocHow::Await),
        1 => Just(AllocHow::Try),
        1 => (0u8..4).prop_map(|polls| AllocHow::Cancel { polls }),
    ];
    prop_oneof![
        5 => (size.clone(), stream.clone(), how.clone())
            .prop_map(|(size, stream, how)| Op::Alloc { size, stream, how }),
        5 => (slot.clone(), proptest::option::of(slot.clone()), stream.clone(), then(),
              proptest::bool::weighted(0.05))
            .prop_map(|(write, read, stream, then, panic)| Op::Launch { write, read, stream, then, panic }),
        3 => (slot.clone(), place()).prop_map(|(slot, at)| Op::DropBuffer { slot, at }),
        1 => (slot.clone(), then()).prop_map(|(slot, then)| Op::Free { slot, then }),
        1 => (slot.clone(), place()).prop_map(|(slot, at)| Op::DropPoint { slot, at }),
        1 => slot.clone().prop_map(|slot| Op::AwaitPoint { slot }),
        1 => (slot.clone(), place()).prop_map(|(slot, at)| Op::DropFree { slot, at }),
        1 => slot.clone().prop_map(|slot| Op::AwaitFree { slot }),
        2 => (size.clone(), stream.clone(), stream.clone())
            .prop_map(|(size, stream, other)| Op::Spawn { size, stream, other }),
        2 => (slot.clone(), 0u8..4).prop_map(|(slot, ticks)| Op::Abort { slot, ticks }),
        2 => (0u8..8).prop_map(|n| Op::Tick { n }),
        2 => (1u8..8).prop_map(|n| Op::Step { n }),
        1 => Just(Op::Reap),
        1 => Just(Op::ReleaseIdle),
        1 => (0..FAULTS.len(), 0u8..6).prop_map(|(call, nth)| Op::Fault { call, nth }),
        1 => (0..HUGE.len()).prop_map(|which| Op::Huge { which }),
        2 => (stream.clone(), graph_size(), 0u8..3, keep(), proptest::option::weighted(0.2, slot.clone()))
            .prop_map(|(stream, size, temps, keep, adopt)| Op::Capture { stream, size, temps, keep, adopt }),
        3 => (slot.clone(), stream.clone(), then())
            .prop_map(|(slot, stream, then)| Op::Replay { slot, stream, then }),
        1 => (slot.clone(), place()).prop_map(|(slot, at)| Op::DropGraph { slot, at }),
        2 => (size.clone(), how.clone()).prop_map(|(size, how)| Op::TwinAlloc { size, how }),
        1 => (slot.clone(), place()).prop_map(|(slot, at)| Op::TwinDrop { slot, at }),
        2 => (stranger(), stream.clone(), entry()).prop_map(|(from, index, call)| Op::Foreign { from, index, call }),
        2 => ([size.clone(), size.clone()], stream, 1u8..4, 0u8..3, proptest::bool::ANY)
            .prop_map(|(sizes, stream, polls, take, keep)| Op::Reserve { sizes, stream, polls, take, keep }),
        1 => slot.clone().prop_map(|slot| Op::TakeReserved { slot }),
        1 => (slot, place()).prop_map(|(slot, at)| Op::DropReservation { slot, at }),
    ]
}

/// A graph's temporaries and kept block: never 0 bytes (no memory node).
pub(super) fn graph_size() -> impl Strategy<Value = usize> {
    proptest::sample::select(vec![100, 4096, 65536, 200_000])
}

pub(super) fn keep() -> impl Strategy<Value = Keep> {
    prop_oneof![
        2 => Just(Keep::No),
        1 => Just(Keep::Here),
        2 => Just(Keep::Thread),
        1 => Just(Keep::DroppedInside),
    ]
}

pub(super) fn stranger() -> impl Strategy<Value = Stranger> {
    prop_oneof![
        Just(Stranger::SameGpu),
        Just(Stranger::OtherGpu),
        Just(Stranger::ByHand)
    ]
}

pub(super) fn entry() -> impl Strategy<Value = Entry> {
    let slot = 0usize..8;
    prop_oneof![
        Just(Entry::TryAllocate),
        Just(Entry::Allocate),
        Just(Entry::TryAllocateBuffer),
        slot.clone().prop_map(|slot| Entry::Fill { slot }),
        slot.clone().prop_map(|slot| Entry::CopyFrom { slot }),
        slot.clone().prop_map(|slot| Entry::Launch { slot }),
        Just(Entry::Completion),
        slot.clone().prop_map(|slot| Entry::Prepare { slot }),
        slot.clone().prop_map(|slot| Entry::Finish { slot }),
        slot.clone().prop_map(|slot| Entry::Record { slot }),
        slot.prop_map(|slot| Entry::Replay { slot }),
        Just(Entry::Capture),
    ]
}

pub(super) fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(if cfg!(miri) { 2 } else { 256 })
}
