//! The OpenAPI document (openapi.json, served at `/api/v1.openapi.json`) says what the types of
//! idem-wire are: each route names the request and answer schemas the server decodes and
//! answers with, and each schema has exactly the fields of its Rust type, with their JSON
//! types, bounds and patterns, and marks required exactly the fields the type cannot decode
//! without. The document is written by hand (its descriptions are Diom's and ours) and this
//! test walks it; a field added to a type without the document, or the other way round, fails
//! here.

use std::collections::BTreeSet;
use std::num::NonZeroU64;

use idem_wire::names::{
    key_refusal, namespace_refusal, KEY_PATTERN, MAX_NAME_LEN, NAMESPACE_PATTERN,
};
use idem_wire::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

/// Decodes JSON as a type and encodes it again (through MessagePack on the way).
type Reread = Box<dyn Fn(&Value) -> Result<Value, String>>;

/// A type of idem-wire and the schema that describes it.
struct Case {
    schema: &'static str,
    /// A value with every field set, as JSON.
    full: Value,
    /// A value with every field that may be left out left out, as JSON.
    minimal: Value,
    reread: Reread,
}

fn case<T: Serialize + DeserializeOwned + 'static>(
    schema: &'static str,
    full: T,
    minimal: T,
) -> Case {
    Case {
        schema,
        full: serde_json::to_value(&full).unwrap(),
        minimal: serde_json::to_value(&minimal).unwrap(),
        reread: Box::new(|json| {
            let value: T = serde_json::from_value(json.clone()).map_err(|e| e.to_string())?;
            let packed = msgpack::to_vec(&value).map_err(|e| e.to_string())?;
            let value: T = msgpack::from_slice(&packed).map_err(|e| e.to_string())?;
            Ok(serde_json::to_value(&value).unwrap())
        }),
    }
}

fn period(ms: u64) -> NonZeroU64 {
    NonZeroU64::new(ms).unwrap()
}

const KEY: &str = "orders/1:charge";
const TOKEN: &str = "0123456789abcdef0123456789abcdef";
const SHA256: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn completed() -> Completed {
    Completed {
        response: b"ok".to_vec(),
        context: Some([("status".to_owned(), "201".to_owned())].into()),
        is_error: true,
        absent: true,
        expires_at_ms: Some(1_800_000_000_000),
    }
}

fn uncertain() -> UncertainOut {
    UncertainOut {
        key: KEY.into(),
        token: TOKEN.into(),
        since_ms: 1_800_000_000_000,
    }
}

fn listed() -> ListedUncertain {
    ListedUncertain {
        namespace: Some("payments".into()),
        caller: Some("caller:billing".into()),
        client_key: Some(KEY.into()),
        ..listed_unnamed()
    }
}

fn listed_unnamed() -> ListedUncertain {
    ListedUncertain {
        key: SHA256.into(),
        token: TOKEN.into(),
        since_ms: 1_800_000_000_000,
        namespace: None,
        caller: None,
        client_key: None,
    }
}

