//! The JetStream consumer against a real nats-server -js (IDEM_TEST_NATS_URL, started by
//! scripts/nats-server.sh; IDEM_REQUIRE_NATS=1 makes a missing server a failure), on SQLite:
//! three consumers with handlers slower than the ack wait, redelivery after the ack wait of a
//! message whose consumer died, and nak with a delay for a message in flight elsewhere.
#![cfg(feature = "nats")]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem::{Idempotency, Key, SqliteStore, Store};
use idem_consumer::nats::async_nats::{self, jetstream};
use idem_consumer::nats::NatsConsumer;
use idem_consumer::Consumer;
use tokio::sync::Semaphore;

mod support;
use support::AllAtOnce;

const ACK_WAIT: Duration = Duration::from_secs(1);

fn nats_url() -> Option<String> {
    idem_test_support::setting(
        &idem_test_support::current_test(),
        "IDEM_TEST_NATS_URL",
        "IDEM_REQUIRE_NATS",
    )
}

/// A stream of its own and a durable pull consumer on it with a 1 s ack wait.
async fn stream(
    url: &str,
) -> (
    jetstream::Context,
    String,
    jetstream::consumer::PullConsumer,
) {
    let client = async_nats::connect(url).await.unwrap();
    let js = jetstream::new(client);
    let name = idem_test_support::unique_name("orders").replace(['-', '.'], "_");
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
    let pull = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("charger".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            ..Default::default()
        })
        .await
        .unwrap();
    (js, name, pull)
}

async fn publish(js: &jetstream::Context, stream: &str, order: &str) {
    js.publish(format!("{stream}.orders"), order.to_owned().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// The business table; "slow" orders wait for the gate (or take 1.5 ack waits when `gate` is
/// None).
#[derive(Clone)]
struct Shop {
    charges: idem_test_support::Tally,
    gate: Option<Arc<Semaphore>>,
    started: Arc<Semaphore>,
}

impl Shop {
    fn new(gate: Option<Arc<Semaphore>>) -> Shop {
        Shop {
            charges: Default::default(),
            gate,
            started: Arc::new(Semaphore::new(0)),
        }
    }

    fn charged(&self, order: &str) -> u32 {
        self.charges.count(order)
    }

    fn handler(
        &self,
    ) -> impl Fn(
        async_nats::Message,
    )
        -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send>>
           + Clone
           + use<> {
        let shop = self.clone();
        move |m: async_nats::Message| {
            let shop = shop.clone();
            let order = String::from_utf8_lossy(&m.payload).into_owned();
            Box::pin(async move {
                shop.started.add_permits(1);
                if order.starts_with("slow") {
                    match &shop.gate {
                        Some(gate) => gate.acquire().await.unwrap().forget(),
                        None => tokio::time::sleep(ACK_WAIT * 3 / 2).await,
                    }
                }
                shop.charges.add(&order);
                Ok(format!("charged {order}"))
            })
        }
    }
}

async fn sqlite_at(path: &Path) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(path).await.unwrap())
}

/// A consumer keyed by the order in the payload (so a producer's second publish is caught).
fn nats_consumer(store: Arc<dyn Store>) -> NatsConsumer<idem::JsonCodec> {
    let consumer = Consumer::new(Idempotency::from_arc(store), "orders").unwrap();
    NatsConsumer::new(consumer)
        .ack_wait(ACK_WAIT)
        .wait(Duration::from_millis(500))
        .keyed_by(|m| Some(String::from_utf8_lossy(&m.payload).into_owned()))
}

