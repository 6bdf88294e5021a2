//! idem's histograms through the real Prometheus exporter, with the buckets idem recommends:
//! each renders as a histogram (`_bucket` series at exactly the recommended bounds), none as a
//! summary (`quantile`), which is what the exporter renders for a histogram without buckets.
#![cfg(feature = "metrics")]

use idem::{Error, Idempotency, Key, MemoryStore, PROMETHEUS_BUCKETS};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

#[tokio::test]
async fn idem_histograms_render_as_histograms_with_the_recommended_buckets() {
    let mut prometheus = PrometheusBuilder::new();
    for (name, bounds) in PROMETHEUS_BUCKETS {
        prometheus = prometheus
            .set_buckets_for_metric(Matcher::Full(name.to_string()), bounds)
            .unwrap();
    }
    // The only test of this binary: the global recorder is its own.
    let metrics = prometheus.install_recorder().unwrap();

    let engine = Idempotency::builder(MemoryStore::new())
        .sample_latencies(1)
        .build()
        .unwrap();
    let key = Key::derive("charge", "", "order-1").unwrap();
    for _ in 0..2 {
        let out = engine
            .call(key)
            .scope("charge")
            .run(async { Ok::<_, Error>(7) })
            .await
            .unwrap();
        assert_eq!(out.into_inner(), 7);
    }

    let text = metrics.render();
    assert!(
        !text.contains("quantile"),
        "a summary was rendered:\n{text}"
    );
    for (name, bounds) in PROMETHEUS_BUCKETS {
        assert!(
            text.contains(&format!("# TYPE {name} histogram")),
            "{name} is not a histogram:\n{text}"
        );
        let les: Vec<f64> = text
            .lines()
            .filter(|line| line.starts_with(&format!("{name}_bucket{{")))
            .filter_map(|line| line.split("le=\"").nth(1)?.split('"').next())
            .filter(|le| *le != "+Inf")
            .map(|le| le.parse().unwrap())
            .collect();
        assert_eq!(les, *bounds, "{name}'s buckets:\n{text}");
    }
}
