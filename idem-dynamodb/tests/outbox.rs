//! DynamoOutbox against a DynamoDB-compatible server (moto under `scripts/test`), as
//! idem-sql's tests/outbox.rs does for SQL: a message put in the caller's own
//! `TransactWriteItems` commits or is cancelled with its business write, a retry's put adds no
//! second copy and never makes a sent message pending again, pending reads in order across
//! shards, marking sent marks once, pruning deletes what was sent, a `dynamo_tx` step carries
//! the message with its record, the dispatcher publishes every committed message once, and
//! each call costs the requests its docs give. Every test uses fresh tables.
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem_core::{
    ChannelPublisher, Dispatcher, DispatcherConfig, Error, Idempotency, Key, MessageId,
    OutboxMessage, OutboxSource, Outcome, StoreErrorKind,
};
use idem_dynamodb::aws_sdk_dynamodb::config::retry::RetryConfig;
use idem_dynamodb::aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use idem_dynamodb::aws_sdk_dynamodb::Client;
use idem_dynamodb::{DynamoOutbox, DynamoSteps, DynamoStore};

use idem_test_support::dynamodb::{
    client, counted_client, dynamo_url, fresh_store, fresh_table, LoseAnAnswer, Requests,
};

fn url() -> Option<String> {
    dynamo_url(&idem_test_support::current_test())
}

fn message(operation: &str, aggregate: &str, name: &str) -> OutboxMessage {
    let key = Key::derive("orders", "", operation).unwrap();
    OutboxMessage::new(
        MessageId::derive(&key, name),
        "order",
        aggregate,
        name,
        format!("{{\"op\":\"{operation}\"}}").into_bytes(),
    )
    .unwrap()
}

/// An outbox on a fresh table of `shards` shards.
async fn outbox(url: &str, shards: u32) -> DynamoOutbox {
    DynamoOutbox::builder()
        .table(fresh_table())
        .shards(shards)
        .create_table_if_missing(true)
        .build(client(url))
        .await
        .unwrap()
}

/// A fresh business table: a string hash key `pk` (the store's layout serves).
async fn orders_table(url: &str) -> String {
    let table = fresh_table();
    DynamoStore::create_table(&client(url), &table)
        .await
        .unwrap();
    table
}

/// The business write: a new order `id`, refused (cancelling the transaction) if it exists.
fn new_order(table: &str, id: &str) -> TransactWriteItem {
    let put = Put::builder()
        .table_name(table)
        .item("pk", AttributeValue::S(id.to_owned()))
        .condition_expression("attribute_not_exists(pk)")
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::None)
        .build()
        .unwrap();
    TransactWriteItem::builder().put(put).build()
}

/// The business write of an operation that may run again: one more change to order `id`.
fn change_order(table: &str, id: &str) -> TransactWriteItem {
    let update = Update::builder()
        .table_name(table)
        .key("pk", AttributeValue::S(id.to_owned()))
        .update_expression("ADD changes :one")
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .build()
        .unwrap();
    TransactWriteItem::builder().update(update).build()
}

/// The caller's own transaction.
async fn commit(client: &Client, items: Vec<TransactWriteItem>) -> Result<(), String> {
    client
        .transact_write_items()
        .set_transact_items(Some(items))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| idem_dynamodb::aws_sdk_dynamodb::error::DisplayErrorContext(e).to_string())
}

/// Commits `items` as the caller's own transaction, which must succeed.
async fn committed(outbox: &DynamoOutbox, items: Vec<TransactWriteItem>) {
    commit(outbox.client(), items).await.unwrap();
}

/// Commits the business write `business` and the message `m` as the caller's own transaction,
/// which must succeed.
async fn add(outbox: &DynamoOutbox, business: TransactWriteItem, m: &OutboxMessage) {
    committed(outbox, vec![business, outbox.put(m).unwrap()]).await;
}

/// The outbox's raw item of `id` (every attribute), if any.
async fn raw(outbox: &DynamoOutbox, id: MessageId) -> Option<HashMap<String, AttributeValue>> {
    let items = outbox
        .client()
        .scan()
        .table_name(outbox.table())
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default();
    items
        .into_iter()
        .find(|i| i.get("id") == Some(&AttributeValue::S(id.to_string())))
}

