//! Snapshots, out-of-memory reports and their export (JSON, PyTorch's
//! memory-viewer pickle). The history, process-wide, has its own binary
//! (`observe_history.rs`).

use std::collections::BTreeMap;

use serde_pickle::{DeOptions, HashableValue, Value};
use streamalloc::ResourceBuilder;
use streamalloc::{
    AllocTag, AsyncResource, CacheConfig, Device, DeviceMemoryResource, ResourceError,
    gpu::sim::SimGpu,
};
use streamalloc::{BlockInfoState, OomReport};
use streamalloc::{Budget, GuardConfig};

const KIB: usize = 1 << 10;

#[tokio::test]
async fn a_snapshot_shows_every_live_block_with_its_tag_stream_and_age() {
    let device = Device::sim(&SimGpu::new(), 2);
    let budget = Budget::new(1 << 30);
    let res = AsyncResource::build(&device, &ResourceBuilder::new().budget(&budget)).unwrap();
    let (s0, s1) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    let w = res
        .allocate(300 * KIB, s0, AllocTag("weights"))
        .await
        .unwrap();
    let a = res.allocate(100 * KIB, s1, AllocTag("acts")).await.unwrap();

    let snap = res.snapshot();
    assert_eq!(snap.blocks.len(), 2);
    let wb = snap.blocks.iter().find(|b| b.address == w.ptr()).unwrap();
    assert_eq!((wb.size, wb.stream, wb.tag), (300 * KIB, 0, "weights"));
    assert_eq!(wb.state, BlockInfoState::Live);
    assert!(wb.age.is_some());
    let ab = snap.blocks.iter().find(|b| b.address == a.ptr()).unwrap();
    assert_eq!((ab.size, ab.stream, ab.tag), (100 * KIB, 1, "acts"));
    assert_eq!(
        snap.bytes_by_tag(),
        vec![("weights", 300 * KIB), ("acts", 100 * KIB)]
    );
    assert_eq!(snap.budgets.len(), 1);
    assert_eq!(snap.budgets[0].in_use, 400 * KIB);
    assert_eq!(snap.budgets[0].limit, 1 << 30);
    assert_eq!(snap.waiters.unwrap().waiting, 0);
    assert!(snap.pending_frees.is_empty());
    let (free, total) = snap.device_memory.unwrap();
    assert!(free < total);

    // Freed and reaped: gone, nothing pending.
    res.deallocate(w).unwrap().await.unwrap();
    res.deallocate(a).unwrap().await.unwrap();
    res.reap_pending().await.unwrap();
    let snap = res.snapshot();
    assert!(snap.blocks.is_empty() && snap.pending_frees.is_empty());
}

#[tokio::test]
async fn a_quarantined_block_shows_once_as_quarantined() {
    let device = Device::sim(&SimGpu::new(), 1);
    let layers = ResourceBuilder::new().debug_guard(GuardConfig::new().max_blocks(4));
    let res = AsyncResource::build(&device, &layers).unwrap();
    let s = device.stream(0).unwrap();
    let kept = res.allocate(4 * KIB, s, AllocTag("kept")).await.unwrap();
    let freed = res.allocate(8 * KIB, s, AllocTag("freed")).await.unwrap();
    let freed_at = freed.ptr();
    drop(res.deallocate(freed).unwrap());
    let snap = res.snapshot();
    assert_eq!(snap.blocks.len(), 2);
    let q = snap.blocks.iter().find(|b| b.address == freed_at).unwrap();
    assert_eq!(q.state, BlockInfoState::Quarantined);
    let k = snap
        .blocks
        .iter()
        .find(|b| b.address == kept.ptr())
        .unwrap();
    assert_eq!(k.state, BlockInfoState::Live);
    drop(res.deallocate(kept).unwrap());
}

