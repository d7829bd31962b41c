//! Stats: current, peak and total per tag and overall.

use crate::support;

use std::sync::Arc;

use streamalloc::DriverCall;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, DeviceMemoryResource, ResourceError};
use streamalloc::{Stats, StatsCounts, StatsResource};
use support::NoTracking;

const W: AllocTag = AllocTag("weights");
const A: AllocTag = AllocTag("activations");

#[test]
fn bad_input_changes_nothing() {
    let stats = Stats::new();
    // Refused allocations count as failures and nothing else.
    support::check_bad_input(
        |inner| StatsResource::new(inner, &stats),
        |r| {
            let mut o = r.stats().snapshot().overall;
            o.failed_allocations = 0;
            o
        },
    );
}

#[test]
fn forwards_what_it_does_not_change() {
    let stats = Stats::new();
    support::check_forwarding(|inner| StatsResource::new(inner, &stats), |_| {});
    let snap = stats.snapshot();
    assert_eq!(snap.overall.total_blocks, 2);
    assert_eq!(snap.overall.current_bytes, 0);
    let f = support::sim(1);
    assert!(
        !StatsResource::new(NoTracking(f.resource.clone()), &stats).supports_block_use_tracking()
    );
}

#[test]
fn counts_current_peak_and_total_per_tag() {
    let f = support::sim(1);
    let s = f.stream(0);
    let stats = Stats::new();
    let r = StatsResource::new(f.resource.clone(), &stats);
    let w = r.allocate(1000, s, W).unwrap();
    let a1 = r.allocate(300, s, A).unwrap();
    let a2 = r.allocate(200, s, A).unwrap();
    r.deallocate(a1).unwrap();
    let a3 = r.allocate(100, s, A).unwrap();

    let snap = r.stats().snapshot();
    assert_eq!(
        snap.overall,
        StatsCounts {
            current_bytes: 1300,
            peak_bytes: 1500,
            total_bytes: 1600,
            current_blocks: 3,
            peak_blocks: 3,
            total_blocks: 4,
            failed_allocations: 0,
            ..StatsCounts::default()
        }
    );
    assert_eq!(
        *snap.tag(A).unwrap(),
        StatsCounts {
            current_bytes: 300,
            peak_bytes: 500,
            total_bytes: 600,
            current_blocks: 2,
            peak_blocks: 2,
            total_blocks: 3,
            failed_allocations: 0,
            ..StatsCounts::default()
        }
    );
    assert_eq!(snap.tag(W).unwrap().current_bytes, 1000);
    assert_eq!(snap.per_tag.len(), 2);
    assert!(snap.tag(AllocTag("kv")).is_none());
    for b in [w, a2, a3] {
        r.deallocate(b).unwrap();
    }
    let snap = stats.snapshot();
    assert_eq!(snap.overall.current_bytes, 0);
    assert_eq!(snap.overall.peak_bytes, 1500);
}

#[test]
fn failures_count_as_failures_only() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let stats = Stats::new();
    let r = StatsResource::new(f.resource.clone(), &stats);
    let block = r.allocate(64, f.stream(0), W).unwrap();
    gpu.fail_nth(DriverCall::AllocAsync, 1);
    assert!(r.allocate(64, f.stream(0), W).is_err());
    r.deallocate(block.clone()).unwrap();
    let before = stats.snapshot();
    assert!(matches!(
        r.deallocate(block),
        Err(ResourceError::DoubleFree { .. })
    ));
    let after = stats.snapshot();
    assert_eq!(after, before, "a refused free changes no count");
    assert_eq!(after.overall.failed_allocations, 1);
    assert_eq!(after.tag(W).unwrap().failed_allocations, 1);
    assert_eq!(after.overall.total_blocks, 1);
}

#[test]
fn the_snapshot_prints_a_table() {
    let f = support::sim(1);
    let stats = Stats::new();
    let r = StatsResource::new(f.resource.clone(), &stats);
    let _w = r.allocate(4096, f.stream(0), W).unwrap();
    let table = stats.snapshot().to_string();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[0].starts_with("tag") && lines[0].contains("peak B"));
    assert!(lines[1].starts_with("weights") && lines[1].contains("4096"));
    assert!(lines[2].starts_with("(all)"));
}

#[test]
fn counts_stay_exact_under_threads() {
    let f = support::sim_with(SimGpu::new(), 8);
    let stats = Stats::new();
    let r = Arc::new(StatsResource::new(f.resource.clone(), &stats));
    let rounds = support::scaled(200, 20);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let r = r.clone();
            let s = f.stream(t);
            std::thread::spawn(move || {
                for i in 0..rounds {
                    let tag = if i % 2 == 0 { W } else { A };
                    let b = r.allocate(64, s, tag).unwrap();
                    r.deallocate(b).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let snap = stats.snapshot();
    assert_eq!(snap.overall.total_blocks, 8 * rounds as u64);
    assert_eq!(snap.overall.current_blocks, 0);
    assert_eq!(snap.overall.current_bytes, 0);
    assert!(snap.overall.peak_blocks >= 1 && snap.overall.peak_blocks <= 8);
    assert_eq!(snap.tag(W).unwrap().total_blocks, 4 * rounds as u64);
}
