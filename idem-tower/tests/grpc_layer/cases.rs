//! The cases, each run against every store by `main.rs`.

use std::sync::Arc;
use std::time::Duration;

use idem::grpc::Problem;
use idem::{Key, OnLocked, Store};
use idem_test_support::grpc::{CreatePaymentRequest, Payment, TransferRequest, WatchRequest};
use tokio::task::JoinSet;
use tonic::{Code, Request, Status};

use crate::server::{status_fields, within, Headers, LayerServer, Raw, Server, BOUND, CALLER};

fn payment(amount: i64, behaviour: &str) -> CreatePaymentRequest {
    CreatePaymentRequest {
        amount,
        currency: "EUR".into(),
        behaviour: behaviour.into(),
    }
}

fn meta(key: &str) -> [(&str, &str); 2] {
    [("idempotency-key", key), ("x-caller", CALLER)]
}

/// The layer's own answer: its code, and the reason in its `google.rpc.ErrorInfo`.
fn assert_problem(status: &Status, problem: Problem) {
    assert_eq!(status.code(), problem.code(), "{status:?}");
    let details = String::from_utf8_lossy(status.details());
    assert!(details.contains(problem.reason()), "{details}");
}

fn replayed<T>(response: &tonic::Response<T>) -> bool {
    response
        .metadata()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// A retried unary call gets the first response again, byte for byte: its headers (custom
/// metadata included), its message and its trailers (`grpc-status` and the custom trailing
/// metadata of the first run), marked replayed; the method runs once.
pub async fn retried_call_replays_byte_identical(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let new = payment(4200, "");
    let first: Raw = server.raw("Create", &new, &meta("k-1")).await;
    assert_eq!(first.status, 200);
    assert!(!first.replayed());
    assert_eq!(first.header("x-run"), Some("1"));
    assert_eq!(first.trailer("grpc-status"), Some("0"));
    assert_eq!(first.trailer("x-ledger-seq"), Some("1"));
    assert_eq!(first.message::<Payment>().id, "pay_1");
    let again = server.raw("Create", &new, &meta("k-1")).await;
    assert!(again.replayed());
    assert_eq!(again.status, first.status);
    assert_eq!(again.headers_unmarked(), first.headers);
    assert_eq!(again.body, first.body);
    assert_eq!(again.trailers, first.trailers);
    // The tonic client reads the same answer, marked.
    let via_client = server.create(Some("k-1"), Some(CALLER), new).await.unwrap();
    assert!(replayed(&via_client));
    assert_eq!(via_client.metadata().get("x-run").unwrap(), "1");
    assert_eq!(via_client.get_ref().id, "pay_1");
    assert_eq!(server.runs(), 1);
}

/// A final error (`NOT_FOUND` with details and custom metadata, a trailers-only response) is
/// stored and replayed as it was: code, message, `grpc-status-details-bin` and metadata.
pub async fn final_error_replays_with_details(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let new = payment(1, "not-found");
    let first = server.raw("Create", &new, &meta("k-nf")).await;
    assert_eq!(status_fields(&first)["grpc-status"], "5");
    let again = server.raw("Create", &new, &meta("k-nf")).await;
    assert!(again.replayed());
    assert_eq!(again.headers_unmarked(), first.headers);
    assert_eq!(
        (&again.body, &again.trailers),
        (&first.body, &first.trailers)
    );
    let status = server
        .create(Some("k-nf"), Some(CALLER), new)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(status.message(), "run 1: no such account");
    assert_eq!(status.details(), b"details of run 1");
    assert_eq!(status.metadata().get("x-run").unwrap(), "1");
    assert_eq!(
        status.metadata().get("idempotent-replayed").unwrap(),
        "true"
    );
    assert_eq!(server.runs(), 1);
}

/// A transient status (`UNAVAILABLE`, `INTERNAL`) is not stored: it frees the key, the retry
/// runs the method, and its answer is the one stored.
pub async fn transient_status_frees_key(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let flaky = payment(7, "fail-once");
    let first = server
        .create(Some("k-flaky"), Some(CALLER), flaky.clone())
        .await
        .unwrap_err();
    assert_eq!(
        (first.code(), first.message()),
        (Code::Unavailable, "run 1: not now")
    );
    let second = server
        .create(Some("k-flaky"), Some(CALLER), flaky.clone())
        .await
        .unwrap();
    assert!(!replayed(&second));
    assert_eq!(second.get_ref().id, "pay_2");
    let third = server
        .create(Some("k-flaky"), Some(CALLER), flaky)
        .await
        .unwrap();
    assert!(replayed(&third));
    assert_eq!(third.get_ref().id, "pay_2");
    for _ in 0..2 {
        let broke = server
            .create(Some("k-internal"), Some(CALLER), payment(1, "internal"))
            .await
            .unwrap_err();
        assert_eq!(broke.code(), Code::Internal);
    }
    assert_eq!(server.runs(), 4);
}

/// 50 concurrent calls with one key, failing fast: one runs; the 49 others get `UNAVAILABLE`
/// with `grpc-retry-pushback-ms` while it runs; afterwards the key replays its answer.
pub async fn fifty_concurrent_duplicates_run_once(store: Arc<dyn Store>) {
    let mut server = Server::start(store, |b| b).await;
    let hold = payment(50, "hold");
    let mut calls = JoinSet::new();
    for _ in 0..50 {
        calls.spawn(server.create(Some("k-50"), Some(CALLER), hold.clone()));
    }
    within("the first call to run", server.holds.entered.recv()).await;
    for _ in 0..49 {
        let refused = within("a duplicate's answer", calls.join_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap_err();
        assert_problem(&refused, Problem::KeyInFlight);
        let pushback: u64 = refused
            .metadata()
            .get("grpc-retry-pushback-ms")
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(pushback >= 1);
    }
    server.holds.release(1);
    let first = within("the running call", calls.join_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!replayed(&first));
    let again = server
        .create(Some("k-50"), Some(CALLER), hold)
        .await
        .unwrap();
    assert!(replayed(&again));
    assert_eq!(again.get_ref(), first.get_ref());
    assert_eq!(server.runs(), 1);
}

/// 50 concurrent calls with one key, waiting (`OnLocked::Wait`): one runs, and every call gets
/// its answer.
pub async fn fifty_concurrent_duplicates_wait_for_one_run(store: Arc<dyn Store>) {
    let mut server = Server::start(store, |b| b.on_locked(OnLocked::Wait { timeout: BOUND })).await;
    let hold = payment(50, "hold");
    let mut calls = JoinSet::new();
    for _ in 0..50 {
        calls.spawn(server.create(Some("k-50w"), Some(CALLER), hold.clone()));
    }
    within("the first call to run", server.holds.entered.recv()).await;
    server.holds.release(1);
    let mut fresh = 0;
    while let Some(done) = within("every call's answer", calls.join_next()).await {
        let response = done.unwrap().unwrap();
        assert_eq!(response.get_ref().id, "pay_1");
        fresh += usize::from(!replayed(&response));
    }
    assert_eq!(fresh, 1);
    assert_eq!(server.runs(), 1);
}

/// A client whose deadline passes while the method runs gives up (tonic's client cancels the
/// call: `CANCELLED`, "Timeout expired"; the server would end it with `DEADLINE_EXCEEDED`), but
/// the method is not stopped: it runs to its end, its answer is stored, and the retry gets it.
/// One run.
pub async fn deadline_mid_call_runs_once_then_replays(store: Arc<dyn Store>) {
    let mut server = Server::start(store, |b| b.on_locked(OnLocked::Wait { timeout: BOUND })).await;
    let hold = payment(9, "hold");
    let mut client = server.client();
    let mut req = Request::new(hold.clone());
    req.metadata_mut()
        .insert("idempotency-key", "k-deadline".parse().unwrap());
    req.metadata_mut()
        .insert("x-caller", CALLER.parse().unwrap());
    // Long enough for the call to reach the method on a loaded machine; the method holds until
    // released, so the deadline always passes while it runs.
    req.set_timeout(Duration::from_secs(2));
    let first = tokio::spawn(async move { client.create(req).await });
    within("the call to run", server.holds.entered.recv()).await;
    let expired = within("the deadline", first).await.unwrap().unwrap_err();
    assert!(
        matches!(expired.code(), Code::Cancelled | Code::DeadlineExceeded)
            && expired.message().contains("Timeout"),
        "{expired:?}"
    );
    // The deadline did not stop the method: it still holds, not dropped.
    assert!(server.holds.dropped.try_recv().is_err());
    let retry = tokio::spawn(server.create(Some("k-deadline"), Some(CALLER), hold));
    server.holds.release(1);
    let replay = within("the retry", retry).await.unwrap().unwrap();
    assert!(replayed(&replay));
    assert_eq!(replay.get_ref().id, "pay_1");
    assert_eq!(server.runs(), 1);
    assert!(server.holds.dropped.try_recv().is_err());
}

/// A server-streaming method is not named as unary: its calls pass untouched, key or not. Each
/// call runs and streams its own messages, nothing is replayed or stored.
pub async fn streaming_passes_untouched(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let mut client = server.client();
    for round in 0..2 {
        let mut req = Request::new(WatchRequest { count: 3 });
        req.metadata_mut()
            .insert("idempotency-key", "k-watch".parse().unwrap());
        req.metadata_mut()
            .insert("x-caller", CALLER.parse().unwrap());
        let response = client.watch(req).await.unwrap();
        assert!(!replayed(&response));
        let mut stream = response.into_inner();
        let mut ids = Vec::new();
        for _ in 0..4 {
            match stream.message().await.unwrap() {
                Some(p) => ids.push(p.id),
                None => break,
            }
        }
        let expected: Vec<String> = (1..=3).map(|n| format!("w_{}", round * 3 + n)).collect();
        assert_eq!(ids, expected);
    }
    assert_eq!(server.runs(), 2);
    let key = Key::derive("grpc", CALLER, "k-watch").unwrap();
    assert!(server.store.get(&key).await.unwrap().is_none());
}

/// Two callers with the same key and message each get their own run and their own replay; a
/// call without an identity is refused (`UNAUTHENTICATED`), one whose identity cannot be a key
/// part too (`INVALID_ARGUMENT`), and neither runs.
pub async fn callers_never_share_keys(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let new = payment(10, "");
    for _ in 0..2 {
        for (caller, id) in [("tenant-a", "pay_1"), ("tenant-b", "pay_2")] {
            let r = server
                .create(Some("k-shared"), Some(caller), new.clone())
                .await
                .unwrap();
            assert_eq!(
                (r.get_ref().id.as_str(), r.get_ref().caller.as_str()),
                (id, caller)
            );
        }
    }
    let missing = server
        .create(Some("k-shared"), None, new.clone())
        .await
        .unwrap_err();
    assert_problem(&missing, Problem::CallerMissing);
    let long = "c".repeat(300);
    let invalid = server
        .create(Some("k-shared"), Some(&long), new)
        .await
        .unwrap_err();
    assert_problem(&invalid, Problem::CallerInvalid);
    assert_eq!(server.runs(), 2);
}

/// The same key for another message is refused with `FAILED_PRECONDITION`, not run.
pub async fn key_reused_is_failed_precondition(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    server
        .create(Some("k-reuse"), Some(CALLER), payment(1, ""))
        .await
        .unwrap();
    let reused = server
        .create(Some("k-reuse"), Some(CALLER), payment(2, ""))
        .await
        .unwrap_err();
    assert_problem(&reused, Problem::KeyReused);
    assert_eq!(server.runs(), 1);
}

/// `Transfer` is keyed by its message's `request_id` (AIP-155), not by metadata: the same id
/// replays, another id runs, and an empty id runs unguarded.
pub async fn request_id_field_is_the_key(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let mut client = server.client();
    let transfer = |id: &str| {
        let mut req = Request::new(TransferRequest {
            amount: 5,
            to: "bob".into(),
            request_id: id.into(),
        });
        req.metadata_mut()
            .insert("x-caller", CALLER.parse().unwrap());
        req
    };
    let first = client.transfer(transfer("req-1")).await.unwrap();
    assert_eq!(first.get_ref().id, "tr_1");
    let again = client.transfer(transfer("req-1")).await.unwrap();
    assert!(replayed(&again));
    assert_eq!(again.get_ref(), first.get_ref());
    let other = client.transfer(transfer("req-2")).await.unwrap();
    assert_eq!(other.get_ref().id, "tr_2");
    for id in ["tr_3", "tr_4"] {
        let unkeyed = client.transfer(transfer("")).await.unwrap();
        assert!(!replayed(&unkeyed));
        assert_eq!(unkeyed.get_ref().id, id);
    }
    let key = Key::derive("grpc", CALLER, "req-1").unwrap();
    assert!(server.store.get(&key).await.unwrap().is_some());
    assert_eq!(server.runs(), 4);
}

/// A key that is too long, holds a byte outside printable ASCII, comes twice, or a request id
/// field that is too long: `INVALID_ARGUMENT`, nothing runs.
pub async fn malformed_keys_are_invalid_argument(store: Arc<dyn Store>) {
    let server = Server::start(store, |b| b).await;
    let long = "k".repeat(256);
    let status = server
        .create(Some(&long), Some(CALLER), payment(1, ""))
        .await
        .unwrap_err();
    assert_problem(&status, Problem::KeyMalformed);
    let twice = server
        .raw(
            "Create",
            &payment(1, ""),
            &[
                ("idempotency-key", "a"),
                ("idempotency-key", "b"),
                ("x-caller", CALLER),
            ],
        )
        .await;
    assert_eq!(status_fields(&twice)["grpc-status"], "3");
    let not_ascii = server
        .raw(
            "Create",
            &payment(1, ""),
            &[("idempotency-key", "caf\u{e9}"), ("x-caller", CALLER)],
        )
        .await;
    assert_eq!(status_fields(&not_ascii)["grpc-status"], "3");
    let mut client = server.client();
    let mut req = Request::new(TransferRequest {
        amount: 5,
        to: "bob".into(),
        request_id: long,
    });
    req.metadata_mut()
        .insert("x-caller", CALLER.parse().unwrap());
    let status = client.transfer(req).await.unwrap_err();
    assert_problem(&status, Problem::KeyMalformed);
    assert_eq!(server.runs(), 0);
}

/// A response over the engine's `max_response_bytes` goes to its client, is recorded as not
/// retained, and the retry gets `FAILED_PRECONDITION` instead of a second run.
pub async fn oversized_response_is_not_run_again(store: Arc<dyn Store>) {
    let engine = idem::Idempotency::builder(store.clone())
        .max_response_bytes(1024)
        .build()
        .unwrap();
    let server = Server::start_with(engine, store, |b| b).await;
    let first = server
        .create(Some("k-big"), Some(CALLER), payment(1, "big"))
        .await
        .unwrap();
    assert_eq!(first.get_ref().note.len(), 8192);
    let again = server
        .create(Some("k-big"), Some(CALLER), payment(1, "big"))
        .await
        .unwrap_err();
    assert_problem(&again, Problem::ResponseNotRetained);
    assert_eq!(server.runs(), 1);
}

/// Calls `Create` until it answers, as a client with a retry policy does: after `UNAVAILABLE`
/// it waits the pushback the status carries (10 ms without one) and sends the same call again.
async fn with_retries(server: &Server, key: &str, new: CreatePaymentRequest) -> (Payment, usize) {
    for attempt in 1..=20 {
        match server.create(Some(key), Some(CALLER), new.clone()).await {
            Ok(response) => return (response.into_inner(), attempt),
            Err(status) if status.code() == Code::Unavailable => {
                let pushback = status
                    .metadata()
                    .get("grpc-retry-pushback-ms")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(10u64);
                tokio::time::sleep(Duration::from_millis(pushback.min(100))).await;
            }
            Err(status) => panic!("{key}: {status:?}"),
        }
    }
    panic!("{key}: no answer in 20 attempts")
}

/// A flaky server: each payment's first run fails (`UNAVAILABLE`, before it books anything),
/// and the network loses the first two responses of each key after the server made them.
/// 20 clients retry as a retry policy does, each also hedging its first attempt with a second
/// one at once. Every payment is booked exactly once, and every answer for a key is the same.
pub async fn flaky_server_with_retries_books_each_payment_once(store: Arc<dyn Store>) {
    let server = Arc::new(Server::start(store, |b| b).await);
    server.lose_first_responses(2);
    let mut clients = JoinSet::new();
    for n in 0..20 {
        let server = server.clone();
        clients.spawn(async move {
            let key = format!("k-flaky-{n}");
            let new = payment(100 + n, "fail-once");
            let (a, b) = tokio::join!(
                with_retries(&server, &key, new.clone()),
                with_retries(&server, &key, new)
            );
            assert_eq!(a.0, b.0, "{key}: two answers");
            assert!(a.1 + b.1 > 2, "{key}: answered with no retry");
            (key, a.0)
        });
    }
    let mut answers = Vec::new();
    while let Some(done) = within("the clients", clients.join_next()).await {
        answers.push(done.unwrap());
    }
    let mut booked = server.effects();
    booked.sort();
    let mut keys: Vec<String> = answers.iter().map(|(k, _)| k.clone()).collect();
    keys.sort();
    assert_eq!(booked, keys, "each payment booked exactly once");
}

/// The store cannot be reached when a call arrives (its pool is closed): `UNAVAILABLE` with a
/// pushback of one second, and nothing runs.
pub async fn store_unreachable_is_unavailable(store: idem::SqliteStore) {
    let server = Server::start(Arc::new(store.clone()), |b| b).await;
    store.pool().close().await;
    let status = server
        .create(Some("k-down"), Some(CALLER), payment(1, ""))
        .await
        .unwrap_err();
    assert_problem(&status, Problem::StoreUnavailable);
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "1000"
    );
    assert_eq!(server.runs(), 0);
}

/// The store fails the first call's completion (it went away right after the method ran): the
/// client gets its answer and the engine goes on completing in the background. Retries through
/// the layer meanwhile follow its `on_locked` and never run the method: failing fast,
/// `UNAVAILABLE` (key in flight) at once with `grpc-retry-pushback-ms` of the completion's next
/// try (2,000: at most 2 s, and a third of the 30 s lease); waiting 300 ms, the same after
/// 300 ms; waiting 20 s once the store is back, the replay as soon as the completion lands.
pub async fn pending_completion_follows_on_locked(store: Arc<dyn Store>) {
    use idem_test_support::faults::CompletionsFail;
    let failing = CompletionsFail::new(store);
    let engine = idem::Idempotency::from_arc(failing.clone());
    let serve = |wait: Option<Duration>| {
        Server::start_with(engine.clone(), failing.clone(), move |b| match wait {
            Some(timeout) => b.on_locked(OnLocked::Wait { timeout }),
            None => b,
        })
    };
    let (fast, waits, patient) = (
        serve(None).await,
        serve(Some(Duration::from_millis(300))).await,
        serve(Some(Duration::from_secs(20))).await,
    );
    let new = payment(70, "");
    let first = fast
        .create(Some("k-pending"), Some(CALLER), new.clone())
        .await
        .unwrap();
    assert!(!replayed(&first));

    // A retry through `server`: refused as in flight, with the completion's next try as its
    // pushback; how long it took.
    let refused = |server: &Server| {
        let call = server.create(Some("k-pending"), Some(CALLER), new.clone());
        async move {
            let asked = std::time::Instant::now();
            let status = call.await.unwrap_err();
            assert_problem(&status, Problem::KeyInFlight);
            let pushback = status.metadata().get("grpc-retry-pushback-ms").unwrap();
            assert_eq!(pushback.to_str().unwrap(), "2000");
            asked.elapsed()
        }
    };
    let took = refused(&fast).await;
    assert!(took < Duration::from_secs(2), "a fail-fast retry waited");
    let took = refused(&waits).await;
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "waited {took:?}"
    );

    failing.switch(false);
    let replay = patient
        .create(Some("k-pending"), Some(CALLER), new)
        .await
        .unwrap();
    assert!(replayed(&replay));
    assert_eq!(replay.get_ref(), first.get_ref());
    assert_eq!(
        fast.runs() + waits.runs() + patient.runs(),
        1,
        "the method ran twice"
    );
}

