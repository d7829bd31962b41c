//! The memory history: process-wide, so alone in this binary, and one test
//! that turns it on and off in steps (tests of one binary run on threads
//! at once).

use std::time::Duration;

use serde_pickle::{DeOptions, HashableValue, Value};
use streamalloc::Budget;
use streamalloc::ResourceBuilder;
use streamalloc::{AllocTag, AsyncResource, CacheConfig, Device, ResourceError, gpu::sim::SimGpu};
use streamalloc::{
    MemoryAction, clear_memory_history, memory_history, memory_history_capacity,
    record_memory_history,
};

const KIB: usize = 1 << 10;

fn actions() -> Vec<(MemoryAction, &'static str, usize)> {
    memory_history()
        .iter()
        .map(|e| (e.action, e.tag, e.size))
        .collect()
}

fn get<'v>(v: &'v Value, key: &str) -> &'v Value {
    let Value::Dict(d) = v else {
        panic!("not a dict: {v:?}")
    };
    &d[&HashableValue::String(key.to_string())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_records_what_the_stack_did_only_while_on() {
    let device = Device::sim(&SimGpu::new(), 2);
    let budget = Budget::new(256 * KIB);
    let res = AsyncResource::build(&device, &ResourceBuilder::new().budget(&budget)).unwrap();
    let s0 = device.stream(0).unwrap();

    // Off (the default): nothing is recorded.
    assert_eq!(memory_history_capacity(), 0);
    let b = res.allocate(4 * KIB, s0, AllocTag("off")).await.unwrap();
    res.deallocate(b).unwrap().await.unwrap();
    assert!(memory_history().is_empty());

    // On: an allocation, its free, and the free's completion (learnt from
    // the notification), in that order, with tag, stream and size.
    record_memory_history(1000, false);
    let b = res.allocate(8 * KIB, s0, AllocTag("w")).await.unwrap();
    let at = b.ptr();
    res.deallocate(b).unwrap().await.unwrap();
    let events = memory_history();
    let kinds: Vec<MemoryAction> = events.iter().map(|e| e.action).collect();
    assert_eq!(
        kinds,
        [
            MemoryAction::Alloc,
            MemoryAction::FreeRequested,
            MemoryAction::FreeCompleted
        ]
    );
    assert_eq!(
        (events[0].addr, events[0].size, events[0].tag),
        (at, 8 * KIB, "w")
    );
    assert_eq!((events[1].addr, events[1].stream), (at, Some(0)));
    assert_eq!(events[2].size, 8 * KIB);
    assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(events.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    assert!(events[0].backtrace.is_none());

    // The PyTorch trace pairs the completion with the block it freed.
    let pickle = res.snapshot().to_torch_pickle();
    let value = serde_pickle::value_from_slice(&pickle, DeOptions::new()).unwrap();
    let Value::List(traces) = get(&value, "device_traces") else {
        panic!()
    };
    let Value::List(trace) = &traces[0] else {
        panic!()
    };
    let seen: Vec<(String, i64)> = trace
        .iter()
        .map(|e| {
            let (Value::String(a), Value::I64(addr)) = (get(e, "action"), get(e, "addr")) else {
                panic!("{e:?}")
            };
            (a.clone(), *addr)
        })
        .collect();
    let at = at as i64;
    assert_eq!(
        seen,
        [
            ("alloc".to_string(), at),
            ("free_requested".to_string(), at),
            ("free_completed".to_string(), at)
        ]
    );

    // A refusal is recorded as an out-of-memory event with what was free;
    // a wait that begins and is served, as such.
    clear_memory_history();
    let big = res.allocate(200 * KIB, s0, AllocTag("big")).await.unwrap();
    let err = res
        .try_allocate(100 * KIB, s0, AllocTag("refused"))
        .unwrap_err();
    assert!(matches!(err, ResourceError::BudgetExceeded { .. }));
    let waiter = tokio::spawn({
        let res = res.clone();
        async move { res.allocate(100 * KIB, s0, AllocTag("waits")).await }
    });
    while res.waiting_allocations() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(res.deallocate(big).unwrap());
    let served = waiter.await.unwrap().unwrap();
    let seen = actions();
    assert_eq!(seen[0], (MemoryAction::Alloc, "big", 200 * KIB));
    assert_eq!(seen[1], (MemoryAction::Oom, "refused", 100 * KIB));
    assert_eq!(memory_history()[1].free, 56 * KIB);
    assert!(seen.contains(&(MemoryAction::WaitBegun, "waits", 100 * KIB)));
    let served_at = seen
        .iter()
        .position(|e| *e == (MemoryAction::WaitServed, "waits", 100 * KIB))
        .unwrap();
    assert_eq!(
        seen[served_at + 1],
        (MemoryAction::Alloc, "waits", 100 * KIB)
    );
    res.deallocate(served).unwrap().await.unwrap();

    // Bounded: the ring keeps the newest events.
    record_memory_history(3, false);
    for _ in 0..4 {
        let b = res.allocate(KIB, s0, AllocTag("ring")).await.unwrap();
        res.deallocate(b).unwrap().await.unwrap();
    }
    let events = memory_history();
    assert_eq!(events.len(), 3);
    assert!(events[2].seq > 3, "the oldest were evicted");

    // With backtraces: an allocation keeps its stack, naming this test.
    record_memory_history(10, true);
    let b = res.allocate(KIB, s0, AllocTag("bt")).await.unwrap();
    let bt = memory_history()[0].backtrace.clone().unwrap().to_string();
    assert!(bt.contains("observe_history"), "{bt}");
    res.deallocate(b).unwrap().await.unwrap();

    // The cache's mappings: a growth maps pages under the block; a trim
    // gives idle ones back once the GPU is done with them.
    record_memory_history(1000, false);
    let cached = AsyncResource::build(
        &device,
        &ResourceBuilder::new().cache(CacheConfig::default()),
    )
    .unwrap();
    let b = cached
        .allocate(4 << 20, s0, AllocTag("mapped"))
        .await
        .unwrap();
    let at = b.ptr();
    let maps: Vec<_> = memory_history()
        .into_iter()
        .filter(|e| e.action == MemoryAction::SegmentMap)
        .collect();
    assert!(!maps.is_empty());
    assert!(
        maps.iter()
            .any(|m| m.addr <= at && at < m.addr + m.size as u64)
    );
    cached.deallocate(b).unwrap().await.unwrap();
    cached.completion(s0).unwrap().await.unwrap();
    cached.inner().trim().unwrap();
    cached.completion(s0).unwrap().await.unwrap();
    cached.inner().trim().unwrap();
    let unmapped: usize = memory_history()
        .iter()
        .filter(|e| e.action == MemoryAction::SegmentUnmap)
        .map(|e| e.size)
        .sum();
    let mapped: usize = maps.iter().map(|m| m.size).sum();
    assert_eq!(unmapped, mapped, "every page mapped was given back");

    // Off again: nothing more.
    record_memory_history(0, false);
    let b = res.allocate(KIB, s0, AllocTag("off")).await.unwrap();
    res.deallocate(b).unwrap().await.unwrap();
    assert!(memory_history().is_empty());
}
