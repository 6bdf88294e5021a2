//! DynamoStore against a DynamoDB-compatible server (moto under `scripts/test`): what the shared
//! conformance suite cannot show. The clock-skew bound with two nodes whose clocks differ, the
//! 400 KB item rule, the requests each call costs, stale owners on real time, typed failures
//! (server stopped, restarted, missing table, malformed item, bad names) and the table helper.
//!
//! Every test uses a fresh table; the tests that stop a server start one of their own with
//! `IDEM_DYNAMODB_SERVER_CMD`.
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use idem_core::{
    Claim, ClaimOutcome, ClaimRequest, Clock, Completion, Error, Idempotency, Key, ManualClock,
    Outcome, RecordState, Store, StoreErrorKind,
};
use idem_dynamodb::aws_sdk_dynamodb::primitives::Blob;
use idem_dynamodb::aws_sdk_dynamodb::types::{AttributeValue, TimeToLiveStatus};
use idem_dynamodb::DynamoStore;

use idem_test_support::dynamodb::{
    client, config, counted_client, dynamo_url, fresh_store, fresh_table, LoseAnAnswer, Requests,
    Server,
};

const LONG: Duration = Duration::from_secs(30);

fn url() -> Option<String> {
    dynamo_url(&idem_test_support::current_test())
}

fn key(name: &str) -> Key {
    Key::derive("dynamodb", "", name).unwrap()
}

fn done(bytes: &'static [u8], retention: Duration) -> Completion<'static> {
    Completion {
        response: Some(bytes),
        is_error: false,
        retention,
        key_retention: Duration::ZERO,
    }
}

async fn claim(store: &DynamoStore, k: &Key, lease: Duration) -> Claim {
    match store.claim(ClaimRequest::new(k, lease)).await.unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

fn kind(e: &Error) -> Option<StoreErrorKind> {
    match e {
        Error::Store(s) => Some(s.kind()),
        _ => None,
    }
}

/// A node's clock: a shared manual clock, `ahead` in front of it.
#[derive(Clone)]
struct Skewed {
    base: ManualClock,
    ahead: Duration,
}

impl Clock for Skewed {
    fn now(&self) -> SystemTime {
        self.base.now() + self.ahead
    }
}

/// Two nodes on one table: `a` on the true clock, `b` with its clock `ahead`, both with `margin`.
async fn two_nodes(
    url: &str,
    margin: Duration,
    ahead: Duration,
) -> (ManualClock, DynamoStore, DynamoStore) {
    let base = ManualClock::new();
    let a = fresh_store(url, |b| {
        b.clock_skew_margin(margin).clock(Skewed {
            base: base.clone(),
            ahead: Duration::ZERO,
        })
    })
    .await;
    let b = DynamoStore::builder()
        .table(a.table())
        .clock_skew_margin(margin)
        .clock(Skewed {
            base: base.clone(),
            ahead,
        })
        .build(client(url))
        .await
        .unwrap();
    (base, a, b)
}

/// **Within the margin, fencing holds**: node B's clock is 1.9 s ahead of A's and the margin is
/// 2 s. Up to the last millisecond of A's 10 s lease (by A's clock) B is Locked; A's work
/// completes and B replays it. Only once the lease has ended by A's clock, plus what is left of
/// the margin after the skew, can B take over a crashed owner's key.
#[tokio::test]
async fn skew_within_the_margin_never_takes_over_a_live_lease() {
    let Some(url) = url() else { return };
    let margin = Duration::from_secs(2);
    let (clock, a, b) = two_nodes(&url, margin, Duration::from_millis(1900)).await;
    let lease = Duration::from_secs(10);

    let k = key("within");
    let owner = claim(&a, &k, lease).await;
    let claimed_at = clock.now();
    for at in [Duration::ZERO, lease / 2, lease - Duration::from_millis(1)] {
        clock.advance(at - clock.now().duration_since(claimed_at).unwrap());
        assert!(
            matches!(
                b.claim(ClaimRequest::new(&k, LONG)).await.unwrap(),
                ClaimOutcome::Locked { .. }
            ),
            "B took over A's live lease {at:?} into it"
        );
    }
    a.complete(&owner, done(b"a's result", LONG)).await.unwrap();
    let ClaimOutcome::Completed(cached) = b.claim(ClaimRequest::new(&k, LONG)).await.unwrap()
    else {
        panic!("B must replay A's result");
    };
    assert_eq!(cached.response.as_deref(), Some(&b"a's result"[..]));

    // A crashed owner: its key frees for B at lease + margin - skew after the claim (by A's
    // clock), i.e. 0.1 s after the lease, and not a millisecond before.
    let k = key("crashed");
    let crashed = claim(&a, &k, lease).await;
    clock.advance(lease + Duration::from_millis(99));
    assert!(matches!(
        b.claim(ClaimRequest::new(&k, LONG)).await.unwrap(),
        ClaimOutcome::Locked { .. }
    ));
    clock.advance(Duration::from_millis(2));
    claim(&b, &k, LONG).await;
    assert!(matches!(
        a.complete(&crashed, done(b"late", LONG)).await,
        Err(Error::LeaseLost)
    ));
}

/// **Beyond the margin, it does not**, as documented: node B's clock is 2.5 s ahead with a 2 s
/// margin, so B takes over A's lease 0.5 s before it ends by A's clock. A's completion is then
/// fenced (`LeaseLost`), so the double run is at least reported.
#[tokio::test]
async fn skew_beyond_the_margin_takes_over_early_as_documented() {
    let Some(url) = url() else { return };
    let (clock, a, b) = two_nodes(&url, Duration::from_secs(2), Duration::from_millis(2500)).await;
    let lease = Duration::from_secs(10);
    let k = key("beyond");
    let owner = claim(&a, &k, lease).await;
    clock.advance(lease - Duration::from_millis(499));
    // A still holds a live lease by its own clock...
    assert!(matches!(
        a.get(&k).await.unwrap().map(|r| r.state),
        Some(RecordState::InProgress { .. })
    ));
    // ...but B, 0.5 s past the margin, takes it over: the documented failure.
    let thief = claim(&b, &k, LONG).await;
    assert!(matches!(
        a.complete(&owner, done(b"a", LONG)).await,
        Err(Error::LeaseLost)
    ));
    b.complete(&thief, done(b"b", LONG)).await.unwrap();
}

/// A 500 KB result is more than DynamoDB's 400 KB item limit: the caller gets it, the key
/// completes as "result not retained", and retries are told so and never run the work again
/// (the conformance suite's unretained-result rule, at the store's limit instead of the
/// engine's).
#[tokio::test]
async fn a_result_over_400_kb_is_returned_once_and_never_reruns() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, |b| b).await;
    let engine = Idempotency::new(store.clone());
    let k = key("big");
    let reason =
        idem_core::conformance::unretained_result_never_reruns(&engine, k, 500 * 1024).await;
    assert!(
        reason.contains("more than the store keeps in a record (399730)"),
        "{reason}"
    );
    let Some(RecordState::Completed(cached)) = store.get(&k).await.unwrap().map(|r| r.state) else {
        panic!("the key completed");
    };
    assert!(matches!(
        cached.result(),
        Err(Error::ResultNotRetained { .. })
    ));
}

