//! Back-pressure a service can see: waiting is counted and traced as
//! waiting (not failing), the queue's length and oldest wait are readable,
//! and tags carry a request's identity while statistics group by kind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use streamalloc::adaptors::{Budget, Stats};
use streamalloc::builder::ResourceBuilder;
use streamalloc::futures::{AsyncResource, WAIT_TARGET};
use streamalloc::{AllocTag, Device, DeviceMemoryResource, ResourceError, SimGpu, Tag};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

const MIB: usize = 1 << 20;
const HANG: Duration = Duration::from_secs(20);

/// Stats over a budget of `limit` bytes, through the futures layer.
fn stack(
    limit: usize,
) -> (
    Device,
    Stats,
    AsyncResource<impl DeviceMemoryResource + 'static>,
) {
    let device = Device::sim(&SimGpu::new(), 1);
    let stats = Stats::new();
    let layers = ResourceBuilder::new()
        .tracing()
        .stats_with(&stats)
        .budget(&Budget::new(limit));
    let res = AsyncResource::build(&device, &layers).unwrap();
    (device, stats, res)
}

/// Yields until `f` holds (the simulator's device thread runs the frees).
async fn until(mut f: impl FnMut() -> bool) {
    tokio::time::timeout(HANG, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("never happened");
}

#[tokio::test]
async fn a_request_that_waits_is_counted_waited_not_failed() {
    let (device, stats, res) = stack(2 * MIB);
    let s = device.stream(0).unwrap();
    let first = res
        .allocate_buffer::<u8>(2 * MIB, s, AllocTag("input"))
        .await
        .unwrap();
    assert_eq!(res.queue_stats().waiting, 0);
    assert_eq!(res.oldest_wait(), None);

    let waiting = tokio::spawn({
        let res = res.clone();
        async move { res.allocate_buffer::<u8>(MIB, s, AllocTag("input")).await }
    });
    until(|| res.waiting_allocations() == 1).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let q = res.queue_stats();
    assert_eq!(q.waiting, 1);
    assert!(q.oldest_wait.unwrap() >= Duration::from_millis(5), "{q:?}");

    drop(first);
    let second = tokio::time::timeout(HANG, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let q = res.queue_stats();
    assert_eq!((q.waiting, q.served, q.failed, q.cancelled), (0, 1, 0, 0));
    assert!(q.wait_max >= Duration::from_millis(5) && q.wait_total == q.wait_max);

    let snap = stats.snapshot();
    let input = snap.tag(AllocTag("input")).unwrap();
    assert_eq!(
        input.failed_allocations, 0,
        "a wait counted as a failure:\n{snap}"
    );
    assert!(input.refused_tries >= 1, "{snap}");
    assert_eq!(input.waited, 1);
    assert!(input.wait_max_ns >= 5_000_000, "{snap}");
    assert_eq!(input.wait_mean_ns(), input.wait_total_ns);
    assert_eq!(input.total_blocks, 2);
    drop(second);
}

#[tokio::test]
async fn a_wait_dropped_by_its_deadline_is_counted_cancelled() {
    let (device, stats, res) = stack(MIB);
    let s = device.stream(0).unwrap();
    let held = res
        .allocate_buffer::<u8>(MIB, s, AllocTag("held"))
        .await
        .unwrap();
    let late = tokio::time::timeout(
        Duration::from_millis(10),
        res.allocate_buffer::<u8>(MIB, s, AllocTag("late")),
    )
    .await;
    assert!(late.is_err(), "served past a full budget");
    let q = res.queue_stats();
    assert_eq!((q.waiting, q.served, q.failed, q.cancelled), (0, 0, 0, 1));
    let snap = stats.snapshot();
    let late = snap.tag(AllocTag("late")).unwrap();
    assert_eq!(
        (late.cancelled_waits, late.failed_allocations, late.waited),
        (1, 0, 0)
    );
    drop(held);
}

#[tokio::test]
async fn a_refusal_that_is_not_waited_is_still_a_failure() {
    let (device, stats, res) = stack(MIB);
    let s = device.stream(0).unwrap();
    let held = res.try_allocate(MIB, s, AllocTag("a")).unwrap();
    // `try_allocate` does not wait: its refusal is a failure.
    assert!(matches!(
        res.inner().allocate(MIB, s, AllocTag("b")),
        Err(ResourceError::BudgetExceeded { .. })
    ));
    let snap = stats.snapshot();
    assert_eq!(snap.tag(AllocTag("b")).unwrap().failed_allocations, 1);
    assert_eq!(snap.tag(AllocTag("b")).unwrap().refused_tries, 0);
    drop(res.deallocate(held).unwrap());
}

#[tokio::test]
async fn tags_name_requests_and_stats_group_by_kind() {
    let (device, stats, res) = stack(8 * MIB);
    let s = device.stream(0).unwrap();
    let a = res
        .allocate_buffer::<u8>(MIB, s, Tag::for_request("input", "req-1"))
        .await
        .unwrap();
    let b = res
        .allocate_buffer::<u8>(MIB, s, Tag::for_request("input", String::from("req-2")))
        .await
        .unwrap();
    let tag = Tag::new("output").with_request("req-1");
    let r = res.reserve(&[MIB, MIB], s, &tag).await.unwrap();
    assert_eq!(r.tag(), &tag);
    assert_eq!(r.tag().request(), Some("req-1"));
    let snap = stats.snapshot();
    assert_eq!(snap.per_tag.len(), 2, "{snap}");
    assert_eq!(snap.tag(AllocTag("input")).unwrap().current_blocks, 2);
    assert_eq!(snap.tag(AllocTag("output")).unwrap().current_bytes, 2 * MIB);
    drop((a, b, r));
}

/// A span as captured: its name and fields (as text), updated by records.
#[derive(Debug, Clone, Default)]
struct SpanSeen {
    name: String,
    fields: HashMap<String, String>,
}

#[derive(Default)]
struct FieldText<'a>(Option<&'a mut HashMap<String, String>>);

impl Visit for FieldText<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if let Some(m) = self.0.as_mut() {
            m.insert(field.name().to_string(), format!("{value:?}"));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if let Some(m) = self.0.as_mut() {
            m.insert(field.name().to_string(), value.to_string());
        }
    }
}