#[tokio::test]
async fn a_budget_refusal_keeps_one_line_and_its_report_names_the_holders() {
    let device = Device::sim(&SimGpu::new(), 2);
    let budget = Budget::new(1024 * KIB);
    let res = AsyncResource::build(&device, &ResourceBuilder::new().budget(&budget)).unwrap();
    let (s0, s1) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    let w = res
        .allocate(512 * KIB, s0, AllocTag("weights"))
        .await
        .unwrap();
    let a = res.allocate(256 * KIB, s1, AllocTag("acts")).await.unwrap();
    let g = res
        .allocate(128 * KIB, s1, AllocTag("grads"))
        .await
        .unwrap();
    drop(res.deallocate(g).unwrap()); // pending until reaped

    let err = res.try_allocate(300 * KIB, s0, AllocTag("kv")).unwrap_err();
    assert!(matches!(err, ResourceError::BudgetExceeded { .. }), "{err}");
    assert!(!err.to_string().contains('\n'));

    let report = res.oom_report(&err).unwrap();
    assert_eq!(report.requested, 300 * KIB);
    assert_eq!(report.limit, Some(1024 * KIB));
    assert_eq!(report.held_by_callers, 768 * KIB);
    assert_eq!(
        report.top_tags,
        vec![("weights", 512 * KIB), ("acts", 256 * KIB)]
    );
    assert_eq!(report.free + report.pending_frees + 768 * KIB, 1024 * KIB);
    let text = report.to_string();
    assert!(text.lines().count() > 5, "{text}");
    assert!(text.contains("weights") && text.contains("frees pending"));

    // Not a memory error: no report.
    let other = ResourceError::Shutdown;
    assert!(res.oom_report(&other).is_none());
    assert!(OomReport::new(&other, &res.snapshot()).is_none());
    drop(res.deallocate(w).unwrap());
    drop(res.deallocate(a).unwrap());
}

#[tokio::test]
async fn a_device_out_of_memory_report_says_what_the_device_had() {
    let device = Device::sim(&SimGpu::builder().capacity(1 << 20).build(), 1);
    let res = AsyncResource::on(&device).unwrap();
    let s = device.stream(0).unwrap();
    let held = res.allocate(768 * KIB, s, AllocTag("held")).await.unwrap();
    let err = res
        .try_allocate(512 * KIB, s, AllocTag("more"))
        .unwrap_err();
    assert!(matches!(err, ResourceError::OutOfMemory { .. }), "{err}");
    let report = res.oom_report(&err).unwrap();
    assert_eq!(report.limit, None);
    assert_eq!(report.device_total, Some(1 << 20));
    assert_eq!(report.top_tags, vec![("held", 768 * KIB)]);
    assert!(report.to_string().contains("free on the device"));
    drop(res.deallocate(held).unwrap());
}

#[tokio::test]
async fn json_export_parses_back_with_every_section() {
    let device = Device::sim(&SimGpu::new(), 1);
    let res = AsyncResource::on(&device).unwrap();
    let s = device.stream(0).unwrap();
    let b = res
        .allocate(64 * KIB, s, AllocTag("weights"))
        .await
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&res.snapshot().to_json()).unwrap();
    for key in [
        "device",
        "time_us",
        "blocks",
        "segments",
        "pending_frees",
        "budgets",
        "waiters",
        "history",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert_eq!(json["blocks"][0]["tag"], "weights");
    assert_eq!(json["blocks"][0]["size"], 64 * KIB);
    assert_eq!(json["blocks"][0]["state"], "live");
    drop(res.deallocate(b).unwrap());
}

fn dict(v: &Value) -> BTreeMap<String, &Value> {
    let Value::Dict(d) = v else {
        panic!("not a dict: {v:?}")
    };
    d.iter()
        .map(|(k, v)| match k {
            HashableValue::String(s) => (s.clone(), v),
            other => panic!("a key that is not a str: {other:?}"),
        })
        .collect()
}

fn list(v: &Value) -> &Vec<Value> {
    match v {
        Value::List(l) => l,
        other => panic!("not a list: {other:?}"),
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::I64(i) => *i,
        other => panic!("not an int: {other:?}"),
    }
}

fn string(v: &Value) -> &str {
    match v {
        Value::String(s) => s,
        other => panic!("not a str: {other:?}"),
    }
}