/// A claim whose answer was lost (a timeout, a 5xx) is sent again by the SDK; the first copy
/// was written, so the second meets the item the first wrote, with this very attempt's token:
/// that is this claim, not a twin in flight. Without it the call would be told its own key is
/// locked, and the key held by a claim nobody has until its lease ends.
#[tokio::test]
async fn a_claim_whose_answer_was_lost_is_still_claimed() {
    let Some(url) = url() else { return };
    let lose = LoseAnAnswer::default();
    let client = idem_dynamodb::aws_sdk_dynamodb::Client::from_conf(
        config(&url).interceptor(lose.clone()).build(),
    );
    let store = DynamoStore::builder()
        .table(fresh_table())
        .create_table_if_missing(true)
        .build(client)
        .await
        .unwrap();
    let k = key("lost-answer");
    lose.arm(&["PutItem"]);
    let claimed = claim(&store, &k, LONG).await;
    assert_eq!(
        lose.lost(),
        ["PutItem"],
        "the claim's answer was lost and the put sent again"
    );
    store
        .complete(&claimed, done(b"charged", LONG))
        .await
        .unwrap();
    match store.claim(ClaimRequest::new(&k, LONG)).await.unwrap() {
        ClaimOutcome::Completed(record) => {
            assert_eq!(record.response.as_deref(), Some(&b"charged"[..]))
        }
        other => panic!("expected the completed record, got {other:?}"),
    }
}

/// Only the engine keeps "not retained": the raw store refuses a response one byte over its
/// `max_response_bytes`, typed, and writes nothing (the claim stays held); one of exactly that
/// size makes an item DynamoDB takes, and replays whole.
#[tokio::test]
async fn a_raw_completion_over_the_item_limit_is_refused_and_writes_nothing() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, |b| b).await;
    let most = store
        .max_response_bytes()
        .expect("DynamoDB has an item limit");
    let k = key("raw-over-the-limit");
    let held = claim(&store, &k, LONG).await;
    let over = vec![1u8; most + 1];
    let refused = store
        .complete(
            &held,
            Completion {
                response: Some(&over),
                is_error: false,
                retention: LONG,
                key_retention: Duration::ZERO,
            },
        )
        .await;
    assert!(
        matches!(&refused, Err(Error::Store(e)) if e.kind() == StoreErrorKind::Query
            && e.to_string().contains(&format!("at most {most} bytes"))),
        "{refused:?}"
    );
    let record = store.get(&k).await.unwrap().expect("still claimed");
    assert!(
        matches!(record.state, RecordState::InProgress { token, .. } if token == held.token()),
        "{record:?}"
    );
    let fits = vec![2u8; most];
    store
        .complete(
            &held,
            Completion {
                response: Some(&fits),
                is_error: false,
                retention: LONG,
                key_retention: Duration::ZERO,
            },
        )
        .await
        .expect("a response of exactly max_response_bytes makes an item DynamoDB takes");
    let Some(RecordState::Completed(kept)) = store.get(&k).await.unwrap().map(|r| r.state) else {
        panic!("the key completed");
    };
    assert_eq!(kept.response.as_deref(), Some(&fits[..]));
}

