//! The tracing span of a guarded call: its fields, and what it never shows. In a test binary of
//! its own, so no other test's thread registers tracing's callsites without a subscriber while
//! this one runs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use idem_core::{Error, Idempotency, Key, MemoryStore};

/// Runs `body` on a current-thread runtime with `subscriber` as this thread's default.
fn under(subscriber: impl tracing::Subscriber + Send + Sync, body: impl std::future::Future) {
    tracing::subscriber::with_default(subscriber, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(body);
    });
}

/// Whatever a tracing subscriber receives: span names with their fields, and event fields.
#[derive(Default, Clone)]
struct Captured(Arc<Mutex<Vec<Record>>>);

/// A span's name and fields, or `event <target>` and the event's fields.
type Record = (String, BTreeMap<String, String>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S> tracing_subscriber::Layer<S> for Captured
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<BTreeMap<String, String>>()
        {
            values.record(&mut Fields(fields));
        }
    }

    fn on_close(&self, id: tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions()
                .get::<BTreeMap<String, String>>()
                .cloned()
                .unwrap_or_default();
            self.0
                .lock()
                .unwrap()
                .push((span.name().to_owned(), fields));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .unwrap()
            .push((format!("event {}", event.metadata().target()), fields));
    }
}

/// One span per guarded call with its scope, a short hash of its key and its outcome; the raw
/// client key and the response appear nowhere in what the subscriber receives.
#[test]
fn spans_carry_scope_short_key_and_outcome_never_the_key_or_response() {
    use tracing_subscriber::layer::SubscriberExt;
    const CLIENT_KEY: &str = "client-key-7f3a9c";
    const RESPONSE: &str = "response-body-5be21d";
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let key = Key::derive("charge", "tenant-1", CLIENT_KEY).unwrap();
    under(subscriber, async {
        let engine = Idempotency::builder(MemoryStore::new())
            .max_response_bytes(64)
            .build()
            .unwrap();
        for _ in 0..2 {
            engine
                .call(key)
                .scope("charge")
                .run(async { Ok::<_, Error>(RESPONSE.to_owned()) })
                .await
                .unwrap();
        }
        // Not retained: the path that logs a warning with its reason.
        let big = Key::derive("charge", "tenant-1", "big").unwrap();
        let body = format!("{RESPONSE}{}", "x".repeat(100));
        engine
            .call(big)
            .scope("charge")
            .run(async { Ok::<_, Error>(body) })
            .await
            .unwrap();
    });
    let records = captured.0.lock().unwrap().clone();
    let spans: Vec<&BTreeMap<String, String>> = records
        .iter()
        .filter(|(name, _)| name == "idem.call")
        .map(|(_, fields)| fields)
        .collect();
    assert_eq!(spans.len(), 3, "one span per call: {records:?}");
    let short: String = key.to_string()[..16].to_owned();
    let outcomes: Vec<&str> = spans.iter().map(|f| f["outcome"].as_str()).collect();
    assert_eq!(outcomes, ["completed", "replayed", "not_retained"]);
    for fields in &spans[..2] {
        assert_eq!(fields["scope"], "charge");
        assert_eq!(fields["key"], short);
    }
    assert!(
        records
            .iter()
            .any(|(name, f)| name.starts_with("event")
                && f.get("op").is_some_and(|op| op == "claim")),
        "the store round trips are events: {records:?}"
    );
    let all = format!("{records:?}");
    assert!(
        !all.contains(CLIENT_KEY),
        "the raw client key leaked: {all}"
    );
    assert!(!all.contains(RESPONSE), "the response leaked: {all}");
}

/// Everything a JSON subscriber writes, line by line.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// With tracing-subscriber's JSON output at DEBUG, every line is JSON and the store round trips
/// carry the call's span with its scope and short key.
#[test]
fn json_output_shows_the_call_span() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::DEBUG)
        .with_current_span(true)
        .with_writer(move || writer.clone())
        .finish();
    let key = Key::derive("charge", "tenant-1", "client-key-1").unwrap();
    under(subscriber, async {
        let engine = Idempotency::new(MemoryStore::new());
        engine
            .call(key)
            .scope("charge")
            .run(async { Ok::<_, Error>(1) })
            .await
            .unwrap();
    });
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let claim = events
        .iter()
        .find(|e| e["fields"]["op"] == "claim")
        .unwrap_or_else(|| panic!("no claim event: {text}"));
    assert_eq!(claim["span"]["name"], "idem.call");
    assert_eq!(claim["span"]["scope"], "charge");
    assert_eq!(claim["span"]["key"], key.to_string()[..16]);
    assert!(!text.contains("client-key-1"));
}