/// The messages the outbox holds, sent or not (the layout item aside).
async fn message_items(outbox: &DynamoOutbox) -> Vec<HashMap<String, AttributeValue>> {
    outbox
        .client()
        .scan()
        .table_name(outbox.table())
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default()
        .into_iter()
        .filter(|i| i.get("pk") != Some(&AttributeValue::S("layout".into())))
        .collect()
}

fn kinds(pending: &[idem_core::PendingMessage]) -> Vec<String> {
    pending.iter().map(|p| p.message.kind.clone()).collect()
}

/// **Committed with the business write, or not at all.** A message put in a transaction that
/// commits is pending, as it was put; one put in a transaction whose business condition fails
/// (the order exists) is not in the outbox; a bad message is refused before anything is sent.
#[tokio::test]
async fn a_message_commits_or_is_cancelled_with_the_callers_transaction() {
    let Some(url) = url() else { return };
    let outbox = outbox(&url, 1).await;
    let orders = orders_table(&url).await;

    let placed = message("op-1", "o-1", "placed");
    add(&outbox, new_order(&orders, "o-1"), &placed).await;
    let pending = outbox.pending(10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].message, placed);
    let age = SystemTime::now()
        .duration_since(pending[0].added_at)
        .unwrap_or_default();
    assert!(
        age < Duration::from_secs(60),
        "added_at is the writer's now: {age:?}"
    );

    let again = message("op-2", "o-1", "placed");
    let err = commit(
        outbox.client(),
        vec![new_order(&orders, "o-1"), outbox.put(&again).unwrap()],
    )
    .await
    .unwrap_err();
    assert!(err.contains("TransactionCanceled"), "{err}");
    assert_eq!(
        outbox.pending(10).await.unwrap().len(),
        1,
        "a cancelled transaction's message is in the outbox"
    );
    assert!(raw(&outbox, again.id).await.is_none());

    let mut bad = message("op-3", "o-3", "placed");
    bad.aggregate_type.clear();
    assert!(matches!(outbox.put(&bad), Err(Error::InvalidConfig(_))));
    bad = message("op-3", "o-3", "placed");
    bad.payload = vec![0; idem_core::MAX_OUTBOX_PAYLOAD + 1];
    assert!(matches!(outbox.put(&bad), Err(Error::InvalidConfig(_))));

    // An empty payload and the largest one round-trip.
    let empty =
        OutboxMessage::new(message("op-4", "o-4", "x").id, "order", "o-4", "x", vec![]).unwrap();
    let largest = OutboxMessage::new(
        message("op-5", "o-5", "x").id,
        "order",
        "o-5",
        "x",
        vec![7; idem_core::MAX_OUTBOX_PAYLOAD],
    )
    .unwrap();
    committed(
        &outbox,
        vec![outbox.put(&empty).unwrap(), outbox.put(&largest).unwrap()],
    )
    .await;
    let pending = outbox.pending(10).await.unwrap();
    assert_eq!(pending.len(), 3);
    assert!(pending.iter().any(|p| p.message == empty));
    assert!(pending.iter().any(|p| p.message == largest));
}

/// **A retry adds no second copy, and a sent message stays sent.** An operation that runs its
/// transaction again (a takeover after a crash) puts the same message: the transaction commits
/// and the outbox still holds one copy, at its first place; a different message under the same
/// id does not replace it. Once it was marked sent, a retry's put commits and leaves it sent,
/// untouched.
#[tokio::test]
async fn a_retry_adds_no_second_copy_and_a_sent_message_stays_sent() {
    let Some(url) = url() else { return };
    let outbox = outbox(&url, 1).await;
    let orders = orders_table(&url).await;

    let paid = message("op-1", "o-1", "paid");
    add(&outbox, change_order(&orders, "o-1"), &paid).await;
    let first = outbox.pending(10).await.unwrap();
    add(&outbox, change_order(&orders, "o-1"), &paid).await;
    let mut other = paid.clone();
    other.payload = b"another body".to_vec();
    other.kind = "Refunded".into();
    committed(&outbox, vec![outbox.put(&other).unwrap()]).await;
    let pending = outbox.pending(10).await.unwrap();
    assert_eq!(pending, first, "one copy, as first put, at its first place");
    assert_eq!(message_items(&outbox).await.len(), 1);

    assert_eq!(outbox.mark_sent(&[paid.id]).await.unwrap(), 1);
    let sent = raw(&outbox, paid.id).await.unwrap();
    assert!(sent.contains_key("sent_ms"));
    add(&outbox, change_order(&orders, "o-1"), &paid).await;
    assert!(
        outbox.pending(10).await.unwrap().is_empty(),
        "a retry made a sent message pending again"
    );
    assert_eq!(
        raw(&outbox, paid.id).await.unwrap(),
        sent,
        "the sent item changed"
    );
    assert_eq!(outbox.mark_sent(&[paid.id]).await.unwrap(), 0);
}