/// Runs `consumers` on `pull` until every order is charged and nothing is pending or unacked
/// (bounded), then shuts them down.
async fn drain(
    consumers: Vec<NatsConsumer<idem::JsonCodec>>,
    pull: &jetstream::consumer::PullConsumer,
    shop: &Shop,
    orders: &[String],
) {
    let (stop, _) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for consumer in consumers {
        let (pull, handler, mut stopped) = (pull.clone(), shop.handler(), stop.subscribe());
        tasks.push(tokio::spawn(async move {
            consumer
                .run(&pull, handler, async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        }));
    }
    let mut drained = false;
    for _ in 0..600 {
        let info = pull.get_info().await.unwrap();
        if orders.iter().all(|o| shop.charged(o) >= 1)
            && info.num_pending == 0
            && info.num_ack_pending == 0
        {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.send_replace(true);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a consumer did not shut down")
            .unwrap();
    }
    assert!(drained, "not drained: {:?}", pull.get_info().await.unwrap());
    for order in orders {
        assert_eq!(shop.charged(order), 1, "{order}");
    }
}

/// A fetch asks for as many messages as the consumer runs at once (16 by default), and a batch
/// runs whole before the next fetch: 16 handlers run at once. Each waits (bounded) until all 16
/// have started; with fetches of 10, the default before, none would get there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_asks_for_the_consumers_concurrency() {
    const AT_ONCE: usize = 16;
    let Some(url) = nats_url() else { return };
    let (js, name, pull) = stream(&url).await;
    let orders: Vec<String> = (0..AT_ONCE).map(|i| format!("o{i}")).collect();
    for order in &orders {
        publish(&js, &name, order).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let consumer = nats_consumer(sqlite_at(&dir.path().join("idem.db")).await);
    let shop = AllAtOnce::new(AT_ONCE);
    let handler = {
        let shop = shop.clone();
        move |m: async_nats::Message| {
            let shop = shop.clone();
            async move {
                shop.meet(String::from_utf8_lossy(&m.payload).into_owned())
                    .await
            }
        }
    };
    let (stop, run) = support::spawn_run({
        let pull = pull.clone();
        move |shutdown| async move { consumer.run(&pull, handler, shutdown).await }
    });
    for _ in 0..600 {
        if shop.alone() > 0 || shop.each_once(&orders) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    support::stop(stop, run).await;
    assert_eq!(
        shop.alone(),
        0,
        "handlers waited in vain for {AT_ONCE} at once"
    );
    assert!(shop.each_once(&orders), "{:?}", shop.charges.snapshot());
}

/// 300 orders, 30 % published twice, 10 % of handlers taking 1.5 ack waits (kept by in-progress
/// acks), three consumers: every order charged exactly once, everything acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_consumers_charge_every_order_once() {
    let Some(url) = nats_url() else { return };
    let (js, name, pull) = stream(&url).await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_at(&dir.path().join("idem.db")).await;
    let mut orders = Vec::new();
    for i in 0..300 {
        let order = if i % 10 == 3 {
            format!("slow-{i}")
        } else {
            format!("o-{i}")
        };
        publish(&js, &name, &order).await;
        if i % 10 < 3 {
            publish(&js, &name, &order).await;
        }
        orders.push(order);
    }
    let shop = Shop::new(None);
    let consumers = (0..3).map(|_| nats_consumer(store.clone())).collect();
    drain(consumers, &pull, &shop, &orders).await;
}

/// A consumer dies with its handler running (its runtime torn down: no ack, no in-progress ack,
/// its claim left to expire): JetStream redelivers after the ack wait, and another consumer
/// charges the order once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_consumers_message_is_redelivered_after_the_ack_wait() {
    let Some(url) = nats_url() else { return };
    let (js, name, pull) = stream(&url).await;
    publish(&js, &name, "slow-1").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let held = Shop::new(Some(Arc::new(Semaphore::new(0))));
    let doomed = tokio::runtime::Runtime::new().unwrap();
    {
        let (pull, path, handler) = (pull.clone(), path.clone(), held.handler());
        doomed.spawn(async move {
            let consumer = nats_consumer(sqlite_at(&path).await);
            consumer.run(&pull, handler, std::future::pending()).await
        });
    }
    held.started.acquire().await.unwrap().forget();
    doomed.shutdown_background();
    let shop = Shop::new(None);
    let survivor = nats_consumer(sqlite_at(&path).await);
    drain(vec![survivor], &pull, &shop, &["slow-1".to_owned()]).await;
    assert_eq!(held.charged("slow-1"), 0);
}

/// A message whose twin is in flight elsewhere is nak'ed with a delay of `retry_after`: not
/// redelivered before it, then replayed once the other run stored its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_in_flight_elsewhere_is_nakked_with_a_delay() {
    let Some(url) = nats_url() else { return };
    let (js, name, pull) = stream(&url).await;
    publish(&js, &name, "o-1").await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_at(&dir.path().join("idem.db")).await;
    // Another process charges o-1 now.
    let elsewhere = Idempotency::from_arc(store.clone());
    let (release, claimed) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let holder = {
        let (release, claimed) = (release.clone(), claimed.clone());
        let key = Key::derive("orders", "", "o-1").unwrap();
        tokio::spawn(async move {
            elsewhere
                .call(key)
                .lease(Duration::from_secs(30))
                .run_detached(async move {
                    claimed.add_permits(1);
                    release.acquire().await.unwrap().forget();
                    Ok::<_, idem::Error>("charged o-1 elsewhere".to_owned())
                })
                .await
                .unwrap()
        })
    };
    claimed.acquire().await.unwrap().forget();
    let shop = Shop::new(None);
    let consumer = nats_consumer(store);
    let fetched = async {
        let mut batch = pull
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .unwrap();
        let mut out = Vec::new();
        while let Some(m) = futures_util::StreamExt::next(&mut batch).await {
            out.push(m.unwrap());
        }
        out
    };
    let outcomes = consumer.process(fetched.await, &shop.handler()).await;
    let retry_after = match &outcomes[0] {
        idem_consumer::MessageOutcome::InFlight { retry_after } => *retry_after,
        other => panic!("expected in flight, got {other:?}"),
    };
    // Not redelivered before the delay (the ack wait alone would not hold it back: 1 s).
    let early = pull
        .fetch()
        .max_messages(1)
        .expires(retry_after / 2)
        .messages()
        .await
        .unwrap();
    assert_eq!(
        futures_util::StreamExt::count(early).await,
        0,
        "redelivered before retry_after"
    );
    release.add_permits(1);
    holder.await.unwrap();
    drain(vec![consumer], &pull, &shop, &[]).await;
    assert_eq!(
        shop.charged("o-1"),
        0,
        "the handler ran although the other run stored its result"
    );
}

