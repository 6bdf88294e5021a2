//! The request fingerprint: method, path and query, and (a chosen view of) the body.

use std::collections::BTreeMap;

use http::{Method, Uri};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::key::{canonical_json as canonical, Fingerprint};

/// Which view of the request body goes into the request fingerprint.
///
/// The fingerprint always covers the method and the path with its query; a retry whose
/// fingerprint differs from the first request's gets `422 Unprocessable Content`.
///
/// ```
/// use idem_core::http::BodyFingerprint;
/// // Only the amount and currency must match on a retry; a changed `note` is accepted.
/// let fp = BodyFingerprint::JsonFields(vec!["/amount".into(), "/currency".into()]);
/// assert_ne!(fp, BodyFingerprint::default());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyFingerprint {
    /// The body's exact bytes (the default).
    #[default]
    Bytes,
    /// The body as canonical JSON: object key order and whitespace do not matter. A body that
    /// is not JSON counts by its bytes.
    Json,
    /// Only the values at these JSON Pointers (RFC 6901, such as `/amount` or
    /// `/customer/id`), canonicalised as for [`Json`](Self::Json); everything else in the body may
    /// change between retries. An absent field differs from a field that is `null`. A body that is
    /// not JSON counts by its bytes.
    JsonFields(Vec<String>),
    /// The body does not count, only the method and the path with its query (for bodies that
    /// differ on every send, such as multipart uploads with random boundaries).
    Ignore,
}

impl BodyFingerprint {
    /// The fingerprint of a request: SHA-256 over the length-prefixed method, path-and-query
    /// and the chosen view of the body, each view tagged so two views never collide.
    pub(crate) fn of(&self, method: &Method, uri: &Uri, body: &[u8]) -> Fingerprint {
        let mut h = Sha256::new();
        h.update(b"idem-http/v1");
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        for part in [method.as_str().as_bytes(), path.as_bytes()] {
            put(&mut h, part);
        }
        let json = || serde_json::from_slice::<Value>(body).ok();
        match self {
            BodyFingerprint::Bytes => tagged(&mut h, b'b', body),
            BodyFingerprint::Ignore => h.update([b'n']),
            BodyFingerprint::Json => match json() {
                Some(v) => tagged(&mut h, b'j', &canonical(&v)),
                None => tagged(&mut h, b'b', body),
            },
            BodyFingerprint::JsonFields(pointers) => match json() {
                Some(v) => {
                    let picked: BTreeMap<&str, &Value> = pointers
                        .iter()
                        .filter_map(|p| v.pointer(p).map(|found| (p.as_str(), found)))
                        .collect();
                    let mut out = Vec::new();
                    for (pointer, value) in picked {
                        put_vec(&mut out, pointer.as_bytes());
                        put_vec(&mut out, &canonical(value));
                    }
                    tagged(&mut h, b'f', &out);
                }
                None => tagged(&mut h, b'b', body),
            },
        }
        Fingerprint::from_bytes(h.finalize().into())
    }
}

fn put(h: &mut Sha256, part: &[u8]) {
    h.update((part.len() as u64).to_be_bytes());
    h.update(part);
}

fn put_vec(out: &mut Vec<u8>, part: &[u8]) {
    out.extend_from_slice(&(part.len() as u64).to_be_bytes());
    out.extend_from_slice(part);
}

fn tagged(h: &mut Sha256, tag: u8, bytes: &[u8]) {
    h.update([tag]);
    put(h, bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(mode: &BodyFingerprint, method: &str, uri: &str, body: &str) -> Fingerprint {
        mode.of(
            &method.parse().unwrap(),
            &uri.parse().unwrap(),
            body.as_bytes(),
        )
    }

    #[test]
    fn method_path_and_query_count() {
        let m = BodyFingerprint::Bytes;
        let base = fp(&m, "POST", "/a?x=1", "{}");
        assert_eq!(base, fp(&m, "POST", "/a?x=1", "{}"));
        assert_ne!(base, fp(&m, "PATCH", "/a?x=1", "{}"));
        assert_ne!(base, fp(&m, "POST", "/b?x=1", "{}"));
        assert_ne!(base, fp(&m, "POST", "/a?x=2", "{}"));
        assert_ne!(base, fp(&m, "POST", "/a?x=1", "{ }"));
        assert_eq!(
            fp(&BodyFingerprint::Ignore, "POST", "/a", "1"),
            fp(&BodyFingerprint::Ignore, "POST", "/a", "2")
        );
    }

    #[test]
    fn json_is_canonical() {
        let m = BodyFingerprint::Json;
        assert_eq!(
            fp(&m, "POST", "/p", r#"{"a":1,"b":{"y":[1,2],"x":"s"}}"#),
            fp(
                &m,
                "POST",
                "/p",
                "{ \"b\": {\"x\": \"s\", \"y\": [1, 2]},\n \"a\": 1 }"
            )
        );
        assert_ne!(
            fp(&m, "POST", "/p", r#"{"a":1}"#),
            fp(&m, "POST", "/p", r#"{"a":2}"#)
        );
        // Not JSON: counts by bytes, and never equals a JSON body's fingerprint.
        assert_eq!(
            fp(&m, "POST", "/p", "a=1"),
            fp(&BodyFingerprint::Bytes, "POST", "/p", "a=1")
        );
    }

    #[test]
    fn selected_fields_only() {
        let m = BodyFingerprint::JsonFields(vec!["/amount".into(), "/to/iban".into()]);
        let a = fp(
            &m,
            "POST",
            "/p",
            r#"{"amount":5,"to":{"iban":"X","name":"A"},"note":"1"}"#,
        );
        let b = fp(
            &m,
            "POST",
            "/p",
            r#"{"note":"2","to":{"name":"B","iban":"X"},"amount":5}"#,
        );
        assert_eq!(a, b);
        assert_ne!(a, fp(&m, "POST", "/p", r#"{"amount":6,"to":{"iban":"X"}}"#));
        assert_ne!(
            fp(&m, "POST", "/p", r#"{"amount":null}"#),
            fp(&m, "POST", "/p", r#"{}"#)
        );
    }

    #[test]
    fn canonical_sorts_and_escapes() {
        let v: Value = serde_json::from_str(r#"{"b":"q\"","a":[{"d":1,"c":null}]}"#).unwrap();
        assert_eq!(canonical(&v), br#"{"a":[{"c":null,"d":1}],"b":"q\""}"#);
    }
}
