//! Tracing: events with their fields on every call, spans around reaps.
//! Alone in its test binary: tracing caches each callsite's interest
//! process-wide, and a test of another suite reaching a callsite with no
//! subscriber while none of these holds one can have it cached as never
//! wanted (seen with these tests in the adaptors binary).

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use streamalloc::DriverCall;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::{ALLOC_TARGET, TracingResource};
use streamalloc::{Access, AllocTag, DeviceMemoryResource};
use support::NoTracking;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One captured event: level, message, fields as text, enclosing span.
#[derive(Debug, Clone)]
struct Captured {
    level: Level,
    message: String,
    fields: HashMap<String, String>,
    span: Option<String>,
}

#[derive(Default)]
struct FieldText(HashMap<String, String>);

impl Visit for FieldText {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

/// A layer recording the crate's events up to `max` verbosity.
#[derive(Clone)]
struct Capture {
    max: Level,
    events: Arc<Mutex<Vec<Captured>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Capture {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // Decide per call: other tests run with other subscribers.
        Interest::sometimes()
    }
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target() == ALLOC_TARGET && *metadata.level() <= self.max
    }
    // As a subscriber filtered by level does: tracing's global maximum
    // level becomes `max`, which the layer reads to pass allocations and
    // frees through untouched when no subscriber wants even warnings (so
    // at `max` = WARN, failures must still be logged).
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::from_level(self.max))
    }
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = FieldText::default();
        event.record(&mut fields);
        let mut fields = fields.0;
        self.events.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            message: fields.remove("message").unwrap_or_default(),
            fields,
            span: ctx.event_span(event).map(|s| s.name().to_string()),
        });
    }
}

/// Tests of this file run one at a time: tracing caches each callsite's
/// interest globally, and a callsite first reached by a test without a
/// subscriber, while another test installs one, can be cached as "never".
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn capture<T>(max: Level, f: impl FnOnce() -> T) -> (T, Vec<Captured>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let layer = Capture {
        max,
        events: events.clone(),
    };
    let subscriber = tracing_subscriber::registry().with(layer);
    let out = tracing::subscriber::with_default(subscriber, || {
        // Forget interests cached before this subscriber existed.
        tracing::callsite::rebuild_interest_cache();
        f()
    });
    let events = events.lock().unwrap().clone();
    (out, events)
}

fn find<'a>(events: &'a [Captured], message: &str) -> &'a Captured {
    events
        .iter()
        .find(|e| e.message == message)
        .unwrap_or_else(|| panic!("no {message:?} event in {events:#?}"))
}

#[test]
fn bad_input_changes_nothing() {
    let _serial = serial();
    support::check_bad_input(TracingResource::new, |_| ());
}

#[test]
fn forwards_what_it_does_not_change() {
    let _serial = serial();
    support::check_forwarding(TracingResource::new, |_| {});
    let f = support::sim(1);
    assert!(!TracingResource::new(NoTracking(f.resource.clone())).supports_block_use_tracking());
}

#[test]
fn allocate_and_deallocate_emit_events_with_their_fields() {
    let _serial = serial();
    let f = support::sim(2);
    let r = TracingResource::new(f.resource.clone());
    let (a, b) = (f.stream(0), f.stream(1));
    let gpu = f.sim.clone().unwrap();
    let (block, events) = capture(Level::TRACE, || {
        let block = r.allocate(4096, a, AllocTag("kv-cache")).unwrap();
        r.prepare_block_use(block.id(), b, Access::Read).unwrap();
        gpu.launch_kernel(f.pool.raw(b).unwrap(), &[MemAccess::read(&block)])
            .unwrap();
        r.finish_block_use(block.id(), b, Access::Read).unwrap();
        r.deallocate(block.clone()).unwrap();
        block
    });

    let alloc = find(&events, "allocate");
    assert_eq!(alloc.level, Level::DEBUG);
    assert_eq!(alloc.fields["bytes"], "4096");
    assert_eq!(alloc.fields["stream"], a.to_string());
    assert_eq!(alloc.fields["tag"], "kv-cache");
    assert_eq!(alloc.fields["address"], block.ptr().to_string());
    assert_eq!(alloc.fields["device"], "0");
    assert_eq!(alloc.fields["block"], block.id().to_string());
    assert!(alloc.fields.contains_key("elapsed_ns"));

    let free = find(&events, "deallocate");
    assert_eq!(free.fields["bytes"], "4096");
    assert_eq!(free.fields["address"], block.ptr().to_string());
    assert!(free.fields.contains_key("elapsed_ns"));

    for hook in ["prepare_block_use", "finish_block_use"] {
        let e = find(&events, hook);
        assert_eq!(e.level, Level::TRACE);
        assert_eq!(e.fields["stream"], b.to_string());
        assert_eq!(e.fields["access"], "read");
        assert_eq!(e.fields["block"], block.id().to_string());
    }
}