fn cases() -> Vec<Case> {
    let ns = || Some("payments".to_owned());
    vec![
        case(
            "Error",
            ErrorBody {
                location: Some("ttl_ms".into()),
                since_ms: Some(1_800_000_000_000),
                reason: Some("refunded by hand".into()),
                stored_policy: Some(1),
                current_policy: Some(u32::MAX),
                ..ErrorBody::new(ErrorType::InvalidInput, "invalid_data", "d")
            },
            ErrorBody::new(ErrorType::ServerError, "corrupt", "d"),
        ),
        case(
            "StartIn",
            StartIn {
                namespace: ns(),
                fenced: true,
                fingerprint: Some("POST /charge".into()),
                fingerprint_sha256: Some(SHA256.into()),
                on_lapse: OnLapse::Uncertain,
                ..StartIn::new(KEY, period(30_000))
            },
            StartIn::new(KEY, period(30_000)),
        ),
        case(
            "StartOut",
            StartOut {
                data: Some(completed()),
                token: Some(TOKEN.into()),
                retry_after_ms: Some(5),
                lease_left_ms: Some(7),
                not_retained: Some("larger than the store keeps".into()),
                since_ms: Some(1_800_000_000_000),
                ..StartOut::of(StartStatus::Uncertain)
            },
            StartOut::of(StartStatus::Locked),
        ),
        case("Completed", completed(), Completed::default()),
        case(
            "CompleteIn",
            CompleteIn {
                namespace: ns(),
                key: KEY.into(),
                token: Some(TOKEN.into()),
                response: b"ok".to_vec(),
                absent: false,
                is_error: true,
                observed: true,
                ttl_ms: period(60_000),
                context: Some([("status".to_owned(), "201".to_owned())].into()),
                key_retention_ms: 315_360_000_000,
            },
            CompleteIn {
                namespace: None,
                key: KEY.into(),
                token: None,
                response: Vec::new(),
                absent: false,
                is_error: false,
                observed: false,
                ttl_ms: period(1),
                context: None,
                key_retention_ms: 0,
            },
        ),
        case(
            "AbortIn",
            AbortIn {
                namespace: ns(),
                key: KEY.into(),
                token: Some(TOKEN.into()),
            },
            AbortIn {
                namespace: None,
                key: KEY.into(),
                token: None,
            },
        ),
        case(
            "RenewIn",
            RenewIn {
                namespace: ns(),
                key: KEY.into(),
                token: TOKEN.into(),
                lock_period_ms: period(315_360_000_000),
            },
            RenewIn {
                namespace: None,
                key: KEY.into(),
                token: TOKEN.into(),
                lock_period_ms: period(1),
            },
        ),
        case("Empty", Empty {}, Empty {}),
        case(
            "ConfigureNamespaceIn",
            ConfigureNamespaceIn {
                name: "payments".into(),
                require_token: Some(true),
            },
            ConfigureNamespaceIn {
                name: "payments".into(),
                require_token: None,
            },
        ),
        case(
            "GetNamespaceIn",
            GetNamespaceIn {
                name: "payments".into(),
            },
            GetNamespaceIn {
                name: "payments".into(),
            },
        ),
        case(
            "NamespaceOut",
            NamespaceOut {
                name: "payments".into(),
                created: 1,
                updated: 2,
                require_token: true,
            },
            NamespaceOut {
                name: "payments".into(),
                created: 1,
                updated: 1,
                require_token: false,
            },
        ),
        case("PingOut", PingOut { ok: true }, PingOut { ok: true }),
        case(
            "KeyIn",
            KeyIn {
                namespace: ns(),
                key: KEY.into(),
            },
            KeyIn {
                namespace: None,
                key: KEY.into(),
            },
        ),
        case(
            "GetOut",
            GetOut {
                token: Some(TOKEN.into()),
                lease_until_ms: Some(1),
                fingerprint_sha256: Some(SHA256.into()),
                data: Some(completed()),
                expires_at_ms: Some(2),
                not_retained: Some("larger than the limit".into()),
                since_ms: Some(3),
                abandoned: Some("refunded by hand".into()),
                ..GetOut::of(GetStatus::Expired)
            },
            GetOut::of(GetStatus::Absent),
        ),
        case(
            "EvictOut",
            EvictOut { evicted: true },
            EvictOut { evicted: false },
        ),
        case("PruneIn", PruneIn { limit: u32::MAX }, PruneIn { limit: 0 }),
        case("PruneOut", PruneOut { pruned: 3 }, PruneOut { pruned: 0 }),
        case(
            "StepsBeginIn",
            StepsBeginIn {
                namespace: ns(),
                key: KEY.into(),
                token: TOKEN.into(),
                ttl_ms: period(60_000),
            },
            StepsBeginIn {
                namespace: None,
                key: KEY.into(),
                token: TOKEN.into(),
                ttl_ms: period(1),
            },
        ),
        case(
            "StepWriteIn",
            StepWriteIn {
                namespace: ns(),
                key: KEY.into(),
                token: TOKEN.into(),
                name: "charge".into(),
                position: 1,
                result: Some(b"7".to_vec()),
                ttl_ms: period(60_000),
                on_lapse: Some(OnLapse::Uncertain),
            },
            StepWriteIn {
                namespace: None,
                key: KEY.into(),
                token: TOKEN.into(),
                name: "c".into(),
                position: 0,
                result: None,
                ttl_ms: period(1),
                on_lapse: None,
            },
        ),
        case(
            "TakeUncertainIn",
            TakeUncertainIn {
                namespace: ns(),
                key: KEY.into(),
                token: TOKEN.into(),
                lock_period_ms: period(315_360_000_000),
            },
            TakeUncertainIn {
                namespace: None,
                key: KEY.into(),
                token: TOKEN.into(),
                lock_period_ms: period(1),
            },
        ),
        case(
            "TakeUncertainOut",
            TakeUncertainOut {
                token: TOKEN.into(),
            },
            TakeUncertainOut {
                token: TOKEN.into(),
            },
        ),
        case(
            "FindUncertainIn",
            FindUncertainIn {
                namespace: ns(),
                after: Some(KEY.into()),
                limit: MAX_PAGE,
            },
            FindUncertainIn {
                namespace: None,
                after: None,
                limit: 1,
            },
        ),
        case("UncertainOut", uncertain(), uncertain()),
        case(
            "FindUncertainOut",
            FindUncertainOut {
                operations: vec![uncertain()],
            },
            FindUncertainOut {
                operations: Vec::new(),
            },
        ),
        case(
            "ListUncertainIn",
            ListUncertainIn {
                after: Some(SHA256.into()),
                limit: MAX_PAGE,
            },
            ListUncertainIn {
                after: None,
                limit: 1,
            },
        ),
        case("ListedUncertain", listed(), listed_unnamed()),
        case(
            "ListUncertainOut",
            ListUncertainOut {
                operations: vec![listed(), listed_unnamed()],
            },
            ListUncertainOut {
                operations: Vec::new(),
            },
        ),
        case(
            "ResolveIn",
            ResolveIn {
                key: SHA256.into(),
                resolution: ResolutionKind::Completed,
                response: Some(b"ok".to_vec()),
                context: Some([("status".to_owned(), "201".to_owned())].into()),
                reason: Some("r".repeat(MAX_REASON_LEN)),
            },
            ResolveIn {
                key: SHA256.into(),
                resolution: ResolutionKind::Failed,
                response: None,
                context: None,
                reason: None,
            },
        ),
        case(
            "StepsOut",
            StepsOut {
                attempt: 2,
                steps: vec![StepOut {
                    name: "charge".into(),
                    position: 0,
                    result: Some(b"7".to_vec()),
                }],
            },
            StepsOut {
                attempt: 1,
                steps: vec![StepOut {
                    name: "charge".into(),
                    position: 0,
                    result: None,
                }],
            },
        ),
    ]
}

