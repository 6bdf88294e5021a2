//! A response as the layers store it: status, end-to-end headers, the exact body bytes and the
//! trailers.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum_core::body::Body;
use bytes::Bytes;
use http::header::CONNECTION;
use http::response::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use http_body::{Frame, SizeHint};

use idem_core::BoxError;

/// Headers that describe one connection, not the response (RFC 9110 section 7.6.1), plus the
/// deprecated `Keep-Alive` and `Proxy-Connection`. They are never stored, and neither is any
/// header the response's `Connection` header names. `Trailer` is stored: it describes the
/// response (the trailer fields it announces), and HTTP/1.1 sends only the trailers it names.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// The response kept for replay. A fresh response keeps its original head (with extensions);
/// a replayed one is rebuilt from the stored bytes.
pub(crate) struct Captured {
    pub(crate) parts: Parts,
    pub(crate) body: Bytes,
    /// The trailer fields the body ended with, if any (a gRPC response's status is there).
    pub(crate) trailers: Option<HeaderMap>,
}

impl Captured {
    pub(crate) fn into_response(self) -> Response<Body> {
        let body = match self.trailers {
            None => Body::from(self.body),
            Some(trailers) => Body::new(WithTrailers {
                data: Some(self.body).filter(|b| !b.is_empty()),
                trailers: Some(trailers),
            }),
        };
        Response::from_parts(self.parts, body)
    }
}

/// A stored body followed by its trailers. It announces no exact size: HTTP/1.1 sends trailers
/// only in a chunked body, which an exact size would turn into a `Content-Length` one.
struct WithTrailers {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for WithTrailers {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let frame = match this.data.take() {
            Some(data) => Frame::data(data),
            None => match this.trailers.take() {
                Some(trailers) => Frame::trailers(trailers),
                None => return Poll::Ready(None),
            },
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = SizeHint::new();
        hint.set_lower(self.data.as_ref().map_or(0, |d| d.len() as u64));
        hint
    }
}

/// Whether `name` (in any case) is one of the [`HOP_BY_HOP`] headers, which are never stored.
pub(crate) fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// Which end-to-end headers of a response a layer stores, and which of a stored response's
/// headers it replays: the HTTP layer's `ReplayHeaders` as its builder checked it, or every
/// one (the gRPC layer's). Hop-by-hop headers are never stored, whatever the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderRule {
    /// Every end-to-end header.
    All,
    /// Only these (lowercase, as `HeaderName`s are).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    Allow(Vec<HeaderName>),
    /// All but these.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    Deny(Vec<HeaderName>),
}

impl HeaderRule {
    /// Whether the rule keeps the end-to-end header `name`.
    pub(crate) fn keeps(&self, name: &HeaderName) -> bool {
        match self {
            HeaderRule::All => true,
            HeaderRule::Allow(names) => names.contains(name),
            HeaderRule::Deny(names) => !names.contains(name),
        }
    }

    /// Drops from `headers` those the rule does not keep, leaving the others in their order: a
    /// record stored under a wider rule (an earlier deploy's, or a release before the rule)
    /// replays what this one keeps. Nothing is copied when every header is kept, as it is for
    /// a record stored under this rule.
    fn retain(&self, headers: &mut HeaderMap) {
        if headers.keys().all(|name| self.keeps(name)) {
            return;
        }
        let mut kept = HeaderMap::with_capacity(headers.keys_len());
        for (name, value) in headers.iter() {
            if self.keeps(name) {
                kept.append(name.clone(), value.clone());
            }
        }
        *headers = kept;
    }
}

/// The headers a response is stored with, and so replayed with: those `rule` keeps, less the
/// hop-by-hop ones and those `Connection` names.
fn stored_headers<'a>(
    headers: &'a HeaderMap,
    rule: &'a HeaderRule,
) -> impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)> {
    let named: Vec<String> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .collect();
    headers.iter().filter(move |(name, _)| {
        let text = name.as_str();
        !is_hop_by_hop(text) && !named.iter().any(|n| n == text) && rule.keeps(name)
    })
}

/// The encoded size of the status, the headers `rule` stores and the trailer count: what
/// [`encode`] writes before the trailers.
pub(crate) fn head_len(parts: &Parts, rule: &HeaderRule) -> usize {
    let headers: usize = stored_headers(&parts.headers, rule).map(field_len).sum();
    1 + 2 + 4 + headers + 4
}