/// A result just under the limit is stored and replayed whole.
#[tokio::test]
async fn a_result_under_400_kb_replays() {
    let Some(url) = url() else { return };
    let engine = Idempotency::new(fresh_store(&url, |b| b).await);
    let k = key("fits");
    let value = "y".repeat(390 * 1024);
    let first = engine
        .call(k)
        .run(async { Ok::<_, Error>(value.clone()) })
        .await
        .unwrap();
    assert!(!first.is_replayed());
    let again = engine
        .call(k)
        .run(async { Ok::<_, Error>(String::new()) })
        .await
        .unwrap();
    assert_eq!(again, Outcome::Replayed(value));
}

fn only(op: &str) -> HashMap<String, usize> {
    Requests::only(op, 1)
}

/// **Round trips**: a new key is one PutItem to claim and one UpdateItem to complete; a
/// duplicate (locked, replay, key reused) is the same one PutItem, its outcome read from the
/// old item that the failed condition returns; renew and abort are one request each; a step is
/// one TransactWriteItems (also when it sets the record's `on_lapse`), beginning steps a GetItem
/// and one; `take_uncertain` one conditional UpdateItem; evict deletes the steps item, then the
/// record (docs/steps.md).
#[tokio::test]
async fn each_call_costs_its_requests() {
    let Some(url) = url() else { return };
    let table = fresh_table();
    DynamoStore::create_table(&client(&url), &table)
        .await
        .unwrap();
    let (counted, requests) = counted_client(&url);
    let store = DynamoStore::builder()
        .table(&table)
        .build(counted)
        .await
        .unwrap();
    requests.take();

    let k = key("counted");
    let f1 = idem_core::Fingerprint::of_bytes(b"one");
    let f2 = idem_core::Fingerprint::of_bytes(b"two");
    let ClaimOutcome::Claimed(c) = store
        .claim(ClaimRequest::new(&k, LONG).fingerprint(Some(&f1)))
        .await
        .unwrap()
    else {
        panic!("new key");
    };
    assert_eq!(requests.take(), only("PutItem"), "claim");
    assert!(matches!(
        store
            .claim(ClaimRequest::new(&k, LONG).fingerprint(Some(&f1)))
            .await
            .unwrap(),
        ClaimOutcome::Locked { .. }
    ));
    assert_eq!(requests.take(), only("PutItem"), "locked duplicate");
    assert!(matches!(
        store
            .claim(ClaimRequest::new(&k, LONG).fingerprint(Some(&f2)))
            .await,
        Err(Error::KeyReused)
    ));
    assert_eq!(requests.take(), only("PutItem"), "key reused");
    store.renew(&c, LONG).await.unwrap();
    assert_eq!(requests.take(), only("UpdateItem"), "renew");
    store.begin_steps(&c, LONG).await.unwrap();
    assert_eq!(
        requests.take(),
        HashMap::from([
            ("GetItem".to_owned(), 1),
            ("TransactWriteItems".to_owned(), 1)
        ]),
        "begin steps"
    );
    let step = idem_core::StepWrite {
        name: "charge",
        position: 0,
        result: Some(b"1"),
        retention: LONG,
        on_lapse: None,
    };
    store.write_step(&c, step).await.unwrap();
    assert_eq!(requests.take(), only("TransactWriteItems"), "a step");
    let uncertain = idem_core::StepWrite {
        name: "mail",
        result: None,
        on_lapse: Some(idem_core::OnLapse::Uncertain),
        ..step
    };
    store.write_step(&c, uncertain).await.unwrap();
    assert_eq!(
        requests.take(),
        only("TransactWriteItems"),
        "a step that sets the record's on_lapse"
    );
    store.complete(&c, done(b"r", LONG)).await.unwrap();
    assert_eq!(requests.take(), only("UpdateItem"), "complete");
    store.complete(&c, done(b"again", LONG)).await.unwrap();
    assert_eq!(requests.take(), only("UpdateItem"), "complete again");
    assert!(matches!(
        store
            .claim(ClaimRequest::new(&k, LONG).fingerprint(Some(&f1)))
            .await
            .unwrap(),
        ClaimOutcome::Completed(_)
    ));
    assert_eq!(requests.take(), only("PutItem"), "replay");
    assert!(matches!(store.abort(&c).await, Err(Error::LeaseLost)));
    assert_eq!(
        requests.take(),
        only("DeleteItem"),
        "abort of a completed claim"
    );
    store.get(&k).await.unwrap();
    assert_eq!(requests.take(), only("GetItem"), "get");
    assert!(matches!(
        store.take_uncertain(&k, c.token(), LONG).await,
        Err(Error::NotUncertain { .. })
    ));
    assert_eq!(requests.take(), only("UpdateItem"), "take_uncertain");
    assert!(store.evict(&k).await.unwrap());
    assert_eq!(
        requests.take(),
        HashMap::from([("DeleteItem".to_owned(), 2)]),
        "evict: the steps, then the record"
    );
}

