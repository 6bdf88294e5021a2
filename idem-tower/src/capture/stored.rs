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

/// The headers a replay carries: all but the hop-by-hop ones and those `Connection` names.
fn stored_headers(headers: &HeaderMap) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
    let named: Vec<String> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .collect();
    headers.iter().filter(move |(name, _)| {
        let name = name.as_str();
        !HOP_BY_HOP.contains(&name) && !named.iter().any(|n| n == name)
    })
}

/// The encoded size of the status, the stored headers and the trailer count: what [`encode`]
/// writes before the trailers.
pub(crate) fn head_len(parts: &Parts) -> usize {
    1 + 2 + 4 + stored_headers(&parts.headers).map(field_len).sum::<usize>() + 4
}

/// The encoded size of trailer fields (without their count).
pub(crate) fn fields_len(fields: &HeaderMap) -> usize {
    fields.iter().map(field_len).sum()
}

fn field_len((name, value): (&HeaderName, &HeaderValue)) -> usize {
    2 + name.as_str().len() + 4 + value.len()
}

/// The bytes kept for `c`: its status, end-to-end headers, trailers and body, in the format
/// [`StoredResponse`](crate::StoredResponse) reads.
pub(crate) fn encode(c: &Captured) -> Result<Vec<u8>, BoxError> {
    let headers = stored_headers(&c.parts.headers);
    let reserve = head_len(&c.parts) + c.trailers.as_ref().map_or(0, fields_len) + c.body.len();
    crate::stored_response::encode(
        c.parts.status,
        headers,
        c.trailers.as_ref(),
        &c.body,
        reserve,
    )
}

/// Reads what [`encode`] wrote (or the version 1 layout, without trailers, written before it).
pub(crate) fn decode(bytes: &[u8]) -> Result<Captured, BoxError> {
    let stored = crate::stored_response::read(bytes)?;
    let (mut parts, ()) = Response::new(()).into_parts();
    parts.status = stored.status;
    parts.headers = stored.headers;
    Ok(Captured {
        parts,
        body: stored.body,
        trailers: stored.trailers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let bytes = encode(&c).unwrap();
        assert_eq!(bytes.len(), head_len(&c.parts) + c.body.len());
        let back = decode(&bytes).unwrap();
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
        let bytes = encode(&captured()).unwrap();
        assert!(decode(&bytes[..5]).is_err());
        assert!(decode(&[]).is_err());
        let mut other = bytes.clone();
        other[0] = 9;
        assert!(decode(&other).is_err());
        assert!(decode(&[2, 0x03, 0xe8, 0, 0, 0, 0, 0, 0, 0, 0]).is_err()); // status 1000
        assert!(decode(&bytes[..bytes.len() - 12]).is_err()); // cut inside the headers
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
        let bytes = encode(&c).unwrap();
        assert_eq!(
            bytes.len(),
            head_len(&c.parts) + fields_len(&trailers) + c.body.len()
        );
        let back = decode(&bytes).unwrap();
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
        let back = decode(&v1).unwrap();
        assert_eq!(back.parts.status, 201);
        assert_eq!(back.parts.headers["content-type"], "text/plain");
        assert_eq!(back.body, "hi");
        assert!(back.trailers.is_none());
    }
}