/// The keys and types `torch.cuda._memory_viz` (`segsum`, `trace`,
/// `segment_plot`) and MemoryViz.js read, checked on the pickle read back.
#[tokio::test]
async fn torch_pickle_has_the_keys_and_types_the_memory_viewer_reads() {
    let device = Device::sim(&SimGpu::new(), 2);
    let res = AsyncResource::on(&device).unwrap();
    let (s0, s1) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    let a = res
        .allocate(64 * KIB, s0, AllocTag("weights"))
        .await
        .unwrap();
    let b = res.allocate(32 * KIB, s1, AllocTag("acts")).await.unwrap();

    let bytes = res.snapshot().to_torch_pickle();
    let value = serde_pickle::value_from_slice(&bytes, DeOptions::new()).unwrap();
    let top = dict(&value);
    let segments = list(top["segments"]);
    // No cache: each block is its own segment, as the driver's pool makes.
    assert_eq!(segments.len(), 2);
    for seg in segments {
        let seg = dict(seg);
        for key in [
            "device",
            "address",
            "total_size",
            "allocated_size",
            "active_size",
            "requested_size",
            "stream",
        ] {
            int(seg[key]);
        }
        string(seg["segment_type"]);
        assert!(matches!(seg["is_expandable"], Value::Bool(_)));
        assert!(matches!(seg["segment_pool_id"], Value::Tuple(_)));
        list(seg["frames"]);
        // The blocks tile the segment, as `segsum` asserts.
        let blocks = list(seg["blocks"]);
        let mut sum = 0;
        for block in blocks {
            let block = dict(block);
            int(block["address"]);
            int(block["requested_size"]);
            sum += int(block["size"]);
            assert_eq!(string(block["state"]), "active_allocated");
            list(block["frames"]);
        }
        assert_eq!(sum, int(seg["total_size"]));
        assert_eq!(int(seg["allocated_size"]), int(seg["total_size"]));
    }
    let sizes: Vec<i64> = segments
        .iter()
        .map(|s| int(dict(s)["total_size"]))
        .collect();
    assert!(sizes.contains(&(64 * KIB as i64)) && sizes.contains(&(32 * KIB as i64)));
    // One trace list per device up to this one (empty: the history is off
    // in this binary).
    let traces = list(top["device_traces"]);
    assert_eq!(traces.len(), 1);
    assert!(list(&traces[0]).is_empty());
    drop(res.deallocate(a).unwrap());
    drop(res.deallocate(b).unwrap());
}

#[test]
fn a_sync_stack_snapshots_through_the_trait() {
    let device = Device::simulated(&SimGpu::new(), 1);
    let budget = Budget::new(1 << 20);
    let stack = ResourceBuilder::new()
        .stats()
        .tracing()
        .retry_on_oom()
        .budget(&budget)
        .build(streamalloc::SimResource::new(&device));
    let s = device.stream(0).unwrap();
    let b = stack.allocate(4 * KIB, s, AllocTag("io")).unwrap();
    let mut snap = streamalloc::MemorySnapshot::new(0);
    stack.snapshot_into(&mut snap);
    assert_eq!(snap.blocks.len(), 1, "every decorator forwards");
    assert_eq!(snap.budgets.len(), 1);
    assert!(snap.waiters.is_none());
    // A free queued and not yet reaped (nothing reaps a synchronous stack
    // but its caller) shows as pending on its stream, and the block is
    // gone; at one instant, so with the bytes outstanding.
    let c = stack.allocate(8 * KIB, s, AllocTag("io")).unwrap();
    stack.deallocate(b).unwrap();
    let mut snap = streamalloc::MemorySnapshot::new(0);
    stack.snapshot_into(&mut snap);
    assert_eq!(snap.blocks.len(), 1);
    assert_eq!(snap.pending_frees.len(), 1);
    assert_eq!(
        (snap.pending_frees[0].stream, snap.pending_frees[0].bytes),
        (0, 4 * KIB)
    );
    assert_eq!(stack.bytes_outstanding(), 12 * KIB);
    stack.deallocate(c).unwrap();
    stack.reap_pending().unwrap();
    let mut snap = streamalloc::MemorySnapshot::new(0);
    stack.snapshot_into(&mut snap);
    assert!(snap.blocks.is_empty() && snap.pending_frees.is_empty());
}

const MIB: usize = 1 << 20;