fn document() -> Value {
    serde_json::from_str(idem_server::OPENAPI).expect("openapi.json is JSON")
}

/// The schema `schema` points at, following a `$ref` into the document's components.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let name = reference
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("a $ref outside the schemas: {reference}"));
            &doc["components"]["schemas"][name]
        }
        None => schema,
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn names(object: &Map<String, Value>) -> BTreeSet<String> {
    object.keys().cloned().collect()
}

/// The problems of `value` (at `at`) against `schema`.
fn check(doc: &Value, schema: &Value, value: &Value, at: &str, problems: &mut Vec<String>) {
    let schema = resolve(doc, schema);
    let mut say = |what: String| problems.push(format!("{at}: {what}"));
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => {
            say(format!("the schema gives no type: {schema}"));
            return;
        }
    };
    if !types.contains(&json_type(value)) {
        say(format!(
            "{value} is a {}, the schema says {types:?}",
            json_type(value)
        ));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        say(format!("{value} is not one of {allowed:?}"));
    }
    if let Some(n) = value.as_u64()
        && (schema
            .get("minimum")
            .and_then(Value::as_u64)
            .is_some_and(|min| n < min)
            || schema
                .get("maximum")
                .and_then(Value::as_u64)
                .is_some_and(|max| n > max))
    {
        say(format!("{n} is out of the schema's bounds"));
    }
    if let Some(text) = value.as_str() {
        let len = text.len() as u64;
        if schema
            .get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|min| len < min)
            || schema
                .get("maxLength")
                .and_then(Value::as_u64)
                .is_some_and(|max| len > max)
        {
            say(format!("{text:?} is out of the schema's lengths"));
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
            && let Some(why) = pattern_refusal(pattern, text)
        {
            say(why);
        }
    }
    if let (Some(items), Some(values)) = (schema.get("items"), value.as_array()) {
        for (i, item) in values.iter().enumerate() {
            check(doc, items, item, &format!("{at}[{i}]"), problems);
        }
    }
    if let Some(object) = value.as_object() {
        if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
            for (name, item) in object {
                check(doc, extra, item, &format!("{at}.{name}"), problems);
            }
        } else {
            check_object(doc, schema, object, at, problems);
        }
    }
}

