//! A response as the layer stores it: status, end-to-end headers and the exact body bytes.

use axum_core::body::Body;
use bytes::Bytes;
use http::header::CONNECTION;
use http::response::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::error::BoxError;

/// Headers that describe one connection, not the response (RFC 9110 section 7.6.1), plus the
/// deprecated `Keep-Alive` and `Proxy-Connection`. They are never stored, and neither is any
/// header the response's `Connection` header names.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The response kept for replay. A fresh response keeps its original head (with extensions);
/// a replayed one is rebuilt from the stored bytes.
pub(crate) struct Captured {
    pub(crate) parts: Parts,
    pub(crate) body: Bytes,
}

impl Captured {
    pub(crate) fn into_response(self) -> Response<Body> {
        Response::from_parts(self.parts, Body::from(self.body))
    }
}

const VERSION: u8 = 1;

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

/// The encoded size of the status and stored headers: what [`encode`] writes before the body.
pub(crate) fn head_len(parts: &Parts) -> usize {
    stored_headers(&parts.headers).fold(1 + 2 + 4, |n, (name, value)| {
        n + 2 + name.as_str().len() + 4 + value.len()
    })
}

/// Version byte, status (u16), header count (u32), then per header the name (u16 length) and
/// value (u32 length), then the body to the end. Big-endian lengths.
pub(crate) fn encode(c: &Captured) -> Result<Vec<u8>, BoxError> {
    let mut out = crate::envelope::payload_buffer(head_len(&c.parts) + c.body.len());
    out.push(VERSION);
    out.extend_from_slice(&c.parts.status.as_u16().to_be_bytes());
    // The header count goes in front of the headers: written once they are counted.
    let count_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut count = 0usize;
    for (name, value) in stored_headers(&c.parts.headers) {
        out.extend_from_slice(&u16::try_from(name.as_str().len())?.to_be_bytes());
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&u32::try_from(value.len())?.to_be_bytes());
        out.extend_from_slice(value.as_bytes());
        count += 1;
    }
    out[count_at..count_at + 4].copy_from_slice(&u32::try_from(count)?.to_be_bytes());
    out.extend_from_slice(&c.body);
    Ok(out)
}

/// Reads what [`encode`] wrote.
pub(crate) fn decode(bytes: &[u8]) -> Result<Captured, BoxError> {
    let mut r = Reader(bytes);
    if r.take(1)? != [VERSION] {
        return Err("stored HTTP response has an unknown format version".into());
    }
    let status = StatusCode::from_u16(u16::from_be_bytes(r.array()?))?;
    let count = u32::from_be_bytes(r.array()?);
    let mut headers = HeaderMap::new();
    for _ in 0..count {
        let len = u16::from_be_bytes(r.array()?);
        let name = HeaderName::from_bytes(r.take(usize::from(len))?)?;
        let len = u32::from_be_bytes(r.array()?);
        let value = HeaderValue::from_bytes(r.take(usize::try_from(len)?)?)?;
        headers.append(name, value);
    }
    let (mut parts, ()) = Response::new(()).into_parts();
    parts.status = status;
    parts.headers = headers;
    Ok(Captured {
        parts,
        body: Bytes::copy_from_slice(r.0),
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BoxError> {
        if self.0.len() < n {
            return Err("stored HTTP response is truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], BoxError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
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
        assert!(decode(&[VERSION, 0x03, 0xe8, 0, 0, 0, 0]).is_err()); // status 1000
    }
}
