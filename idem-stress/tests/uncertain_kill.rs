//! Uncertain operations against a real provider (`idem_stress::charges`: an HTTP server on
//! loopback that charges once per provider key and answers look-ups, as Stripe's API does):
//! 1,000 orders charged by worker processes on PostgreSQL, each claimed with
//! `OnLapse::Uncertain`. One worker is SIGKILLed mid-charge; another is frozen (SIGSTOP) past
//! its lease, then resumed. Afterwards no order was sent to the provider twice (the provider's
//! own count of requests per key), and every order is completed — by its worker, by the
//! reconciler that asked the provider, or failed by it and run again by a retry — or, with the
//! reconciler off, listed as uncertain: none silently free.

use std::collections::BTreeSet;
use std::time::Duration;

use idem_core::{AbandonedQuery, Completer, CompleterConfig, Error, Idempotency};
use idem_sql::PostgresStore;
use idem_stress::charges::{self, charge_key, Client, Provider};
use idem_stress::worker::Worker;
use idem_test_support::postgres::{drop_tables, pg_url};
use idem_test_support::unique_name;

const WORKER: &str = env!("CARGO_BIN_EXE_idem-stress-worker");
const ORDERS: usize = 1000;
/// The claims' lease: short enough that a frozen worker's lapses in the test, long enough that
/// a loaded 2-core machine renews it in time.
const LEASE: Duration = Duration::from_secs(2);
/// Generous bounds for a loaded machine; the test never asserts speed.
const RUN: Duration = Duration::from_secs(300);

struct Scratch {
    url: String,
    table: String,
    pool: sqlx::PgPool,
}

impl Scratch {
    async fn new(url: String) -> Scratch {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&url)
            .await
            .expect("connect to the test server");
        Scratch {
            url,
            table: unique_name("idem_uncertain"),
            pool,
        }
    }

    async fn engine(&self) -> Idempotency {
        let store = PostgresStore::builder()
            .pruner(None)
            .table(&self.table)
            .from_pool(self.pool.clone())
            .await
            .expect("the store's table");
        Idempotency::builder(store)
            .lease(LEASE)
            .build()
            .expect("a valid policy")
    }

    fn worker(&self, name: &str, provider: &Provider, from: usize, to: usize) -> Worker {
        let args: Vec<String> = [
            "charge",
            "--url",
            &self.url,
            "--table",
            &self.table,
            "--provider",
            &provider.base,
            "--from",
            &from.to_string(),
            "--to",
            &to.to_string(),
            "--lease-ms",
            &LEASE.as_millis().to_string(),
            "--tasks",
            "16",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        Worker::spawn(name, WORKER, &args, &[])
    }

    async fn cleanup(self) {
        let migrations = format!("{}_migrations", self.table);
        let steps = format!("{}_steps", self.table);
        drop_tables(&self.pool, &[&self.table, &steps, &migrations]).await;
    }
}

/// Polls `done` every 20 ms, at most `within`; panics with `what` when it never comes true.
async fn until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the interrupted workers left: worker `a` charges orders 0..500 and is SIGKILLed once
/// the provider has seen 200 of its charges; worker `b` charges 500..1000, is frozen once the
/// provider has seen 200 of them, past its lease (its claims in flight lapse: retries meet them
/// uncertain and run nothing), then resumed, and finishes as a late holder.
async fn interrupted_workers(scratch: &Scratch, provider: &Provider, engine: &Idempotency) {
    // The table exists before the workers race to create it.
    drop(scratch.engine().await);
    let mut a = scratch.worker("a", provider, 0, ORDERS / 2);
    a.wait_for("ready", RUN).await;
    until("200 charges of worker a", RUN, || {
        provider.total_posts() >= 200
    })
    .await;
    a.kill9().await;

    let before_b = provider.total_posts();
    let mut b = scratch.worker("b", provider, ORDERS / 2, ORDERS);
    b.wait_for("ready", RUN).await;
    until("200 charges of worker b", RUN, || {
        provider.total_posts() >= before_b + 200
    })
    .await;
    b.pause().await;
    tokio::time::sleep(LEASE + LEASE / 2).await;
    // Its claims in flight lapsed: each is uncertain, and a retry runs nothing.
    let stalled = engine
        .uncertain(AbandonedQuery::first(10_000))
        .await
        .expect("list the uncertain operations");
    let client = Client::new(&provider.base);
    let posts = provider.total_posts();
    let mut met = 0;
    for i in ORDERS / 2..ORDERS {
        if !stalled.iter().any(|op| op.key == charge_key(i)) {
            continue;
        }
        match charges::charge(engine, &client, i, LEASE).await {
            Err(Error::Uncertain { operation, .. }) => assert_eq!(operation, charge_key(i)),
            other => panic!("order {i} of the frozen worker, retried: {other:?}"),
        }
        met += 1;
    }
    assert!(met > 0, "the frozen worker had no claim in flight");
    assert_eq!(
        provider.total_posts(),
        posts,
        "a retry of an uncertain order charged"
    );
    b.resume().await;
    let lines = b.finish(RUN).await;
    assert!(lines.iter().any(|l| l == "done"), "{lines:?}");
}