/// A lease short enough to wait out in a case, and the wait past it.
fn short_lease() -> (Duration, Duration) {
    let lease = idem::conformance::scaled(Duration::from_millis(300));
    (lease, lease + Duration::from_millis(150))
}

/// A key whose call's claim lapsed with no response, on a layer that declares its effect not
/// repeatable: retries get `ABORTED` (reason `OPERATION_UNCERTAIN`, the operation in the
/// `ErrorInfo`'s metadata) and the method never runs; resolved as completed, retries replay.
pub async fn uncertain_key_is_aborted_naming_the_operation(store: Arc<dyn Store>) {
    let (lease, past) = short_lease();
    let engine = idem::Idempotency::builder(store.clone())
        .lease(lease)
        .build()
        .unwrap();
    let server = Server::start_with(engine.clone(), store, |b| {
        b.on_lapse(idem::OnLapse::Uncertain)
    })
    .await;
    let key = Key::derive("grpc", CALLER, "k-dead").unwrap();
    let idem::CallClaim::Claimed(_dead) = engine
        .call(key)
        .on_lapse(idem::OnLapse::Uncertain)
        .claim()
        .await
        .unwrap()
    else {
        panic!("a new key is claimed")
    };
    tokio::time::sleep(past).await;
    let refused = server
        .create(Some("k-dead"), Some(CALLER), payment(7, ""))
        .await
        .unwrap_err();
    assert_problem(&refused, Problem::OperationUncertain);
    let details = String::from_utf8_lossy(refused.details()).into_owned();
    assert!(details.contains("operation"), "{details}");
    assert!(details.contains(&key.to_string()), "{details}");
    assert_eq!(server.runs(), 0);
}