/// **In order, across shards.** 50 messages of 5 aggregates, each in a transaction of its own
/// and interleaved, on an outbox of 4 shards: pending returns them in the order they were put
/// (`seq` ascending), a short page the first ones, and once the first 20 are sent the rest in
/// order. The messages sit in more than one shard.
#[tokio::test]
async fn pending_is_in_order_across_shards() {
    let Some(url) = url() else { return };
    let outbox = outbox(&url, 4).await;
    assert_eq!(outbox.shards(), 4);
    let orders = orders_table(&url).await;

    let mut put = Vec::new();
    for n in 0..50 {
        let aggregate = format!("o-{}", n % 5);
        let m = message(&format!("op-{n}"), &aggregate, &format!("m{n:02}"));
        add(&outbox, change_order(&orders, &aggregate), &m).await;
        put.push(m.kind);
    }
    let shards: HashSet<String> = message_items(&outbox)
        .await
        .iter()
        .filter_map(|i| match i.get("pk") {
            Some(AttributeValue::S(s)) => Some(s.clone()),
            _ => None,
        })
        .collect();
    assert!(shards.len() > 1, "50 messages in one shard: {shards:?}");

    let pending = outbox.pending(100).await.unwrap();
    assert_eq!(kinds(&pending), put);
    assert!(pending.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(kinds(&outbox.pending(7).await.unwrap()), put[..7]);

    let first: Vec<MessageId> = pending.iter().take(20).map(|p| p.message.id).collect();
    assert_eq!(outbox.mark_sent(&first).await.unwrap(), 20);
    assert_eq!(kinds(&outbox.pending(100).await.unwrap()), put[20..]);
    assert_eq!(kinds(&outbox.pending(10).await.unwrap()), put[20..30]);
    for aggregate in 0..5 {
        let of_it: Vec<String> = outbox
            .pending(100)
            .await
            .unwrap()
            .into_iter()
            .filter(|p| p.message.aggregate_id == format!("o-{aggregate}"))
            .map(|p| p.message.kind)
            .collect();
        let want: Vec<String> = put[20..]
            .iter()
            .enumerate()
            .filter(|(i, _)| (i + 20) % 5 == aggregate)
            .map(|(_, k)| k.clone())
            .collect();
        assert_eq!(of_it, want, "aggregate o-{aggregate}");
    }
}

/// **Marked once, pruned once old.** Marking two messages marks two, again none, and an id
/// the outbox does not hold marks nothing and creates no item; pruning deletes nothing sent
/// less than an hour ago, then the sent ones (at most `limit` a call), never an unsent one.
#[tokio::test]
async fn mark_sent_marks_once_and_prune_deletes_only_old_sent_messages() {
    let Some(url) = url() else { return };
    let outbox = outbox(&url, 2).await;
    let messages: Vec<OutboxMessage> = (0..6)
        .map(|n| message(&format!("op-{n}"), "o-1", &format!("m{n}")))
        .collect();
    let items = messages.iter().map(|m| outbox.put(m).unwrap()).collect();
    committed(&outbox, items).await;

    let ids: Vec<MessageId> = messages.iter().map(|m| m.id).collect();
    assert_eq!(outbox.mark_sent(&ids[..2]).await.unwrap(), 2);
    assert_eq!(outbox.mark_sent(&ids[..2]).await.unwrap(), 0);
    let unknown = message("op-x", "o-x", "x").id;
    assert_eq!(outbox.mark_sent(&[unknown]).await.unwrap(), 0);
    assert!(
        raw(&outbox, unknown).await.is_none(),
        "marking created an item"
    );
    assert_eq!(outbox.mark_sent(&[]).await.unwrap(), 0);
    assert_eq!(outbox.pending(10).await.unwrap().len(), 4);

    assert_eq!(
        outbox
            .prune_sent(Duration::from_secs(3600), 10)
            .await
            .unwrap(),
        0
    );
    assert_eq!(outbox.prune_sent(Duration::ZERO, 0).await.unwrap(), 0);
    assert_eq!(outbox.mark_sent(&ids[2..5]).await.unwrap(), 3);
    assert_eq!(outbox.prune_sent(Duration::ZERO, 4).await.unwrap(), 4);
    assert_eq!(outbox.prune_sent(Duration::ZERO, 4).await.unwrap(), 1);
    assert_eq!(outbox.prune_sent(Duration::ZERO, 4).await.unwrap(), 0);
    let left = message_items(&outbox).await;
    assert_eq!(left.len(), 1, "the unsent message stays");
    assert_eq!(
        left[0].get("id"),
        Some(&AttributeValue::S(ids[5].to_string()))
    );
    assert_eq!(kinds(&outbox.pending(10).await.unwrap()), ["m5"]);
}

/// **A step carries the message with its record.** Through `dynamo_tx`, the order, its
/// message and the step's record commit in one transaction: a step whose business condition
/// fails leaves no message; a step that commits leaves one, and the operation's replay runs no
/// work and adds none; the dispatcher publishes it.
#[tokio::test]
async fn a_dynamo_tx_step_carries_the_message_with_its_record() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, |b| b).await;
    let outbox = outbox(&url, 1).await;
    let orders = orders_table(&url).await;
    committed(&outbox, vec![new_order(&orders, "o-taken")]).await;
    let engine = Idempotency::new(store.clone());
    let runs = AtomicUsize::new(0);

    let place = |request: &'static str, order: &'static str| {
        let (store, outbox, orders, runs) = (&store, &outbox, &orders, &runs);
        engine
            .call(Key::derive("orders", "", request).unwrap())
            .run_steps(move |steps| async move {
                steps
                    .dynamo_tx(store, "place", || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let placed = message(request, order, "placed");
                        Ok::<_, Error>((
                            order.to_owned(),
                            vec![new_order(orders, order), outbox.put(&placed)?],
                        ))
                    })
                    .await
            })
    };

    let refused = place("req-1", "o-taken").await.unwrap_err();
    assert!(
        matches!(&refused, Error::Store(e) if e.kind() == StoreErrorKind::Query),
        "{refused}"
    );
    assert!(outbox.pending(10).await.unwrap().is_empty());

    let placed = place("req-2", "o-2").await.unwrap();
    assert_eq!(placed, Outcome::Fresh("o-2".to_owned()));
    assert_eq!(outbox.pending(10).await.unwrap().len(), 1);
    let replayed = place("req-2", "o-2").await.unwrap();
    assert_eq!(replayed, Outcome::Replayed("o-2".to_owned()));
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the replay ran no work");
    assert_eq!(outbox.pending(10).await.unwrap().len(), 1);

    let (publisher, mut received) = ChannelPublisher::new(16);
    let dispatcher = Dispatcher::new(
        Arc::new(store),
        Arc::new(outbox.clone()),
        Arc::new(publisher),
        DispatcherConfig::new(),
    )
    .unwrap();
    assert_eq!(dispatcher.run_once().await.unwrap().published, 1);
    let got = received.recv().await.unwrap();
    assert_eq!(got, message("req-2", "o-2", "placed"));
}

