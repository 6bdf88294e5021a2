//! The HTTP layer's JSON body fingerprints never collapse two different requests and always
//! match the same request written differently: property tests against a model of JSON text and
//! of when two bodies are the same request. (Moved from idem-core's fingerprint_props.rs, whose
//! `Fingerprint::of_json` half stays there.)
#![cfg(feature = "http")]

use idem::{Fingerprint, MAX_FINGERPRINT_DEPTH};
use proptest::prelude::*;

/// Far deeper than the bound: a body that would overflow the stack of a recursive reader.
const DEEP: usize = 100_000;

use idem_test_support::props::{big_u128, config, roll, shuffle};

// ---------------------------------------------------------------------------------------------
// The HTTP layer's JSON body fingerprints: a model of JSON text and of when two bodies are the
// same request.
// ---------------------------------------------------------------------------------------------

mod http_body {
    use std::collections::BTreeMap;

    use http::{Method, Uri};
    use idem::http::BodyFingerprint;

    use super::*;

    fn body_fp(mode: &BodyFingerprint, body: &[u8]) -> Fingerprint {
        mode.of(&Method::POST, &Uri::from_static("/payments"), body)
    }

    fn json_fp(body: &str) -> Fingerprint {
        body_fp(&BodyFingerprint::Json, body.as_bytes())
    }

    /// A JSON value as a request means it: numbers by their text, objects by their members.
    #[derive(Debug, Clone, PartialEq)]
    enum Doc {
        Null,
        Bool(bool),
        Num(String),
        Str(String),
        Arr(Vec<Doc>),
        Obj(BTreeMap<String, Doc>),
    }

    /// `doc` with one node, deep inside or at the top, replaced by a slightly different one
    /// (or, rarely, an equal one).
    fn nudge(doc: &Doc, seed: &mut u64) -> Doc {
        let r = roll(seed);
        let descend = !r.is_multiple_of(4);
        let mut doc = doc.clone();
        match &mut doc {
            Doc::Arr(items) if descend && !items.is_empty() => {
                let i = (r >> 4) as usize % items.len();
                items[i] = nudge(&items[i], seed);
            }
            Doc::Obj(members) if descend && !members.is_empty() => {
                let key = members
                    .keys()
                    .nth((r >> 4) as usize % members.len())
                    .cloned();
                if let Some(value) = key.and_then(|k| members.get_mut(&k)) {
                    *value = nudge(value, seed);
                }
            }
            _ => {
                let pick = (roll(seed) % 3) as usize;
                return match doc {
                    Doc::Num(n) => {
                        let flipped = match n.strip_prefix('-') {
                            Some(positive) => positive.to_owned(),
                            None => format!("-{n}"),
                        };
                        let exponent = if n.contains(['e', 'E']) {
                            format!("{n}0")
                        } else {
                            format!("{n}e0")
                        };
                        // The length is sometimes the same number ("1"), usually another.
                        Doc::Num([flipped, exponent, n.len().to_string()][pick].clone())
                    }
                    Doc::Str(s) => [
                        Doc::Str(format!("{s} ")),
                        Doc::Str(s.to_uppercase()),
                        Doc::Num(s.len().to_string()),
                    ][pick]
                        .clone(),
                    Doc::Null => {
                        [Doc::Bool(false), Doc::Str("null".into()), Doc::Arr(vec![])][pick].clone()
                    }
                    Doc::Bool(b) => {
                        [Doc::Bool(!b), Doc::Str(b.to_string()), Doc::Null][pick].clone()
                    }
                    Doc::Arr(items) => {
                        let mut longer = items.clone();
                        longer.push(Doc::Null);
                        let indexed = items
                            .iter()
                            .enumerate()
                            .map(|(i, v)| (i.to_string(), v.clone()));
                        [
                            Doc::Arr(longer),
                            Doc::Arr(items.iter().rev().cloned().collect()),
                            Doc::Obj(indexed.collect()),
                        ][pick]
                            .clone()
                    }
                    Doc::Obj(members) => {
                        let mut more = members.clone();
                        more.insert("extra".into(), Doc::Null);
                        let mut fewer = members.clone();
                        fewer.pop_last();
                        [
                            Doc::Obj(more),
                            Doc::Obj(fewer),
                            Doc::Arr(members.values().cloned().collect()),
                        ][pick]
                            .clone()
                    }
                };
            }
        }
        doc
    }