/// The encoded size of trailer fields (without their count).
pub(crate) fn fields_len(fields: &HeaderMap) -> usize {
    fields.iter().map(field_len).sum()
}

fn field_len((name, value): (&HeaderName, &HeaderValue)) -> usize {
    2 + name.as_str().len() + 4 + value.len()
}

/// The bytes kept for `c`: its status, the end-to-end headers `rule` keeps, trailers and body,
/// in the format [`StoredResponse`](crate::StoredResponse) reads.
pub(crate) fn encode(c: &Captured, rule: &HeaderRule) -> Result<Vec<u8>, BoxError> {
    let headers = stored_headers(&c.parts.headers, rule);
    let reserve =
        head_len(&c.parts, rule) + c.trailers.as_ref().map_or(0, fields_len) + c.body.len();
    crate::stored_response::encode(
        c.parts.status,
        headers,
        c.trailers.as_ref(),
        &c.body,
        reserve,
    )
}

/// Reads what [`encode`] wrote (or the version 1 layout, without trailers, written before it),
/// with the headers `rule` keeps.
pub(crate) fn decode(bytes: &[u8], rule: &HeaderRule) -> Result<Captured, BoxError> {
    let stored = crate::stored_response::read(bytes)?;
    let (mut parts, ()) = Response::new(()).into_parts();
    parts.status = stored.status;
    parts.headers = stored.headers;
    rule.retain(&mut parts.headers);
    Ok(Captured {
        parts,
        body: stored.body,
        trailers: stored.trailers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every end-to-end header: the gRPC layer's rule.
    const ALL: &HeaderRule = &HeaderRule::All;

    fn names(list: &[&'static str]) -> Vec<HeaderName> {
        list.iter().map(|n| HeaderName::from_static(n)).collect()
    }

    fn captured() -> Captured {
        let response = Response::builder()
            .status(201)
            .header("content-type", "application/json")
            .header("set-cookie", "a=1")
            .header("set-cookie", "b=2")
            .header("x-binary", HeaderValue::from_bytes(b"\xff\x80").unwrap())
            .header("connection", "close, x-private")
            .header("x-private", "secret")
            .header("keep-alive", "timeout=5")
            .header("transfer-encoding", "chunked")
            .header("upgrade", "h2c")
            .body(())
            .unwrap();
        let (parts, ()) = response.into_parts();
        Captured {
            parts,
            body: Bytes::from_static(b"{\"id\":1}\x00\xff"),
            trailers: None,
        }
    }

    #[test]
    fn round_trip_keeps_end_to_end_headers_only() {
        let c = captured();
        let bytes = encode(&c, ALL).unwrap();
        assert_eq!(bytes.len(), head_len(&c.parts, ALL) + c.body.len());
        let back = decode(&bytes, ALL).unwrap();
        assert_eq!(back.parts.status, 201);
        assert_eq!(back.body, c.body);
        assert!(back.trailers.is_none());
        let names: Vec<_> = back.parts.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "set-cookie", "x-binary"]);
        let cookies: Vec<_> = back.parts.headers.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(back.parts.headers["x-binary"].as_bytes(), b"\xff\x80");
    }

    #[test]
    fn damaged_records_are_errors() {
        let bytes = encode(&captured(), ALL).unwrap();
        assert!(decode(&bytes[..5], ALL).is_err());
        assert!(decode(&[], ALL).is_err());
        let mut other = bytes.clone();
        other[0] = 9;
        assert!(decode(&other, ALL).is_err());
        assert!(decode(&[2, 0x03, 0xe8, 0, 0, 0, 0, 0, 0, 0, 0], ALL).is_err()); // status 1000
        assert!(decode(&bytes[..bytes.len() - 12], ALL).is_err()); // cut inside the headers
    }

    #[test]
    fn trailers_round_trip() {
        let mut c = captured();
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("5"));
        trailers.insert("grpc-message", HeaderValue::from_static("no such payment"));
        trailers.append("x-trace", HeaderValue::from_static("a"));
        trailers.append("x-trace", HeaderValue::from_static("b"));
        trailers.insert(
            "grpc-status-details-bin",
            HeaderValue::from_static("CAUSD25vIHN1Y2ggcGF5bWVudA"),
        );
        c.trailers = Some(trailers.clone());
        let bytes = encode(&c, ALL).unwrap();
        assert_eq!(
            bytes.len(),
            head_len(&c.parts, ALL) + fields_len(&trailers) + c.body.len()
        );
        let back = decode(&bytes, ALL).unwrap();
        assert_eq!(back.body, c.body);
        assert_eq!(back.trailers.unwrap(), trailers);
    }

    /// A record written by the version 1 layout (before trailers were kept), byte for byte:
    /// `201`, `content-type: text/plain`, body `hi`. It still replays.
    #[test]
    fn version_1_records_still_decode() {
        let mut v1 = vec![1, 0, 201, 0, 0, 0, 1, 0, 12];
        v1.extend_from_slice(b"content-type");
        v1.extend_from_slice(&[0, 0, 0, 10]);
        v1.extend_from_slice(b"text/plain");
        v1.extend_from_slice(b"hi");
        let back = decode(&v1, ALL).unwrap();
        assert_eq!(back.parts.status, 201);
        assert_eq!(back.parts.headers["content-type"], "text/plain");
        assert_eq!(back.body, "hi");
        assert!(back.trailers.is_none());
    }

    /// What a rule drops is not in the stored bytes at all (not only absent from the replay),
    /// and what it keeps is stored in order, every value of a name kept, byte for byte.
    #[test]
    fn the_rule_decides_what_is_stored() {
        let c = captured();
        let deny = HeaderRule::Deny(names(&["set-cookie", "x-binary"]));
        let bytes = encode(&c, &deny).unwrap();
        assert_eq!(bytes.len(), head_len(&c.parts, &deny) + c.body.len());
        for gone in [&b"set-cookie"[..], b"a=1", b"b=2", b"\xff\x80"] {
            assert!(
                !bytes.windows(gone.len()).any(|w| w == gone),
                "{gone:?} stored"
            );
        }
        let stored = crate::StoredResponse::decode(&bytes).unwrap();
        let kept: Vec<_> = stored.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(kept, ["content-type"]);

        let allow = HeaderRule::Allow(names(&["set-cookie", "x-binary"]));
        let bytes = encode(&c, &allow).unwrap();
        assert_eq!(bytes.len(), head_len(&c.parts, &allow) + c.body.len());
        let back = decode(&bytes, &allow).unwrap();
        let kept: Vec<_> = back.parts.headers.iter().collect();
        assert_eq!(
            kept,
            [
                (
                    &HeaderName::from_static("set-cookie"),
                    &HeaderValue::from_static("a=1")
                ),
                (
                    &HeaderName::from_static("set-cookie"),
                    &HeaderValue::from_static("b=2")
                ),
                (
                    &HeaderName::from_static("x-binary"),
                    &HeaderValue::from_bytes(b"\xff\x80").unwrap()
                ),
            ]
        );
        assert_eq!(back.body, c.body);
    }

    /// Hop-by-hop headers, and those `Connection` names, are never stored, even when an allow
    /// list names them (the builder refuses that; the rule holds without it).
    #[test]
    fn hop_by_hop_headers_are_never_stored() {
        let c = captured();
        let allow = HeaderRule::Allow(names(&[
            "content-type",
            "connection",
            "x-private",
            "upgrade",
        ]));
        let back = decode(&encode(&c, &allow).unwrap(), ALL).unwrap();
        let kept: Vec<_> = back.parts.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(kept, ["content-type"]);
        assert!(is_hop_by_hop("Transfer-Encoding") && is_hop_by_hop("keep-alive"));
        assert!(!is_hop_by_hop("trailer") && !is_hop_by_hop("set-cookie"));
    }

    /// A record stored under a wider rule (an earlier deploy's, or `All` before the rule
    /// existed) replays only what the current rule keeps, the rest in its order.
    #[test]
    fn the_rule_applies_to_records_stored_before_it() {
        let c = captured();
        let bytes = encode(&c, ALL).unwrap();
        let deny = HeaderRule::Deny(names(&["set-cookie"]));
        let back = decode(&bytes, &deny).unwrap();
        let kept: Vec<_> = back.parts.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(kept, ["content-type", "x-binary"]);
        let allow = HeaderRule::Allow(names(&["x-binary", "content-type"]));
        let back = decode(&bytes, &allow).unwrap();
        let kept: Vec<_> = back.parts.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(kept, ["content-type", "x-binary"]);
        // Under its own rule, nothing is dropped.
        let back = decode(&bytes, ALL).unwrap();
        assert_eq!(back.parts.headers.get_all("set-cookie").iter().count(), 2);
    }
}