/// **The dispatcher publishes every committed message once.** 30 messages of 3 aggregates
/// committed (and one cancelled) on an outbox of 2 shards; a dispatcher with its lease on a
/// DynamoStore publishes them in pages of 7: each committed message once, each aggregate's in
/// order, none of the cancelled transaction; a second run publishes nothing, and pruning with
/// no retention empties the outbox.
#[tokio::test]
async fn the_dispatcher_publishes_every_committed_message_once() {
    let Some(url) = url() else { return };
    let store = fresh_store(&url, |b| b).await;
    let outbox = Arc::new(outbox(&url, 2).await);
    let orders = orders_table(&url).await;
    let mut added = Vec::new();
    for n in 0..30 {
        let aggregate = format!("o-{}", n % 3);
        let m = message(&format!("op-{n}"), &aggregate, &format!("m{n:02}"));
        add(&outbox, change_order(&orders, &aggregate), &m).await;
        added.push(m);
    }
    committed(&outbox, vec![new_order(&orders, "o-9")]).await;
    let cancelled = message("op-cancelled", "o-9", "placed");
    commit(
        outbox.client(),
        vec![new_order(&orders, "o-9"), outbox.put(&cancelled).unwrap()],
    )
    .await
    .unwrap_err();

    let (publisher, mut received) = ChannelPublisher::new(64);
    let dispatcher = Dispatcher::new(
        Arc::new(store),
        outbox.clone(),
        Arc::new(publisher),
        DispatcherConfig::new()
            .batch_size(7)
            .sent_retention(Duration::from_secs(3600)),
    )
    .unwrap();
    let report = dispatcher.run_once().await.unwrap();
    assert_eq!((report.published, report.failed), (30, 0));
    assert!(report.drained && report.pages >= 5, "{report:?}");
    let mut got = Vec::new();
    while let Ok(m) = received.try_recv() {
        got.push(m);
    }
    let ids: HashSet<MessageId> = got.iter().map(|m| m.id).collect();
    assert_eq!((got.len(), ids.len()), (30, 30), "each message once");
    assert!(!ids.contains(&cancelled.id));
    for aggregate in ["o-0", "o-1", "o-2"] {
        let published: Vec<&OutboxMessage> =
            got.iter().filter(|m| m.aggregate_id == aggregate).collect();
        let want: Vec<&OutboxMessage> = added
            .iter()
            .filter(|m| m.aggregate_id == aggregate)
            .collect();
        assert_eq!(published, want, "{aggregate} in order");
    }

    let again = dispatcher.run_once().await.unwrap();
    assert_eq!((again.published, again.pruned), (0, 0));
    assert!(received.try_recv().is_err(), "nothing twice");
    assert_eq!(outbox.prune_sent(Duration::ZERO, 100).await.unwrap(), 30);
    assert!(message_items(&outbox).await.is_empty());
}