/// A message whose key was left uncertain by a consumer that died mid-charge: the redelivery
/// is `uncertain`, its handler does not run, and it is terminated (`AckKind::Term`: JetStream
/// stops redelivering it, and advisories tell the dead-letter handling), never redelivered
/// forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_message_is_terminated_not_redelivered() {
    let Some(url) = nats_url() else { return };
    let (js, name, pull) = stream(&url).await;
    publish(&js, &name, "o-dead").await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_at(&dir.path().join("idem.db")).await;
    let lease = Duration::from_millis(300);
    let dead = Idempotency::builder(store.clone())
        .lease(lease)
        .build()
        .unwrap();
    let key = Key::derive("orders", "", "o-dead").unwrap();
    let idem::CallClaim::Claimed(_) = dead
        .call(key)
        .on_lapse(idem::OnLapse::Uncertain)
        .claim()
        .await
        .unwrap()
    else {
        panic!("a new key is claimed")
    };
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let shop = Shop::new(None);
    let consumer = nats_consumer(store);
    let fetch = |wait: Duration| {
        let pull = pull.clone();
        async move {
            let mut batch = pull
                .fetch()
                .max_messages(1)
                .expires(wait)
                .messages()
                .await
                .unwrap();
            let mut out = Vec::new();
            while let Some(m) = futures_util::StreamExt::next(&mut batch).await {
                out.push(m.unwrap());
            }
            out
        }
    };
    let outcomes = consumer
        .process(fetch(Duration::from_secs(1)).await, &shop.handler())
        .await;
    assert_eq!(outcomes.len(), 1);
    assert_eq!(outcomes[0].as_str(), "uncertain");
    assert_eq!(shop.charged("o-dead"), 0, "an uncertain message ran");
    // Past its ack wait it does not come back: it was terminated.
    let again = fetch(ACK_WAIT * 2).await;
    assert!(again.is_empty(), "an uncertain message was redelivered");
}