/// An object's fields against the schema's properties: the same names, each value of its
/// property's schema, and every required one present.
fn check_object(
    doc: &Value,
    schema: &Value,
    object: &Map<String, Value>,
    at: &str,
    problems: &mut Vec<String>,
) {
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    for (name, value) in object {
        match properties.get(name) {
            Some(property) => check(doc, property, value, &format!("{at}.{name}"), problems),
            None => problems.push(format!("{at}: the type has `{name}`, the schema does not")),
        }
    }
    for name in required(schema) {
        if !object.contains_key(&name) {
            problems.push(format!(
                "{at}: `{name}` is required but the type left it out"
            ));
        }
    }
}

fn required(schema: &Value) -> Vec<String> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `text` is what `pattern` allows: the patterns the document uses, each checked
/// with the rule the code keeps (the name patterns with idem-wire's own checks).
fn pattern_refusal(pattern: &str, text: &str) -> Option<String> {
    let hex = |digits: usize| {
        (text.len() != digits || !text.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| format!("{text:?} is not {digits} hexadecimal digits"))
    };
    match pattern {
        KEY_PATTERN => key_refusal(text),
        NAMESPACE_PATTERN => namespace_refusal(text),
        "^[0-9a-fA-F]{32}$" => hex(32),
        "^[0-9a-fA-F]{64}$" => hex(64),
        other => Some(format!(
            "the test does not know the pattern {other:?}: add it here"
        )),
    }
}

#[test]
fn every_schema_has_the_fields_of_its_type() {
    let doc = document();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let cases = cases();
    let checked: BTreeSet<&str> = cases.iter().map(|c| c.schema).collect();
    let documented: BTreeSet<&str> = schemas.keys().map(String::as_str).collect();
    assert_eq!(checked, documented, "each schema is checked against a type");
    let mut problems = Vec::new();
    for case in &cases {
        let schema = &schemas[case.schema];
        let full = case.full.as_object().unwrap();
        let properties = schema
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if names(full) != names(&properties) {
            problems.push(format!(
                "{}: the type's fields {:?}, the schema's {:?}",
                case.schema,
                names(full),
                names(&properties)
            ));
        }
        check(&doc, schema, &case.full, case.schema, &mut problems);
        check(
            &doc,
            schema,
            &case.minimal,
            &format!("{} (minimal)", case.schema),
            &mut problems,
        );
    }
    assert!(
        problems.is_empty(),
        "openapi.json and idem-wire differ:\n{}",
        problems.join("\n")
    );
}