/// **Round trips**: `put` sends nothing; `pending` is one Query per shard; `mark_sent` one
/// UpdateItem per id; `prune_sent` one Query per shard and one DeleteItem per message; a build
/// on a table in use is a DescribeTable and a GetItem (its first also a PutItem).
#[tokio::test]
async fn each_call_costs_its_requests() {
    let Some(url) = url() else { return };
    let table = fresh_table();
    DynamoOutbox::create_table(&client(&url), &table)
        .await
        .unwrap();
    let (counted, requests) = counted_client(&url);
    let build = || {
        DynamoOutbox::builder()
            .table(&table)
            .shards(3)
            .build(counted.clone())
    };
    let outbox = build().await.unwrap();
    assert_eq!(
        requests.take(),
        HashMap::from([
            ("DescribeTable".to_owned(), 1),
            ("GetItem".to_owned(), 1),
            ("PutItem".to_owned(), 1),
        ]),
        "first build"
    );
    build().await.unwrap();
    assert_eq!(
        requests.take(),
        HashMap::from([("DescribeTable".to_owned(), 1), ("GetItem".to_owned(), 1)]),
        "build"
    );

    let messages: Vec<OutboxMessage> = (0..4)
        .map(|n| message(&format!("op-{n}"), "o-1", &format!("m{n}")))
        .collect();
    let items = messages.iter().map(|m| outbox.put(m).unwrap()).collect();
    assert!(requests.take().is_empty(), "put sends nothing");
    commit(&counted, items).await.unwrap();
    requests.take();

    assert_eq!(outbox.pending(10).await.unwrap().len(), 4);
    assert_eq!(requests.take(), Requests::only("Query", 3), "pending");
    let ids: Vec<MessageId> = messages.iter().map(|m| m.id).collect();
    assert_eq!(outbox.mark_sent(&ids[..3]).await.unwrap(), 3);
    assert_eq!(
        requests.take(),
        Requests::only("UpdateItem", 3),
        "mark_sent"
    );
    assert_eq!(outbox.prune_sent(Duration::ZERO, 10).await.unwrap(), 3);
    assert_eq!(
        requests.take(),
        HashMap::from([("Query".to_owned(), 3), ("DeleteItem".to_owned(), 3)]),
        "prune_sent"
    );
    assert_eq!(outbox.prune_sent(Duration::ZERO, 10).await.unwrap(), 0);
    assert_eq!(
        requests.take(),
        Requests::only("Query", 3),
        "prune_sent, nothing to do"
    );
}