/// A stale owner, on real time against the server: its 300 ms lease ends, another handle takes
/// the key over, and every call of the stale claim is `LeaseLost` and changes nothing.
#[tokio::test]
async fn stale_owner_is_rejected_on_real_time() {
    let Some(url) = url() else { return };
    let margin = Duration::from_millis(50);
    let a = fresh_store(&url, |b| b.clock_skew_margin(margin)).await;
    let b = DynamoStore::builder()
        .table(a.table())
        .clock_skew_margin(margin)
        .build(client(&url))
        .await
        .unwrap();
    let k = key("stale");
    // A second: long enough that the check just below runs within it on a loaded machine.
    let lease = Duration::from_secs(1);
    let stale = claim(&a, &k, lease).await;
    assert!(matches!(
        b.claim(ClaimRequest::new(&k, LONG)).await.unwrap(),
        ClaimOutcome::Locked { .. }
    ));
    tokio::time::sleep(lease + margin + Duration::from_millis(100)).await;
    let owner = claim(&b, &k, LONG).await;
    assert!(matches!(a.renew(&stale, LONG).await, Err(Error::LeaseLost)));
    assert!(matches!(
        a.complete(&stale, done(b"stale", LONG)).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(a.abort(&stale).await, Err(Error::LeaseLost)));
    match a.get(&k).await.unwrap().map(|r| r.state) {
        Some(RecordState::InProgress { token, .. }) => assert_eq!(token, owner.token()),
        other => panic!("the new owner's claim must stand: {other:?}"),
    }
    b.complete(&owner, done(b"owner", LONG)).await.unwrap();
    assert!(matches!(
        a.complete(&stale, done(b"stale", LONG)).await,
        Err(Error::LeaseLost)
    ));
}

/// Nothing listening on the endpoint: building a store, and every call of a store whose server
/// went away, fails with a typed `Unavailable` error (within the client's timeouts).
#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    if url().is_none() {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nowhere = format!("http://127.0.0.1:{port}");
    let err = DynamoStore::builder()
        .build(client(&nowhere))
        .await
        .unwrap_err();
    assert_eq!(kind(&err), Some(StoreErrorKind::Unavailable), "{err}");
    assert!(err.is_retryable());
}

/// A server stopped mid-run, then restarted on the same port: while it is down every call is
/// `Unavailable`; after the restart (moto keeps nothing across one) the table is gone, and the
/// error names it; creating it again brings the store back.
#[tokio::test]
async fn a_server_stopped_and_restarted_mid_run() {
    let Some(cmd) = Server::command() else {
        if url().is_some() {
            eprintln!("skipping: IDEM_DYNAMODB_SERVER_CMD is not set");
        }
        assert!(
            std::env::var("IDEM_REQUIRE_DYNAMODB").map_or(true, |v| v != "1"),
            "IDEM_REQUIRE_DYNAMODB=1 requires IDEM_DYNAMODB_SERVER_CMD"
        );
        return;
    };
    let server = {
        let cmd = cmd.clone();
        tokio::task::spawn_blocking(move || Server::start(&cmd))
            .await
            .unwrap()
    };
    let (url, port) = (server.url(), server.port());
    let store = fresh_store(&url, |b| b).await;
    let k = key("outage");
    let c = claim(&store, &k, LONG).await;

    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap();
    let failures = [
        store.claim(ClaimRequest::new(&k, LONG)).await.unwrap_err(),
        store.complete(&c, done(b"r", LONG)).await.unwrap_err(),
        store.get(&k).await.unwrap_err(),
    ];
    for e in &failures {
        assert_eq!(kind(e), Some(StoreErrorKind::Unavailable), "{e}");
    }

    let _server = tokio::task::spawn_blocking(move || Server::start_on(&cmd, port))
        .await
        .unwrap();
    let e = store.claim(ClaimRequest::new(&k, LONG)).await.unwrap_err();
    assert_eq!(kind(&e), Some(StoreErrorKind::Query), "{e}");
    assert!(
        e.to_string().contains(store.table()),
        "the error names the table: {e}"
    );
    DynamoStore::create_table(store.client(), store.table())
        .await
        .unwrap();
    claim(&store, &k, LONG).await;
}

