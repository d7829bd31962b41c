//! A random workload around a capture: allocations and frees on the
//! captured stream and another, replays, against the graph's ownership.

use super::{MIB, fixture};

use proptest::prelude::*;

use streamalloc::gpu::RawGraphExec;
use streamalloc::{AllocTag, DeviceBlock, DeviceMemoryResource, SimResource};
use streamalloc::{CacheConfig, CachingResource};

/// One step of a random workload around a capture.
#[derive(Debug, Clone)]
enum Step {
    /// Allocate `size` on stream `stream` (0: the captured one, 1: another).
    Alloc { stream: usize, size: usize },
    /// Free the `index`-th block held on `stream` (modulo their count).
    Free { stream: usize, index: usize },
    /// Replay the graph (once it exists) on the replay stream.
    Replay,
}

fn step() -> impl Strategy<Value = Step> {
    let size = prop_oneof![Just(4096usize), Just(65536), Just(MIB), Just(3 * MIB)];
    prop_oneof![
        (0..2usize, size).prop_map(|(stream, size)| Step::Alloc { stream, size }),
        (0..2usize, 0..8usize).prop_map(|(stream, index)| Step::Free { stream, index }),
        Just(Step::Replay),
    ]
}

fn overlaps(a: (u64, usize), b: (u64, usize)) -> bool {
    a.0 < b.0 + b.1 as u64 && b.0 < a.0 + a.1 as u64
}

/// Runs `steps`: `before` outside any capture, `during` with stream 0
/// captured (every block the capture hands out is freed in it), `after`
/// while the graph lives. Nothing handed out outside the capture ever
/// overlaps memory the graph uses; after the release and the last replay,
/// everything comes back, with no race.
fn random_workload(vm: bool, before: &[Step], during: &[Step], after: &[Step]) {
    let f = fixture();
    let config = CacheConfig::default().virtual_memory(vm);
    let cache = CachingResource::with_config(SimResource::new(&f.device), config);
    let streams = [f.s, f.device.stream(2).unwrap()];
    let mut held: [Vec<DeviceBlock>; 2] = [Vec::new(), Vec::new()];
    let mut graph_owned: Vec<(u64, usize)> = Vec::new();
    let run = |steps: &[Step],
               held: &mut [Vec<DeviceBlock>; 2],
               phase: u8,
               graph_owned: &mut Vec<(u64, usize)>,
               graph: Option<RawGraphExec>| {
        for s in steps {
            match *s {
                Step::Alloc { stream, size } => {
                    let b = cache
                        .allocate(size, streams[stream], AllocTag::UNTAGGED)
                        .unwrap();
                    let range = (b.ptr(), b.size());
                    if phase == 1 && stream == 0 {
                        graph_owned.push(range);
                    } else {
                        assert!(
                            !graph_owned.iter().any(|&g| overlaps(g, range)),
                            "vm {vm}: {range:?} handed out over the graph's memory"
                        );
                    }
                    f.write(streams[stream], &b);
                    held[stream].push(b);
                }
                Step::Free { stream, index } if !held[stream].is_empty() => {
                    let b = held[stream].remove(index % held[stream].len());
                    if phase == 1 && stream == 0 {
                        graph_owned.push((b.ptr(), b.size()));
                    }
                    cache.deallocate(b).unwrap();
                }
                Step::Free { .. } => {}
                Step::Replay => {
                    if let Some(exec) = graph {
                        f.replay(exec, f.l, 1);
                    }
                }
            }
        }
    };
    run(before, &mut held, 0, &mut graph_owned, None);
    f.order(f.l, f.s);
    let capture = f.begin(f.s);
    let mut during_held: [Vec<DeviceBlock>; 2] = [Vec::new(), std::mem::take(&mut held[1])];
    run(during, &mut during_held, 1, &mut graph_owned, None);
    // The capture frees what it handed out; stream 0's blocks from before
    // are freed in it too.
    for b in during_held[0].drain(..).chain(held[0].drain(..)) {
        graph_owned.push((b.ptr(), b.size()));
        cache.deallocate(b).unwrap();
    }
    held[1] = std::mem::take(&mut during_held[1]);
    let graph = f.end(f.s);
    run(after, &mut held, 2, &mut graph_owned, Some(graph.1));
    f.replay(graph.1, f.l, 1);
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "vm {vm}: {:?}", f.gpu.races());
    f.destroy(graph);
    cache.release_capture(capture, f.l).unwrap();
    assert_eq!(cache.graph_bytes(), 0);
    for b in held.iter_mut().flat_map(|h| h.drain(..)) {
        cache.deallocate(b).unwrap();
    }
    f.gpu.run_until_idle();
    cache.release_idle().unwrap();
    cache.reap_pending().unwrap();
    assert_eq!(cache.bytes_outstanding(), 0, "vm {vm}");
    assert!(f.gpu.races().is_empty(), "vm {vm}: {:?}", f.gpu.races());
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: crate::support::regressions::beside_source(),
        ..ProptestConfig::with_cases(48)
    })]

    #[test]
    fn nothing_outside_a_capture_gets_the_graphs_memory(
        vm in any::<bool>(),
        before in proptest::collection::vec(step(), 0..12),
        during in proptest::collection::vec(step(), 0..12),
        after in proptest::collection::vec(step(), 0..16),
    ) {
        random_workload(vm, &before, &during, &after);
    }
}