/// **A request sent again still counts.** The server applies a mark (and a deletion) but its
/// answer is lost, and the SDK sends the request again, whose condition then fails: the mark
/// is still counted (the item holds this call's `mark_n`), and so is the deletion (the item is
/// gone), so the counts are exact.
#[tokio::test]
async fn a_request_sent_again_after_it_took_effect_still_counts() {
    let Some(url) = url() else { return };
    let table = outbox(&url, 1).await.table().to_owned();
    let flaky = LoseAnAnswer::default();
    flaky.arm(&["UpdateItem", "DeleteItem"]);
    let config = idem_test_support::dynamodb::config(&url)
        .retry_config(RetryConfig::standard().with_initial_backoff(Duration::from_millis(1)))
        .interceptor(flaky.clone());
    let outbox = DynamoOutbox::builder()
        .table(table)
        .build(Client::from_conf(config.build()))
        .await
        .unwrap();
    let m = message("op-1", "o-1", "placed");
    committed(&outbox, vec![outbox.put(&m).unwrap()]).await;

    assert_eq!(outbox.mark_sent(&[m.id]).await.unwrap(), 1);
    assert!(
        flaky.lost().iter().any(|op| op == "UpdateItem"),
        "no answer was lost"
    );
    assert_eq!(outbox.mark_sent(&[m.id]).await.unwrap(), 0, "marked once");
    assert_eq!(outbox.prune_sent(Duration::ZERO, 10).await.unwrap(), 1);
    assert!(
        flaky.lost().iter().any(|op| op == "DeleteItem"),
        "no answer was lost"
    );
    assert!(message_items(&outbox).await.is_empty());
}

/// **Builds check the table and keep its shard count.** A missing table is a `Query` error
/// naming it and the helper that creates it; bad names and shard counts are refused; a table
/// in another layout (the store's) is refused; a table keeps the shard count of its first use,
/// and a build asking for another fails while one asking for none takes the table's.
#[tokio::test]
async fn builds_check_the_table_and_keep_its_shard_count() {
    let Some(url) = url() else { return };
    let missing = fresh_table();
    let err = DynamoOutbox::builder()
        .table(&missing)
        .build(client(&url))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Store(e) if e.kind() == StoreErrorKind::Query),
        "{err}"
    );
    assert!(
        err.to_string().contains(&missing)
            && err.to_string().contains("DynamoOutbox::create_table"),
        "{err}"
    );
    for bad in ["ab", "no spaces"] {
        let err = DynamoOutbox::builder()
            .table(bad)
            .build(client(&url))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidConfig(m) if m.contains("3 to 255")),
            "{err}"
        );
    }
    for bad in [0, idem_dynamodb::MAX_DYNAMO_OUTBOX_SHARDS + 1] {
        let err = DynamoOutbox::builder()
            .table(fresh_table())
            .shards(bad)
            .build(client(&url))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    }

    let store_table = orders_table(&url).await;
    let err = DynamoOutbox::builder()
        .table(&store_table)
        .build(client(&url))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig(m) if m.contains("not in the layout")),
        "{err}"
    );

    let first = outbox(&url, 5).await;
    let err = DynamoOutbox::builder()
        .table(first.table())
        .shards(2)
        .build(client(&url))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig(m) if m.contains("has 5 shards")),
        "{err}"
    );
    let later = DynamoOutbox::builder()
        .table(first.table())
        .build(client(&url))
        .await
        .unwrap();
    assert_eq!(later.shards(), 5);
    let default = DynamoOutbox::builder()
        .table(fresh_table())
        .create_table_if_missing(true)
        .build(client(&url))
        .await
        .unwrap();
    assert_eq!(default.shards(), DynamoOutbox::DEFAULT_SHARDS);
}