/// Building on a table that does not exist names it; a bad table name is `InvalidConfig` with
/// DynamoDB's rule; a margin over an hour is refused.
#[tokio::test]
async fn missing_table_and_bad_names_are_clear_errors() {
    let Some(url) = url() else { return };
    let missing = fresh_table();
    let err = DynamoStore::builder()
        .table(&missing)
        .build(client(&url))
        .await
        .unwrap_err();
    assert_eq!(kind(&err), Some(StoreErrorKind::Query), "{err}");
    assert!(err.to_string().contains(&missing), "{err}");
    for bad in ["ab", "no spaces", "slash/es"] {
        let err = DynamoStore::builder()
            .table(bad)
            .build(client(&url))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidConfig(m) if m.contains("3 to 255")),
            "{err}"
        );
    }
    let err = DynamoStore::builder()
        .table(fresh_table())
        .clock_skew_margin(Duration::from_secs(7200))
        .build(client(&url))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
}

/// An item the store did not write in its layout reads as `Corrupt`, never as a record.
#[tokio::test]
async fn a_malformed_item_is_corrupt() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, |b| b).await;
    let k = key("malformed");
    store
        .client()
        .put_item()
        .table_name(store.table())
        .item("pk", AttributeValue::S(k.to_string()))
        .item("token_b", AttributeValue::B(Blob::new(vec![1, 2, 3])))
        .item("state_n", AttributeValue::N("0".into()))
        .item("expires_ms", AttributeValue::N("99999999999999".into()))
        .send()
        .await
        .unwrap();
    for e in [
        store.get(&k).await.unwrap_err(),
        store.claim(ClaimRequest::new(&k, LONG)).await.unwrap_err(),
    ] {
        assert_eq!(kind(&e), Some(StoreErrorKind::Corrupt), "{e}");
    }
}

/// The table helper enables TTL on `ttl_s`, and every item carries a TTL at or after its
/// expiry plus the margin, so DynamoDB's own deletion never removes a live record.
#[tokio::test]
async fn items_carry_a_ttl_and_the_table_has_it_enabled() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, |b| b.clock_skew_margin(Duration::from_secs(1))).await;
    let ttl = store
        .client()
        .describe_time_to_live()
        .table_name(store.table())
        .send()
        .await
        .unwrap();
    let ttl = ttl.time_to_live_description().unwrap();
    assert_eq!(ttl.attribute_name(), Some("ttl_s"));
    assert_eq!(ttl.time_to_live_status(), Some(&TimeToLiveStatus::Enabled));
    // Creating it again is a no-op.
    DynamoStore::create_table(store.client(), store.table())
        .await
        .unwrap();

    let k = key("ttl");
    let c = claim(&store, &k, Duration::from_secs(60)).await;
    store
        .complete(&c, done(b"r", Duration::from_secs(3600)))
        .await
        .unwrap();
    let (expires_ms, ttl_s) = expiry_and_ttl(&store, &k).await;
    assert!(
        ttl_s * 1000 >= expires_ms + 1000,
        "ttl {ttl_s} s for expiry {expires_ms} ms"
    );
    assert!(ttl_s * 1000 <= expires_ms + 3000);

    // A running claim's item outlives its lease by the time a late holder may still complete
    // it, so DynamoDB's own deletion leaves it to its holder.
    let running = key("ttl-running");
    claim(&store, &running, Duration::from_secs(60)).await;
    let (lease_end_ms, ttl_s) = expiry_and_ttl(&store, &running).await;
    let kept_ms = i64::try_from(idem_core::LAPSED_CLAIMS_KEPT.as_millis()).unwrap();
    assert!(
        ttl_s * 1000 >= lease_end_ms + kept_ms,
        "ttl {ttl_s} s for a lease ending at {lease_end_ms} ms"
    );
}

