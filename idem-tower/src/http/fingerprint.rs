//! The request fingerprint: method, path and query, and (a chosen view of) the body.

use std::collections::BTreeMap;

use http::{Method, Uri};
use sha2::{Digest, Sha256};

use idem_core::adapter::JsonText;
use idem_core::Fingerprint;

/// Which view of the request body goes into the request fingerprint.
///
/// The fingerprint always covers the method and the path with its query; a retry whose
/// fingerprint differs from the first request's gets `422 Unprocessable Content`.
///
/// ```
/// use idem::http::BodyFingerprint;
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
    /// The body as canonical JSON: whitespace, the order of object keys and the way a string is
    /// escaped do not matter. Numbers count by their text as sent, so `1` and `1.0` differ and
    /// integers beyond 64 bits or long decimals never round together. A body that is not JSON,
    /// nests deeper than [`MAX_FINGERPRINT_DEPTH`](idem_core::MAX_FINGERPRINT_DEPTH) levels or
    /// repeats a key within an object counts by its bytes.
    Json,
    /// Only the values at these JSON Pointers (RFC 6901, such as `/amount` or
    /// `/customer/id`), canonicalised as for [`Json`](Self::Json); everything else in the body may
    /// change between retries. An absent field differs from a field that is `null`. A body that
    /// [`Json`](Self::Json) counts by its bytes counts by its bytes here too, whole.
    JsonFields(Vec<String>),
    /// The body does not count, only the method and the path with its query (for bodies that
    /// differ on every send, such as multipart uploads with random boundaries).
    Ignore,
}

impl BodyFingerprint {
    /// The fingerprint of a request, as the layer computes it: SHA-256 over the length-prefixed
    /// method, path-and-query and the chosen view of the body, each view tagged so two views
    /// never collide.
    ///
    /// ```
    /// use http::{Method, Uri};
    /// use idem::http::BodyFingerprint;
    /// let uri = Uri::from_static("/payments");
    /// let a = BodyFingerprint::Json.of(&Method::POST, &uri, br#"{"amount": 5, "to": "x"}"#);
    /// let b = BodyFingerprint::Json.of(&Method::POST, &uri, br#"{"to":"x","amount":5}"#);
    /// assert_eq!(a, b);
    /// let c = BodyFingerprint::Json.of(&Method::POST, &uri, br#"{"to":"x","amount":5.0}"#);
    /// assert_ne!(a, c);
    /// ```
    pub fn of(&self, method: &Method, uri: &Uri, body: &[u8]) -> Fingerprint {
        let mut h = Sha256::new();
        h.update(b"idem-http/v1");
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        for part in [method.as_str().as_bytes(), path.as_bytes()] {
            put(&mut h, part);
        }
        let json = || JsonText::parse(body);
        match self {
            BodyFingerprint::Bytes => tagged(&mut h, b'b', body),
            BodyFingerprint::Ignore => h.update([b'n']),
            BodyFingerprint::Json => match json() {
                Some(v) => tagged(&mut h, b'j', &v.canonical()),
                None => tagged(&mut h, b'b', body),
            },
            BodyFingerprint::JsonFields(pointers) => match json() {
                Some(v) => {
                    let picked: BTreeMap<&str, &JsonText> = pointers
                        .iter()
                        .filter_map(|p| v.pointer(p).map(|found| (p.as_str(), found)))
                        .collect();
                    let mut out = Vec::new();
                    for (pointer, value) in picked {
                        put_vec(&mut out, pointer.as_bytes());
                        put_vec(&mut out, &value.canonical());
                    }
                    tagged(&mut h, b'f', &out);
                }
                None => tagged(&mut h, b'b', body),
            },
        }
        Fingerprint::from_digest(h.finalize().into())
    }
}

impl BodyFingerprint {
    /// The policy version of this view (the HTTP layer's default `policy_version`): the first
    /// four bytes of SHA-256 over the fingerprint's scheme and the view (with its JSON
    /// Pointers), so a deploy that changes the view changes the version.
    ///
    /// ```
    /// use idem::http::BodyFingerprint;
    /// assert_eq!(BodyFingerprint::Json.version(), BodyFingerprint::Json.version());
    /// assert_ne!(BodyFingerprint::Json.version(), BodyFingerprint::Bytes.version());
    /// let amount = BodyFingerprint::JsonFields(vec!["/amount".into()]);
    /// let both = BodyFingerprint::JsonFields(vec!["/amount".into(), "/currency".into()]);
    /// assert_ne!(amount.version(), both.version());
    /// ```
    pub fn version(&self) -> u32 {
        let mut h = Sha256::new();
        h.update(b"idem-http/v1");
        match self {
            BodyFingerprint::Bytes => h.update([b'b']),
            BodyFingerprint::Ignore => h.update([b'n']),
            BodyFingerprint::Json => h.update([b'j']),
            BodyFingerprint::JsonFields(pointers) => {
                h.update([b'f']);
                for p in pointers {
                    put(&mut h, p.as_bytes());
                }
            }
        }
        let digest: [u8; 32] = h.finalize().into();
        u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
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
}