    /// Writes `doc` as JSON text with random whitespace, member order and string escapes.
    fn write(doc: &Doc, seed: &mut u64, out: &mut String) {
        let space = [" ", "", "\n", "\t", "\r\n  ", ""][roll(seed) as usize % 6].to_owned();
        out.push_str(&space);
        match doc {
            Doc::Null => out.push_str("null"),
            Doc::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Doc::Num(n) => out.push_str(n),
            Doc::Str(s) => write_str(s, seed, out),
            Doc::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, seed, out);
                }
                out.push_str(&space);
                out.push(']');
            }
            Doc::Obj(members) => {
                let mut members: Vec<_> = members.iter().collect();
                shuffle(&mut members, seed);
                out.push('{');
                for (i, (key, value)) in members.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&space);
                    write_str(key, seed, out);
                    out.push_str(&space);
                    out.push(':');
                    write(value, seed, out);
                }
                out.push_str(&space);
                out.push('}');
            }
        }
        out.push_str(&space);
    }

    /// A string, each character escaped (`\uXXXX`, surrogate pairs beyond the BMP) or not at
    /// random, where JSON allows both.
    fn write_str(s: &str, seed: &mut u64, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            *seed = seed.wrapping_mul(31).wrapping_add(11);
            let must = c == '"' || c == '\\' || c < ' ';
            if must || (*seed >> 7).is_multiple_of(3) {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{:04X}", unit));
                }
            } else {
                out.push(c);
            }
        }
        out.push('"');
    }

    fn text(doc: &Doc, mut seed: u64) -> String {
        let mut out = String::new();
        write(doc, &mut seed, &mut out);
        out
    }

    /// Number texts that a `serde_json::Value` would round together, and others.
    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "0",
                "-0",
                "1",
                "1.0",
                "1e2",
                "1E2",
                "100",
                "0.1",
                "0.10000000000000000001",
                "0.1000000000000000000100",
                "18446744073709551615",
                "18446744073709551616",
                "18446744073709551617",
                "100000000000000000000",
                "100000000000000000001",
            ])
            .prop_map(String::from),
            (big_u128(), any::<bool>(), prop::option::of(0u64..1000)).prop_map(|(n, neg, frac)| {
                let sign = if neg { "-" } else { "" };
                match frac {
                    Some(f) => format!("{sign}{n}.{f}"),
                    None => format!("{sign}{n}"),
                }
            }),
        ]
    }

    fn doc() -> impl Strategy<Value = Doc> {
        let string = prop_oneof![
            prop::sample::select(vec!["", "1", "a", "A", "a b", "\"", "é", "😀", "\u{1f}"])
                .prop_map(String::from),
            prop::collection::vec(any::<char>(), 0..4).prop_map(String::from_iter),
        ];
        let leaf = prop_oneof![
            Just(Doc::Null),
            any::<bool>().prop_map(Doc::Bool),
            number().prop_map(Doc::Num),
            string.clone().prop_map(Doc::Str),
        ];
        leaf.prop_recursive(4, 32, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Doc::Arr),
                prop::collection::btree_map(string.clone(), inner, 0..4).prop_map(Doc::Obj),
            ]
        })
    }

    proptest! {
        #![proptest_config(config())]

        /// Two bodies share a fingerprint exactly when they are the same JSON value, however
        /// each is spaced, ordered and escaped.
        #[test]
        fn same_fingerprint_iff_same_body(a in doc(), b in doc(), s: u64, t: u64) {
            let (x, y) = (text(&a, s), text(&b, t));
            prop_assert_eq!(json_fp(&x) == json_fp(&y), a == b, "{} vs {}", x, y);
        }

        /// A body and a near miss (one value changed a little, anywhere in it) share a
        /// fingerprint exactly when they are the same JSON value.
        #[test]
        fn near_miss_bodies_differ(a in doc(), mut seed: u64, s: u64, t: u64) {
            let b = nudge(&a, &mut seed);
            let (x, y) = (text(&a, s), text(&b, t));
            prop_assert_eq!(json_fp(&x) == json_fp(&y), a == b, "{} vs {}", x, y);
        }

        /// The same body spaced, ordered and escaped two ways: one fingerprint.
        #[test]
        fn rewritten_body_keeps_its_fingerprint(a in doc(), s: u64, t: u64) {
            prop_assert_eq!(json_fp(&text(&a, s)), json_fp(&text(&a, t)));
        }

        /// Integers beyond 2^64 and past f64 precision, sent as text, never share one.
        #[test]
        fn distinct_big_integers_differ(x in big_u128()) {
            let fields = BodyFingerprint::JsonFields(vec!["/amount".into()]);
            let body = |n: u128| format!(r#"{{"amount": {n}, "note": "x"}}"#);
            prop_assert_ne!(json_fp(&body(x)), json_fp(&body(x + 1)));
            prop_assert_ne!(
                body_fp(&fields, body(x).as_bytes()),
                body_fp(&fields, body(x + 1).as_bytes())
            );
        }

        /// Only the selected field counts: equal exactly when it is the same value (absent and
        /// null are different values), whatever else the bodies hold.
        #[test]
        fn selected_field_decides(
            a in prop::option::of(doc()),
            b in prop::option::of(doc()),
            rest_a in doc(),
            rest_b in doc(),
            s: u64,
        ) {
            let fields = BodyFingerprint::JsonFields(vec!["/amount".into()]);
            let body = |field: &Option<Doc>, rest: &Doc| {
                let mut members = BTreeMap::from([("rest".to_owned(), rest.clone())]);
                if let Some(field) = field {
                    members.insert("amount".into(), field.clone());
                }
                text(&Doc::Obj(members), s)
            };
            let (x, y) = (body(&a, &rest_a), body(&b, &rest_b));
            prop_assert_eq!(
                body_fp(&fields, x.as_bytes()) == body_fp(&fields, y.as_bytes()),
                a == b
            );
        }
    }

    #[test]
    fn absent_differs_from_null() {
        let fields = BodyFingerprint::JsonFields(vec!["/amount".into()]);
        assert_ne!(
            body_fp(&fields, br#"{"amount":null}"#),
            body_fp(&fields, b"{}")
        );
    }

    /// Too deep, duplicate keys, not JSON: the body counts by its bytes, exactly as
    /// `BodyFingerprint::Bytes` counts it (which never collapses two different bodies).
    #[test]
    fn unreadable_bodies_count_by_bytes() {
        let deep = "[".repeat(DEEP) + &"]".repeat(DEEP);
        let deep_objects = r#"{"a":"#.repeat(DEEP) + "1" + &"}".repeat(DEEP);
        let at_bound = "[".repeat(MAX_FINGERPRINT_DEPTH) + &"]".repeat(MAX_FINGERPRINT_DEPTH);
        let fields = BodyFingerprint::JsonFields(vec!["/a".into()]);
        for body in [
            deep.as_str(),
            deep_objects.as_str(),
            r#"{"a":1,"a":2}"#,
            r#"{"a":2,"a":1}"#,
            r#"{"a":1,"b":[{"c":1,"c":1}]}"#,
            "{\"a\":1,}",
            "a=1&b=2",
            "\"\\ud800\"",
        ] {
            let bytes = body_fp(&BodyFingerprint::Bytes, body.as_bytes());
            assert_eq!(json_fp(body), bytes, "{body:.40}");
            assert_eq!(body_fp(&fields, body.as_bytes()), bytes, "{body:.40}");
        }
        assert_ne!(json_fp(r#"{"a":1,"a":2}"#), json_fp(r#"{"a":2}"#));
        assert_ne!(json_fp(r#"{"a":1,"a":2}"#), json_fp(r#"{"a":2,"a":1}"#));
        assert_ne!(
            json_fp(&at_bound),
            body_fp(&BodyFingerprint::Bytes, at_bound.as_bytes())
        );
    }
}