/// `required` in the document means what the type always writes (checked on the full and the
/// minimal values above) and what a reader may count on; every other field the type decodes
/// without. And each value reads back as it was, through JSON and MessagePack.
#[test]
fn the_fields_not_required_may_be_left_out() {
    let doc = document();
    let mut problems = Vec::new();
    for case in cases() {
        let schema = &doc["components"]["schemas"][case.schema];
        for value in [&case.full, &case.minimal] {
            match (case.reread)(value) {
                Ok(again) if again == *value => {}
                other => problems.push(format!("{}: {value} reads back as {other:?}", case.schema)),
            }
        }
        let required = required(schema);
        let only_required: Map<String, Value> = case
            .full
            .as_object()
            .unwrap()
            .iter()
            .filter(|(name, _)| required.contains(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        if let Err(e) = (case.reread)(&Value::Object(only_required)) {
            problems.push(format!(
                "{}: a field the schema does not require is needed to decode: {e}",
                case.schema
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "openapi.json and idem-wire differ:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_route_names_its_types() {
    let doc = document();
    let routes = [
        (route::START, Some("StartIn"), "StartOut"),
        (route::COMPLETE, Some("CompleteIn"), "Empty"),
        (route::ABORT, Some("AbortIn"), "Empty"),
        (route::RENEW, Some("RenewIn"), "Empty"),
        (route::GET, Some("KeyIn"), "GetOut"),
        (route::EVICT, Some("KeyIn"), "EvictOut"),
        (route::PRUNE, Some("PruneIn"), "PruneOut"),
        (route::STEPS_BEGIN, Some("StepsBeginIn"), "StepsOut"),
        (route::STEPS_WRITE, Some("StepWriteIn"), "Empty"),
        (
            route::UNCERTAIN_TAKE,
            Some("TakeUncertainIn"),
            "TakeUncertainOut",
        ),
        (
            route::UNCERTAIN_FIND,
            Some("FindUncertainIn"),
            "FindUncertainOut",
        ),
        (
            route::UNCERTAIN_LIST,
            Some("ListUncertainIn"),
            "ListUncertainOut",
        ),
        (route::UNCERTAIN_RESOLVE, Some("ResolveIn"), "Empty"),
        (
            route::NAMESPACE_CONFIGURE,
            Some("ConfigureNamespaceIn"),
            "NamespaceOut",
        ),
        (route::NAMESPACE_GET, Some("GetNamespaceIn"), "NamespaceOut"),
        (route::PING, None, "PingOut"),
    ];
    let schema_of = |content: &Value| -> BTreeSet<String> {
        content
            .as_object()
            .map(|types| {
                types
                    .values()
                    .filter_map(|t| t["schema"]["$ref"].as_str())
                    .map(|r| r.trim_start_matches("#/components/schemas/").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let one = |name: &str| BTreeSet::from([name.to_owned()]);
    for (path, request, answer) in routes {
        let operation = &doc["paths"][path]["post"];
        assert!(operation.is_object(), "{path} is not in the document");
        let content = &operation["requestBody"]["content"];
        match request {
            Some(request) => {
                assert_eq!(schema_of(content), one(request), "{path}'s request");
                let types: BTreeSet<&str> = content
                    .as_object()
                    .unwrap()
                    .keys()
                    .map(String::as_str)
                    .collect();
                assert_eq!(
                    types,
                    BTreeSet::from(["application/json", msgpack::CONTENT_TYPE]),
                    "{path}"
                );
            }
            None => assert!(content.is_null(), "{path} takes no body"),
        }
        let responses = operation["responses"].as_object().unwrap();
        for (status, response) in responses {
            let expected = if status == "200" { answer } else { "Error" };
            assert_eq!(
                schema_of(&response["content"]),
                one(expected),
                "{path} answering {status}"
            );
        }
    }
    let documented: BTreeSet<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .filter(|path| *path != "/metrics")
        .collect();
    let served: BTreeSet<&str> = routes.iter().map(|(path, _, _)| *path).collect();
    assert_eq!(documented, served, "the document's routes are idem-wire's");
    let name_schema = &doc["components"]["schemas"]["KeyIn"]["properties"]["key"];
    assert_eq!(name_schema["maxLength"], MAX_NAME_LEN);
}
