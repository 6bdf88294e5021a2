//! The bytes `RemoteStore` sends are the bytes it sent before these types were shared with the
//! server (taken from its own structs at the commit before the split), so a server of either
//! age reads them; and every body reads back as it was written, in MessagePack and JSON.

use std::num::NonZeroU64;

use idem_wire::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn period(ms: u64) -> NonZeroU64 {
    NonZeroU64::new(ms).unwrap()
}

fn ns() -> Option<String> {
    Some("payments".into())
}

#[test]
fn remote_store_requests_keep_their_bytes() {
    let start = StartIn {
        namespace: ns(),
        fenced: true,
        fingerprint_sha256: Some("f1".into()),
        ..StartIn::new("k1", period(30_000))
    };
    assert_eq!(
        hex(&msgpack::to_vec(&start).unwrap()),
        "85a96e616d657370616365a87061796d656e7473a36b6579a26b31ae6c6f636b5f706572696f645f6d73cd7530\
         a666656e636564c3b266696e6765727072696e745f736861323536a26631"
    );
    let complete = CompleteIn {
        namespace: ns(),
        key: "k1".into(),
        token: Some("t1".into()),
        response: b"hello".to_vec(),
        absent: false,
        is_error: true,
        observed: true,
        ttl_ms: period(86_400_000),
        context: None,
        key_retention_ms: 0,
    };
    assert_eq!(
        hex(&msgpack::to_vec(&complete).unwrap()),
        "88a96e616d657370616365a87061796d656e7473a36b6579a26b31a5746f6b656ea27431a8726573706f6e7365\
         c40568656c6c6fa6616273656e74c2a869735f6572726f72c3a86f62736572766564c3a674746c5f6d73ce05265c00"
    );
    let write = |result: Option<&[u8]>| StepWriteIn {
        namespace: ns(),
        key: "k1".into(),
        token: "t1".into(),
        name: "charge".into(),
        position: 2,
        result: result.map(<[u8]>::to_vec),
        ttl_ms: period(60_000),
        on_lapse: None,
    };
    let prefix =
        "87a96e616d657370616365a87061796d656e7473a36b6579a26b31a5746f6b656ea27431a46e616d65\
                  a6636861726765a8706f736974696f6e02a6726573756c74";
    assert_eq!(
        hex(&msgpack::to_vec(&write(None)).unwrap()),
        format!("{prefix}c0a674746c5f6d73cdea60")
    );
    assert_eq!(
        hex(&msgpack::to_vec(&write(Some(b"7"))).unwrap()),
        format!("{prefix}c40137a674746c5f6d73cdea60")
    );
}

/// What a claim that is uncertain on lapse, a completion with a tombstone and a step write
/// that sets what a lapse leaves add: one field each, after the fields sent before, so a
/// request that sets none of them (every request of a `RemoteStore` whose engine keeps no
/// tombstones and claims as before) is the bytes above.
#[test]
fn the_fields_past_the_lease_are_sent_only_when_set() {
    let start = StartIn {
        on_lapse: OnLapse::Uncertain,
        ..StartIn::new("k1", period(30_000))
    };
    assert!(hex(&msgpack::to_vec(&start).unwrap()).ends_with(&hex(b"\xa8on_lapse\xa9uncertain")));
    let json = serde_json::to_value(StartIn::new("k1", period(1))).unwrap();
    assert!(json.get("on_lapse").is_none(), "{json}");
    let complete = CompleteIn {
        namespace: None,
        key: "k1".into(),
        token: None,
        response: Vec::new(),
        absent: false,
        is_error: false,
        observed: false,
        ttl_ms: period(1),
        context: None,
        key_retention_ms: 1000,
    };
    assert!(hex(&msgpack::to_vec(&complete).unwrap())
        .ends_with(&hex(b"\xb0key_retention_ms\xcd\x03\xe8")));
    for body in [
        r#"{"key": "k", "lock_period_ms": 1, "on_lapse": "release"}"#,
        r#"{"key": "k", "lock_period_ms": 1}"#,
    ] {
        assert_eq!(
            serde_json::from_str::<StartIn>(body).unwrap().on_lapse,
            OnLapse::Release
        );
    }
    assert!(serde_json::from_str::<StartIn>(
        r#"{"key": "k", "lock_period_ms": 1, "on_lapse": "never"}"#
    )
    .is_err());
}

fn round_trips<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: T) {
    let packed: T = msgpack::from_slice(&msgpack::to_vec(&value).unwrap()).unwrap();
    assert_eq!(packed, value);
    let json: T = serde_json::from_slice(&serde_json::to_vec(&value).unwrap()).unwrap();
    assert_eq!(json, value);
}

#[test]
fn every_body_reads_back_as_written() {
    let completed = Completed {
        response: b"ok".to_vec(),
        context: Some([("status".to_owned(), "201".to_owned())].into()),
        is_error: true,
        absent: false,
        expires_at_ms: Some(1_800_000_000_000),
    };
    round_trips(StartOut {
        data: Some(completed.clone()),
        ..StartOut::of(StartStatus::Completed)
    });
    round_trips(GetOut {
        data: Some(completed),
        expires_at_ms: Some(1),
        not_retained: Some("too large".into()),
        ..GetOut::of(GetStatus::Completed)
    });
    round_trips(StepsOut {
        attempt: 2,
        steps: vec![
            StepOut {
                name: "a".into(),
                position: 0,
                result: Some(b"1".to_vec()),
            },
            StepOut {
                name: "b".into(),
                position: 1,
                result: None,
            },
        ],
    });
    round_trips(ErrorBody {
        location: Some("ttl_ms".into()),
        ..ErrorBody::new(ErrorType::InvalidInput, "invalid_data", "must be 1 or more")
    });
    round_trips(Empty {});
    round_trips(StartOut {
        since_ms: Some(1_800_000_000_000),
        ..StartOut::of(StartStatus::Expired)
    });
    round_trips(GetOut {
        token: Some("t".into()),
        since_ms: Some(1),
        ..GetOut::of(GetStatus::Uncertain)
    });
    round_trips(ErrorBody {
        stored_policy: Some(1),
        current_policy: Some(2),
        since_ms: Some(3),
        reason: Some("refunded".into()),
        ..ErrorBody::new(ErrorType::OperationError, "policy_changed", "d")
    });
    round_trips(FindUncertainOut {
        operations: vec![UncertainOut {
            key: "k".into(),
            token: "t".into(),
            since_ms: 1,
        }],
    });
    round_trips(ResolveIn {
        key: "00".repeat(32),
        resolution: ResolutionKind::Completed,
        response: Some(b"ok".to_vec()),
        context: None,
        reason: None,
    });
}

#[test]
fn a_refused_name_fails_at_its_field() {
    let e = serde_json::from_str::<KeyIn>(r#"{"namespace": "a:b", "key": "k"}"#).unwrap_err();
    assert!(e.to_string().starts_with("NamespaceName must match"), "{e}");
    let e = serde_json::from_str::<KeyIn>(r#"{"key": ""}"#).unwrap_err();
    assert!(e.to_string().starts_with("String too short"), "{e}");
    let e = serde_json::from_str::<RenewIn>(r#"{"key": "k", "token": "t", "lock_period_ms": 0}"#)
        .unwrap_err();
    assert!(e.to_string().contains("nonzero"), "{e}");
}

#[test]
fn an_answer_with_fields_a_later_server_adds_still_reads() {
    let empty: Empty =
        msgpack::from_slice(&msgpack::to_vec(&PruneOut { pruned: 1 }).unwrap()).unwrap();
    assert_eq!(empty, Empty {});
}