/// Records the crate's spans and its WARN events.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<HashMap<u64, SpanSeen>>>,
    warnings: Arc<Mutex<Vec<String>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Capture {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target().starts_with("streamalloc")
    }
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut seen = SpanSeen {
            name: attrs.metadata().name().to_string(),
            ..SpanSeen::default()
        };
        attrs.record(&mut FieldText(Some(&mut seen.fields)));
        self.spans.lock().unwrap().insert(id.into_u64(), seen);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(seen) = self.spans.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut FieldText(Some(&mut seen.fields)));
        }
    }
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() == Level::WARN {
            self.warnings
                .lock()
                .unwrap()
                .push(format!("{:?}", event.metadata().name()));
        }
    }
}

#[test]
fn an_awaited_allocation_has_a_span_with_its_position_and_wait() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let (device, _stats, res) = stack(2 * MIB);
        let s = device.stream(0).unwrap();
        let first = res
            .allocate_buffer::<u8>(2 * MIB, s, AllocTag("a"))
            .await
            .unwrap();
        let mut waiters = Vec::new();
        for i in 0..2 {
            let r = res.clone();
            let tag = Tag::for_request("b", format!("req-{i}"));
            waiters.push(tokio::spawn(async move {
                r.allocate_buffer::<u8>(MIB, s, tag).await
            }));
            until(|| res.waiting_allocations() == i + 1).await;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        drop(first);
        for w in waiters {
            drop(
                tokio::time::timeout(HANG, w)
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap(),
            );
        }
    });
    let spans = capture.spans.lock().unwrap();
    let mut waits: Vec<&SpanSeen> = spans
        .values()
        .filter(|s| s.name == "alloc_wait" && s.fields.contains_key("position"))
        .collect();
    waits.sort_by_key(|s| s.fields["request"].clone());
    assert_eq!(waits.len(), 2, "{spans:?}");
    for (i, w) in waits.iter().enumerate() {
        assert_eq!(w.fields["request"], format!("req-{i}"));
        assert_eq!(w.fields["position"], i.to_string(), "{w:?}");
        assert_eq!(w.fields["outcome"], "served");
        assert_eq!(w.fields["tag"], "b");
        let ns: u64 = w.fields["wait_ns"].parse().unwrap();
        assert!(ns >= 2_000_000, "{w:?}");
    }
    assert!(WAIT_TARGET.starts_with("streamalloc"));
    let warnings = capture.warnings.lock().unwrap();
    assert!(
        warnings.is_empty(),
        "waiting logged as failing: {warnings:?}"
    );
}
