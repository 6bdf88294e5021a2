//! Without a `tracing` subscriber, `tracing`'s `log` fallback (its `log` feature, which sqlx turns
//! on) still prints the call's span to a `log` logger that lets DEBUG through: the engine drops a
//! disabled span only when nothing could come of it. Its own test binary, since the logger is
//! global to the process.

use std::sync::Mutex;

use idem_core::{Error, Idempotency, Key, MemoryStore};

/// Keeps the target and message of every record.
struct Kept(Mutex<Vec<(String, String)>>);

impl log::Log for Kept {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let line = (record.target().to_owned(), record.args().to_string());
        self.0.lock().unwrap().push(line);
    }

    fn flush(&self) {}
}

static KEPT: Kept = Kept(Mutex::new(Vec::new()));

#[tokio::test(flavor = "current_thread")]
async fn the_span_reaches_a_log_logger_only_when_it_lets_debug_through() {
    log::set_logger(&KEPT).unwrap();
    let engine = Idempotency::new(MemoryStore::new());
    // One new key through the engine at `level`; the lines kept meanwhile.
    let call_at = |level: log::LevelFilter, client_key: &'static str| {
        log::set_max_level(level);
        KEPT.0.lock().unwrap().clear();
        let key = Key::derive("log", "", client_key).unwrap();
        let call = engine.call(key).run(async { Ok::<_, Error>(1u32) });
        async move {
            call.await.unwrap();
            KEPT.0.lock().unwrap().clone()
        }
    };

    let kept = call_at(log::LevelFilter::Info, "at-info").await;
    assert!(
        !kept.iter().any(|(_, m)| m.contains("idem.call")),
        "nothing at INFO: {kept:?}"
    );

    let kept = call_at(log::LevelFilter::Trace, "at-trace").await;
    assert!(
        kept.iter()
            .any(|(_, m)| m.starts_with("idem.call;") && m.contains("key=")),
        "the span's creation line, with its fields: {kept:?}"
    );
    assert!(
        kept.iter().any(|(_, m)| m.starts_with("-> idem.call")),
        "the span's enter line: {kept:?}"
    );
}
