//! The span of an awaited allocation: its queue position, its request and
//! its wait. Alone in its test binary: tracing caches each callsite's
//! interest process-wide, and a test without a subscriber reaching the
//! span first could have it cached as never wanted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use streamalloc::Budget;
use streamalloc::ResourceBuilder;
use streamalloc::{AllocTag, Device, DeviceMemoryResource, Tag, gpu::sim::SimGpu};
use streamalloc::{AsyncResource, WAIT_TARGET};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

const MIB: usize = 1 << 20;
const HANG: Duration = Duration::from_secs(20);

/// Tracing over a budget of `limit` bytes, through the futures layer.
fn stack(limit: usize) -> (Device, AsyncResource<impl DeviceMemoryResource + 'static>) {
    let device = Device::sim(&SimGpu::new(), 1);
    let layers = ResourceBuilder::new().tracing().budget(&Budget::new(limit));
    let res = AsyncResource::build(&device, &layers).unwrap();
    (device, res)
}

/// Yields until `f` holds.
async fn until(mut f: impl FnMut() -> bool) {
    tokio::time::timeout(HANG, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("never happened");
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
        let (device, res) = stack(2 * MIB);
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