#[test]
fn reaps_run_in_a_span_and_report_what_drained() {
    let _serial = serial();
    let f = support::sim(1);
    let r = TracingResource::new(f.resource.clone());
    let gpu = f.sim.clone().unwrap();
    let s = f.stream(0);
    let ((), events) = capture(Level::TRACE, || {
        let block = r.allocate(1000, s, AllocTag::UNTAGGED).unwrap();
        r.deallocate(block).unwrap();
        r.reap_pending().unwrap();
        let block = r.allocate(500, s, AllocTag::UNTAGGED).unwrap();
        r.deallocate(block).unwrap();
        let seq = r.pending_free_seq(s);
        gpu.run_until_idle();
        assert_eq!(r.reap_through(s, seq), 500);
    });
    let reaped = find(&events, "reaped");
    assert_eq!(reaped.span.as_deref(), Some("reap_pending"));
    assert_eq!(reaped.fields["bytes"], "1000");
    let through = find(&events, "reap_through");
    assert_eq!(through.fields["bytes"], "500");
    assert_eq!(through.fields["stream"], s.to_string());
}

#[test]
fn failures_are_warnings_and_successes_are_silent_at_warn() {
    let _serial = serial();
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let r = TracingResource::new(f.resource.clone());
    let ((), events) = capture(Level::WARN, || {
        let block = r.allocate(64, f.stream(0), AllocTag("w")).unwrap();
        r.deallocate(block.clone()).unwrap();
        assert!(r.deallocate(block).is_err());
        gpu.fail_nth(DriverCall::AllocAsync, 1);
        assert!(r.allocate(64, f.stream(0), AllocTag("w")).is_err());
    });
    let messages: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(messages, ["deallocate failed", "allocate failed"]);
    assert!(events.iter().all(|e| e.level == Level::WARN));
    assert!(events[0].fields["error"].contains("already deallocated"));
    assert_eq!(events[1].fields["bytes"], "64");
}

#[test]
fn without_a_subscriber_that_wants_warnings_calls_pass_through_unchanged() {
    let _serial = serial();
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let r = TracingResource::new(f.resource.clone());
    let s = f.stream(0);
    // Only errors wanted: the layer only forwards, failures included.
    let ((), events) = capture(Level::ERROR, || {
        assert!(!tracing::enabled!(target: ALLOC_TARGET, Level::WARN));
        let block = r.allocate(64, s, AllocTag("e")).unwrap();
        assert_eq!(block.size(), 64);
        r.deallocate(block.clone()).unwrap();
        assert!(matches!(
            r.deallocate(block),
            Err(streamalloc::ResourceError::DoubleFree { .. })
        ));
        gpu.fail_nth(DriverCall::AllocAsync, 1);
        assert!(r.allocate(64, s, AllocTag("e")).is_err());
    });
    assert!(events.is_empty(), "{events:#?}");
    // The same calls with warnings wanted log both failures.
    let ((), events) = capture(Level::WARN, || {
        let block = r.allocate(64, s, AllocTag("w")).unwrap();
        r.deallocate(block.clone()).unwrap();
        assert!(r.deallocate(block).is_err());
        gpu.fail_nth(DriverCall::AllocAsync, 1);
        assert!(r.allocate(64, s, AllocTag("w")).is_err());
    });
    let messages: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(messages, ["deallocate failed", "allocate failed"]);
}
