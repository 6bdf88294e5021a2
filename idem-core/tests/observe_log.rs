//! Without a `tracing` subscriber, `tracing`'s `log` fallback (its `log` feature, which sqlx turns
//! on) still prints the call's span to a `log` logger that lets DEBUG through: the engine drops a
//! disabled span only when nothing could come of it. Its own test binary, since the logger is
//! global to the process.
#![cfg(feature = "sqlite")]

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
    let span_lines = || {
        KEPT.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, message)| message.contains("idem.call"))
            .count()
    };

    log::set_max_level(log::LevelFilter::Info);
    let key = Key::derive("log", "", "at-info").unwrap();
    engine
        .call(key)
        .run(async { Ok::<_, Error>(1u32) })
        .await
        .unwrap();
    assert_eq!(span_lines(), 0, "nothing at INFO");

    log::set_max_level(log::LevelFilter::Trace);
    let key = Key::derive("log", "", "at-trace").unwrap();
    engine
        .call(key)
        .run(async { Ok::<_, Error>(2u32) })
        .await
        .unwrap();
    let kept = KEPT.0.lock().unwrap().clone();
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