/// After a response's retention, a retry gets `ALREADY_EXISTS` (reason `RESULT_EXPIRED`) from
/// the key's tombstone, never a second run.
pub async fn expired_result_is_already_exists(store: Arc<dyn Store>) {
    let (retention, past) = short_lease();
    let engine = idem::Idempotency::builder(store.clone())
        .retention(retention)
        .build()
        .unwrap();
    let server = Server::start_with(engine, store, |b| b).await;
    server
        .create(Some("k-old"), Some(CALLER), payment(7, ""))
        .await
        .unwrap();
    tokio::time::sleep(past).await;
    let late = server
        .create(Some("k-old"), Some(CALLER), payment(7, ""))
        .await
        .unwrap_err();
    assert_problem(&late, Problem::ResultExpired);
    assert_eq!(server.runs(), 1);
}

/// A key stored under one policy version, retried with another message under another version:
/// `FAILED_PRECONDITION` with reason `POLICY_CHANGED`, not `IDEMPOTENCY_KEY_REUSED`.
pub async fn changed_policy_is_policy_changed(store: Arc<dyn Store>) {
    let v1 = Server::start(store.clone(), |b| b.policy_version(1)).await;
    v1.create(Some("k-v"), Some(CALLER), payment(1, ""))
        .await
        .unwrap();
    let v2 = Server::start(store, |b| b.policy_version(2)).await;
    let changed = v2
        .create(Some("k-v"), Some(CALLER), payment(2, ""))
        .await
        .unwrap_err();
    assert_problem(&changed, Problem::PolicyChanged);
    assert_eq!(v2.runs(), 0);
}