/// No order was sent to the provider twice.
fn charged_at_most_once(provider: &Provider) {
    let twice: Vec<_> = provider
        .posts()
        .into_iter()
        .filter(|(_, posts)| *posts > 1)
        .collect();
    assert!(twice.is_empty(), "orders charged twice: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciler_settles_every_interrupted_order_and_none_is_charged_twice() {
    let Some(url) = pg_url("uncertain_kill") else {
        return;
    };
    let scratch = Scratch::new(url).await;
    let provider = Provider::start().await;
    let engine = scratch.engine().await;
    interrupted_workers(&scratch, &provider, &engine).await;
    charged_at_most_once(&provider);

    // Past every lease, the completer asks the provider about each uncertain order.
    tokio::time::sleep(LEASE + LEASE / 2).await;
    let uncertain = engine
        .uncertain(AbandonedQuery::first(10_000))
        .await
        .expect("list the uncertain operations");
    assert!(
        !uncertain.is_empty(),
        "the killed worker left nothing uncertain"
    );
    let client = Client::new(&provider.base);
    let completer = Completer::new(engine.clone(), CompleterConfig::new().batch_size(1000))
        .expect("a valid config")
        .reconciler(charges::SCOPE, charges::reconciler(client.clone()));
    let report = completer.run_once().await.expect("a completer run");
    assert_eq!(report.uncertain, uncertain.len() as u64, "{report:?}");
    assert!(report.reconciled > 0, "{report:?}");
    // What the reconciler could not ask about (an order killed between its claim and storing
    // its input, so before its charge) is left uncertain, for an operator: listed, never
    // charged.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let left: BTreeSet<_> = engine
        .uncertain(AbandonedQuery::first(10_000))
        .await
        .expect("list the uncertain operations")
        .into_iter()
        .map(|op| op.key)
        .collect();
    assert_eq!(left.len() as u64, report.still_uncertain, "{report:?}");
    let posts = provider.posts();
    for k in &left {
        assert!(
            !posts.contains_key(&k.provider_key(Some("charge"))),
            "an order left uncertain had reached the provider"
        );
    }

    // Every client retries: a settled order replays (the reconciler's result is the
    // provider's charge), a failed one runs once, the rest replay their worker's result; an
    // order left uncertain is told so and does not run.
    let mut ids = BTreeSet::new();
    for i in 0..ORDERS {
        match charges::charge(&engine, &client, i, LEASE).await {
            Ok(out) => {
                ids.insert(out.into_inner());
            }
            Err(Error::Uncertain { operation, .. }) => assert!(left.contains(&operation)),
            Err(e) => panic!("order {i}, retried: {e}"),
        }
    }
    charged_at_most_once(&provider);
    assert_eq!(
        provider.posts().len(),
        ORDERS - left.len(),
        "every other order charged"
    );
    assert_eq!(provider.charged().len(), ORDERS - left.len());
    assert_eq!(
        ids.len(),
        ORDERS - left.len(),
        "each order has its own charge"
    );
    scratch.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_reconciler_every_interrupted_order_is_listed_and_none_runs_twice() {
    let Some(url) = pg_url("uncertain_kill") else {
        return;
    };
    let scratch = Scratch::new(url).await;
    let provider = Provider::start().await;
    let engine = scratch.engine().await;
    interrupted_workers(&scratch, &provider, &engine).await;
    tokio::time::sleep(LEASE + LEASE / 2).await;

    // Every client retries, with no reconciler: an interrupted order is uncertain, never run.
    let client = Client::new(&provider.base);
    let posts_before = provider.total_posts();
    let mut uncertain = BTreeSet::new();
    let mut charged = 0;
    for i in 0..ORDERS {
        match charges::charge(&engine, &client, i, LEASE).await {
            Ok(_) => charged += 1,
            Err(Error::Uncertain { operation, .. }) => {
                assert_eq!(operation, charge_key(i));
                uncertain.insert(operation);
            }
            Err(e) => panic!("order {i}, retried: {e}"),
        }
    }
    assert!(
        !uncertain.is_empty(),
        "the killed worker left nothing uncertain"
    );
    assert_eq!(charged + uncertain.len(), ORDERS);
    charged_at_most_once(&provider);
    // Only orders the workers never reached ran now; none that was interrupted did.
    let ran_now = provider.total_posts() - posts_before;
    assert!(ran_now as usize <= ORDERS - uncertain.len());
    // Each interrupted order is listed for an operator, and only those.
    let listed: BTreeSet<_> = engine
        .uncertain(AbandonedQuery::first(10_000))
        .await
        .expect("list the uncertain operations")
        .into_iter()
        .map(|op| op.key)
        .collect();
    assert_eq!(listed, uncertain);
    scratch.cleanup().await;
}