/// The `expires_ms` and `ttl_s` attributes of `key`'s item.
async fn expiry_and_ttl(store: &DynamoStore, key: &Key) -> (i64, i64) {
    let item = store
        .client()
        .get_item()
        .table_name(store.table())
        .key("pk", AttributeValue::S(key.to_string()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    let number = |name: &str| match &item[name] {
        AttributeValue::N(n) => n.parse::<i64>().unwrap(),
        other => panic!("{name}: {other:?}"),
    };
    (number("expires_ms"), number("ttl_s"))
}

/// `prune_expired` examines a bounded number of items per call (here 1,000 for `limit` 1) and
/// goes on where the previous call stopped: among 1,500 live items, the 5 expired ones are all
/// deleted within a few calls, and no live item is touched.
#[tokio::test]
async fn prune_goes_on_where_it_stopped_and_spares_live_items() {
    let Some(url) = url() else { return };
    let clock = ManualClock::new();
    let store = fresh_store(&url, |b| {
        b.clock(clock.clone())
            .clock_skew_margin(Duration::from_millis(100))
    })
    .await;
    const LIVE: usize = 1_500;
    // Live items written 25 at a time, in the store's layout, expiring in 2100.
    let live: Vec<_> = (0..LIVE)
        .map(|i| {
            let item = HashMap::from([
                (
                    "pk".to_owned(),
                    AttributeValue::S(key(&format!("live-{i}")).to_string()),
                ),
                (
                    "token_b".to_owned(),
                    AttributeValue::B(Blob::new(vec![7; 16])),
                ),
                ("state_n".to_owned(), AttributeValue::N("0".into())),
                (
                    "expires_ms".to_owned(),
                    AttributeValue::N("4102444800000".into()),
                ),
            ]);
            idem_dynamodb::aws_sdk_dynamodb::types::WriteRequest::builder()
                .put_request(
                    idem_dynamodb::aws_sdk_dynamodb::types::PutRequest::builder()
                        .set_item(Some(item))
                        .build()
                        .unwrap(),
                )
                .build()
        })
        .collect();
    for batch in live.chunks(25) {
        let out = store
            .client()
            .batch_write_item()
            .request_items(store.table(), batch.to_vec())
            .send()
            .await
            .unwrap();
        assert!(out.unprocessed_items().is_none_or(|u| u.is_empty()));
    }
    for i in 0..5 {
        claim(
            &store,
            &key(&format!("expired-{i}")),
            Duration::from_secs(1),
        )
        .await;
    }
    // Past their leases and past the time a late holder may still complete them.
    clock.advance(idem_core::LAPSED_CLAIMS_KEPT + Duration::from_secs(2));

    let mut deleted = 0;
    let mut calls = 0;
    while deleted < 5 {
        calls += 1;
        assert!(calls <= 20, "5 expired items not pruned in 20 calls");
        let n = store.prune_expired(1).await.unwrap();
        assert!(n <= 1);
        deleted += n;
    }
    let remaining = store
        .client()
        .scan()
        .table_name(store.table())
        .select(idem_dynamodb::aws_sdk_dynamodb::types::Select::Count)
        .send()
        .await
        .unwrap();
    assert_eq!(
        remaining.count(),
        LIVE as i32,
        "only the expired items went"
    );
}

/// `key`'s item as the table holds it.
async fn raw_item(store: &DynamoStore, key: &Key) -> HashMap<String, AttributeValue> {
    store
        .client()
        .get_item()
        .table_name(store.table())
        .key("pk", AttributeValue::S(key.to_string()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap_or_default()
}

/// The size DynamoDB bills for `item`: each attribute's name in UTF-8 plus its value (a
/// string's UTF-8 bytes, a binary's bytes, a number's significant digits at two a byte plus
/// one, a boolean one byte), as AWS documents it for item sizes.
fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter()
        .map(|(name, value)| {
            name.len()
                + match value {
                    AttributeValue::S(s) => s.len(),
                    AttributeValue::B(b) => b.as_ref().len(),
                    AttributeValue::N(n) => {
                        let digits: String = n.chars().filter(char::is_ascii_digit).collect();
                        let significant = digits.trim_start_matches('0').trim_end_matches('0');
                        significant.len().div_ceil(2) + 1
                    }
                    AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
                    other => panic!("an attribute the store does not write: {other:?}"),
                }
        })
        .sum()
}

/// **Tombstones keep no result bytes.** A completion with a `key_retention` writes
/// `expires_ms` at the tombstone's end (so the claim's condition and DynamoDB's TTL keep the
/// key that long) and `retained_ms` at the retention's end. Past the retention a claim gets
/// `Expired` and `get` reads the tombstone, whether `prune_expired` has run or not; the first
/// prune strips the response (`state_n` 2, counted), and past the tombstone the next deletes
/// the item. The item's size without its response is what a tombstone costs
/// (docs/stores.md).
#[tokio::test]
async fn a_tombstone_keeps_no_result_bytes() {
    let Some(url) = url() else { return };
    let clock = ManualClock::new();
    let store = fresh_store(&url, |b| {
        b.clock(clock.clone())
            .clock_skew_margin(Duration::from_millis(100))
    })
    .await;
    let k = key("tombstone");
    let fingerprint = idem_core::Fingerprint::of_bytes(b"the request");
    let request = ClaimRequest::new(&k, LONG).fingerprint(Some(&fingerprint));
    let ClaimOutcome::Claimed(c) = store.claim(request).await.unwrap() else {
        panic!("a new key starts");
    };
    let result = vec![0xa5u8; 1000];
    let day = Duration::from_secs(86_400);
    let completion = Completion {
        response: Some(&result),
        is_error: false,
        retention: Duration::from_secs(60),
        // Rounded up to whole seconds.
        key_retention: day - Duration::from_millis(500),
    };
    store.complete(&c, completion).await.unwrap();
    let item = raw_item(&store, &k).await;
    let number = |item: &HashMap<String, AttributeValue>, name: &str| match item.get(name) {
        Some(AttributeValue::N(n)) => n.parse::<i64>().unwrap(),
        other => panic!("{name}: {other:?}"),
    };
    let retained = number(&item, "retained_ms");
    assert_eq!(number(&item, "expires_ms"), retained + 86_400_000);
    assert!(number(&item, "ttl_s") * 1000 > retained + 86_400_000);
    assert!(!item.contains_key("uncertain") && !item.contains_key("lapse_ttl_s"));
    let completed_bytes = item_size(&item);
    assert!(matches!(
        store.claim(request).await.unwrap(),
        ClaimOutcome::Completed(r) if r.response.as_deref() == Some(&result[..])
    ));

    // The retention ends: a tombstone before any prune, with the same retention end.
    clock.advance(Duration::from_secs(61));
    let since = idem_core::ClaimOutcome::Expired {
        since: std::time::UNIX_EPOCH + Duration::from_millis(retained as u64),
    };
    assert_eq!(store.claim(request).await.unwrap(), since);
    assert!(raw_item(&store, &k).await.contains_key("response_b"));
    assert_eq!(
        store.prune_expired(100).await.unwrap(),
        1,
        "the strip counts"
    );
    let item = raw_item(&store, &k).await;
    assert!(!item.contains_key("response_b"), "{item:?}");
    assert_eq!(item.get("state_n"), Some(&AttributeValue::N("2".into())));
    let longest = item
        .values()
        .map(|v| match v {
            AttributeValue::B(b) => b.as_ref().len(),
            _ => 0,
        })
        .max()
        .unwrap_or(0);
    assert!(longest <= 32, "a binary attribute keeps {longest} bytes");
    let tombstone_bytes = item_size(&item);
    eprintln!(
        "DynamoDB item size: completed with a 1000-byte response {completed_bytes} B; \
         tombstone {tombstone_bytes} B ({item:?})"
    );
    // At most 200 bytes: each number at its longest (13 digits of milliseconds take 8 bytes;
    // the manual clock's round times take fewer).
    assert!(
        tombstone_bytes <= 200,
        "a tombstone takes {tombstone_bytes} bytes"
    );
    assert_eq!(store.prune_expired(100).await.unwrap(), 0, "stripped once");
    assert_eq!(store.claim(request).await.unwrap(), since);
    assert!(matches!(
        store.get(&k).await.unwrap().map(|r| r.state),
        Some(RecordState::Expired { .. })
    ));
    // Completing the same claim again is still Ok, and changes nothing.
    store.complete(&c, done(b"again", LONG)).await.unwrap();
    assert_eq!(store.claim(request).await.unwrap(), since);

    // The tombstone ends: the next prune deletes it, and the key is free.
    clock.advance(day);
    assert_eq!(store.prune_expired(100).await.unwrap(), 1);
    assert!(raw_item(&store, &k).await.is_empty());
    assert!(matches!(
        store.claim(request).await.unwrap(),
        ClaimOutcome::Claimed(_)
    ));
}

/// **An uncertain claim never expires by itself.** Its `ttl_s` is `true` (not a number, which
/// DynamoDB's TTL ignores) from the claim on, through a renewal, a step write that sets it
/// uncertain again, and a takeover; a step write that sets it back to release gives it its
/// lease's TTL again (`lapse_ttl_s`). A day past its lease, `prune_expired` deletes the
/// ordinary claim that lapsed beside it and leaves the uncertain one, which still reads as
/// uncertain and is taken over.
#[tokio::test]
async fn an_uncertain_claim_is_never_pruned_nor_given_a_ttl() {
    let Some(url) = url() else { return };
    let clock = ManualClock::new();
    let store = fresh_store(&url, |b| {
        b.clock(clock.clone())
            .clock_skew_margin(Duration::from_millis(100))
    })
    .await;
    let u = key("uncertain");
    let request =
        ClaimRequest::new(&u, Duration::from_secs(1)).on_lapse(idem_core::OnLapse::Uncertain);
    let ClaimOutcome::Claimed(c) = store.claim(request).await.unwrap() else {
        panic!("a new key starts");
    };
    let ttl = |item: HashMap<String, AttributeValue>| item.get("ttl_s").cloned();
    let never = Some(AttributeValue::Bool(true));
    assert_eq!(ttl(raw_item(&store, &u).await), never);
    let step = |on_lapse| idem_core::StepWrite {
        on_lapse: Some(on_lapse),
        ..idem_core::StepWrite::new("charge", 0, None, Duration::from_secs(86_400 * 3))
    };
    store
        .write_step(&c, step(idem_core::OnLapse::Release))
        .await
        .unwrap();
    let item = raw_item(&store, &u).await;
    assert!(!item.contains_key("uncertain"), "{item:?}");
    assert!(matches!(item.get("ttl_s"), Some(AttributeValue::N(_))));
    assert_eq!(item.get("ttl_s"), item.get("lapse_ttl_s"));
    store
        .write_step(&c, step(idem_core::OnLapse::Uncertain))
        .await
        .unwrap();
    assert_eq!(ttl(raw_item(&store, &u).await), never);
    store.renew(&c, Duration::from_secs(1)).await.unwrap();
    let item = raw_item(&store, &u).await;
    assert_eq!(item.get("ttl_s"), never.as_ref());
    assert!(matches!(
        item.get("lapse_ttl_s"),
        Some(AttributeValue::N(_))
    ));

    let o = key("ordinary");
    claim(&store, &o, Duration::from_secs(1)).await;
    clock.advance(idem_core::LAPSED_CLAIMS_KEPT + Duration::from_secs(2));
    assert_eq!(
        store.prune_expired(100).await.unwrap(),
        1,
        "the ordinary claim"
    );
    assert!(raw_item(&store, &o).await.is_empty());
    assert!(matches!(
        store.get(&u).await.unwrap().map(|r| r.state),
        Some(RecordState::Uncertain { token, .. }) if token == c.token()
    ));
    assert!(matches!(
        store.claim(request).await.unwrap(),
        ClaimOutcome::Uncertain { .. }
    ));
    let resolver = store
        .take_uncertain(&u, c.token(), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(ttl(raw_item(&store, &u).await), never);
    assert!(matches!(
        store.take_uncertain(&u, c.token(), LONG).await,
        Err(Error::NotUncertain { .. })
    ));
    store
        .complete(&resolver, done(b"resolved", LONG))
        .await
        .unwrap();
    let item = raw_item(&store, &u).await;
    assert!(matches!(item.get("ttl_s"), Some(AttributeValue::N(_))));
    assert!(!item.contains_key("uncertain") && !item.contains_key("lapse_ttl_s"));
}

/// A burst of requests whose connections are all reset at once (as moto's were once, when the
/// storm rule's thousand calls connected together) is retried by every request, not by the
/// first fifty: the test client's retries draw on a bucket without a quota
/// (`idem_test_support::dynamodb::config`), where the SDK's default bucket, shared by the
/// client's requests, runs dry after 50 retries of a connection error (10 tokens each). A proxy
/// in front of the server reads each request's head and resets the connection of every
/// operation's first attempt (by its `amz-sdk-invocation-id`, which its retries repeat), then
/// forwards the retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_reset_connections_is_retried_by_every_request() {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    let Some(url) = url() else { return };
    const BURST: usize = 200;
    let upstream = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxied = format!("http://{}", listener.local_addr().unwrap());
    // The operations whose first attempt was reset.
    let seen: Arc<Mutex<HashSet<String>>> = Arc::default();
    let proxy = tokio::spawn({
        let seen = seen.clone();
        async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (seen, upstream) = (seen.clone(), upstream.clone());
                tokio::spawn(async move {
                    // The request's head, read whole (at most 16 KiB).
                    let mut head = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let id = String::from_utf8_lossy(&head)
                        .lines()
                        .find_map(|line| {
                            let (name, value) = line.split_once(':')?;
                            name.eq_ignore_ascii_case("amz-sdk-invocation-id")
                                .then(|| value.trim().to_owned())
                        })
                        .unwrap_or_default();
                    let first = seen.lock().unwrap().insert(id);
                    if first {
                        // Closed with a zero linger: the client reads a reset.
                        let _ = conn.set_zero_linger();
                        return;
                    }
                    if let Ok(mut up) = TcpStream::connect(&upstream).await
                        && up.write_all(&head).await.is_ok()
                    {
                        let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                    }
                });
            }
        }
    });

    let client = client(&proxied);
    let calls: Vec<_> = (0..BURST)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.list_tables().send().await })
        })
        .collect();
    let mut failed = Vec::new();
    for call in calls {
        if let Err(e) = call.await.unwrap() {
            failed.push(format!("{e:?}"));
        }
    }
    proxy.abort();
    assert_eq!(
        seen.lock().unwrap().len(),
        BURST,
        "each request's first attempt was reset, under an id of its own"
    );
    assert!(
        failed.is_empty(),
        "{} of {BURST} requests failed on a reset connection instead of trying again; the first: {}",
        failed.len(),
        failed[0]
    );
}