/// The cache's part: its leases with the size asked and the size taken,
/// its arena's range with what is mapped and idle, and a report that
/// counts the idle memory.
#[tokio::test]
async fn a_snapshot_through_the_cache_shows_its_leases_and_idle_memory() {
    let device = Device::sim(&SimGpu::new(), 2);
    let budget = Budget::new(1 << 30);
    let layers = ResourceBuilder::new()
        .budget(&budget)
        .cache(CacheConfig::default());
    let res = AsyncResource::build(&device, &layers).unwrap();
    let s0 = device.stream(0).unwrap();
    let w = res
        .allocate(3 * MIB, s0, AllocTag("weights"))
        .await
        .unwrap();
    let mut acts = Vec::new();
    for _ in 0..3 {
        acts.push(res.allocate(MIB + 100, s0, AllocTag("acts")).await.unwrap());
    }
    for b in acts.drain(..2) {
        res.deallocate(b).unwrap().await.unwrap();
    }
    let snap = res.snapshot();
    let cache: Vec<_> = snap.blocks.iter().filter(|b| b.layer == "cache").collect();
    assert_eq!(cache.len(), 2, "{:?}", snap.blocks);
    let act = cache.iter().find(|b| b.tag == "acts").unwrap();
    assert_eq!(act.requested, MIB + 100);
    assert!(act.size >= MIB + 100);
    assert_eq!(
        snap.bytes_by_tag().iter().map(|t| t.0).collect::<Vec<_>>(),
        ["weights", "acts"]
    );
    let segs: Vec<_> = snap
        .segments
        .iter()
        .filter(|s| s.layer == "cache")
        .collect();
    assert_eq!(segs.len(), 1, "one arena: {:?}", snap.segments);
    let seg = segs[0];
    assert!(seg.mapped >= 4 * MIB, "{seg:?}");
    assert!(
        seg.idle >= 2 * MIB,
        "the freed blocks' memory is idle: {seg:?}"
    );
    assert!(seg.largest_idle <= seg.idle && seg.largest_idle > 0);
    assert!(seg.idle + 4 * MIB <= seg.mapped + seg.reserved);

    // The pickle: one expandable segment whose blocks tile it.
    let bytes = snap.to_torch_pickle();
    let value = serde_pickle::value_from_slice(&bytes, DeOptions::new()).unwrap();
    let top = dict(&value);
    let segments = list(top["segments"]);
    let arena = segments
        .iter()
        .map(dict)
        .find(|s| matches!(s["is_expandable"], Value::Bool(true)))
        .expect("the arena's segment");
    let blocks = list(arena["blocks"]);
    let sum: i64 = blocks.iter().map(|b| int(dict(b)["size"])).sum();
    assert_eq!(sum, int(arena["total_size"]));
    let states: Vec<String> = blocks
        .iter()
        .map(|b| string(dict(b)["state"]).to_string())
        .collect();
    assert_eq!(
        states.iter().filter(|s| *s == "active_allocated").count(),
        2
    );
    assert!(states.iter().any(|s| s == "inactive"));

    // A refusal's report counts what the cache holds idle.
    let err = ResourceError::OutOfMemory {
        requested: 64 * MIB,
        available: 0,
        stream: s0,
    };
    let report = res.oom_report(&err).unwrap();
    assert_eq!(report.idle_in_cache, seg.idle);
    assert_eq!(report.top_tags[0].0, "weights");
    drop(res.deallocate(w).unwrap());
    drop(res.deallocate(acts.pop().unwrap()).unwrap());
}

#[tokio::test]
async fn size_class_blocks_cached_idle_are_segments() {
    let device = Device::sim(&SimGpu::new(), 1);
    let layers = ResourceBuilder::new().cache(CacheConfig::default().virtual_memory(false));
    let res = AsyncResource::build(&device, &layers).unwrap();
    let s = device.stream(0).unwrap();
    let kept = res.allocate(64 * KIB, s, AllocTag("kept")).await.unwrap();
    let freed = res.allocate(100 * KIB, s, AllocTag("freed")).await.unwrap();
    let freed_at = freed.ptr();
    res.deallocate(freed).unwrap().await.unwrap();
    let snap = res.snapshot();
    let cache: Vec<_> = snap.blocks.iter().filter(|b| b.layer == "cache").collect();
    assert_eq!(cache.len(), 1);
    assert_eq!((cache[0].tag, cache[0].requested), ("kept", 64 * KIB));
    let idle: Vec<_> = snap
        .segments
        .iter()
        .filter(|s| s.address == freed_at)
        .collect();
    assert_eq!(idle.len(), 1, "{:?}", snap.segments);
    assert!(idle[0].idle >= 100 * KIB && idle[0].idle == idle[0].reserved);
    // Below the cache, the resource holds both class blocks.
    assert_eq!(
        snap.blocks.iter().filter(|b| b.layer == "resource").count(),
        2
    );
    assert_eq!(snap.bytes_by_tag(), vec![("kept", cache[0].size)]);
    drop(res.deallocate(kept).unwrap());
}
