//! The format in which the HTTP and gRPC layers keep a response: written by the layers
//! (`capture/stored.rs`), read back by them to replay it and by anyone who inspects a record
//! ([`StoredResponse`], which the `idem` command uses).

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use idem_core::{BoxError, Error};

/// The format written now: version 2 adds the trailers. Version 1 (status, headers, body) is
/// still read, so responses stored before trailers were kept replay as they were.
const VERSION: u8 = 2;
const VERSION_1: u8 = 1;

/// A response that the HTTP or gRPC layer stored for a key, read back from the record's bytes:
/// what a retry with that key gets. It has the status, the end-to-end headers, the trailers
/// (a gRPC response's status is there) and the exact body.
///
/// The layers write these themselves. Read one to look inside a record, as `idem inspect`
/// does. The bytes are the record's result (`CachedResult::result`), not a raw database
/// column. Available with the `http`, `grpc` or `remote` feature.
///
/// ```
/// use idem::StoredResponse;
/// // Version 1 of the format: status 201, one header, the body "hi".
/// let mut bytes = vec![1, 0, 201, 0, 0, 0, 1, 0, 12];
/// bytes.extend_from_slice(b"content-type");
/// bytes.extend_from_slice(&[0, 0, 0, 10]);
/// bytes.extend_from_slice(b"text/plain");
/// bytes.extend_from_slice(b"hi");
/// let stored = StoredResponse::decode(&bytes)?;
/// assert_eq!(stored.status, 201);
/// assert_eq!(stored.headers["content-type"], "text/plain");
/// assert_eq!(stored.body, "hi");
/// assert!(StoredResponse::decode(b"{\"receipt\":1}").is_err());
/// # Ok::<(), idem::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoredResponse {
    /// The status.
    pub status: StatusCode,
    /// The end-to-end headers (hop-by-hop ones are never stored).
    pub headers: HeaderMap,
    /// The trailer fields the body ended with, if any.
    pub trailers: Option<HeaderMap>,
    /// The body, byte for byte.
    pub body: Bytes,
}

impl StoredResponse {
    /// Reads a stored response from a record's result bytes. Fails with [`Error::Codec`] if
    /// the bytes are not one (such as a value `Idempotency::run` stored as JSON), are damaged,
    /// or are in a format version this release does not know.
    pub fn decode(bytes: &[u8]) -> Result<StoredResponse, Error> {
        read(bytes).map_err(Error::Codec)
    }
}

/// Version byte (2), status (u16), header count (u32), then per header the name (u16 length)
/// and value (u32 length), then the trailers as the headers (a count, then the fields; a count
/// of 0 when there are none), then the body to the end. Big-endian lengths. `reserve`: the
/// length the caller counted, so the buffer is allocated once.
#[cfg(any(feature = "http", feature = "grpc"))]
pub(crate) fn encode<'a>(
    status: StatusCode,
    headers: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    trailers: Option<&'a HeaderMap>,
    body: &[u8],
    reserve: usize,
) -> Result<Vec<u8>, BoxError> {
    let mut out = idem_core::adapter::payload_buffer(reserve);
    out.push(VERSION);
    out.extend_from_slice(&status.as_u16().to_be_bytes());
    put_fields(&mut out, headers)?;
    put_fields(&mut out, trailers.into_iter().flat_map(|t| t.iter()))?;
    out.extend_from_slice(body);
    Ok(out)
}

/// A count (u32), then each field's name and value.
#[cfg(any(feature = "http", feature = "grpc"))]
fn put_fields<'a>(
    out: &mut Vec<u8>,
    fields: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
) -> Result<(), BoxError> {
    // The count goes in front of the fields: written once they are counted.
    let count_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut count = 0usize;
    for (name, value) in fields {
        out.extend_from_slice(&u16::try_from(name.as_str().len())?.to_be_bytes());
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&u32::try_from(value.len())?.to_be_bytes());
        out.extend_from_slice(value.as_bytes());
        count += 1;
    }
    out[count_at..count_at + 4].copy_from_slice(&u32::try_from(count)?.to_be_bytes());
    Ok(())
}

/// Reads what [`encode`] wrote, or the version 1 layout (no trailers) written before it.
pub(crate) fn read(bytes: &[u8]) -> Result<StoredResponse, BoxError> {
    let mut r = Reader(bytes);
    let version = r.take(1)?[0];
    if version != VERSION && version != VERSION_1 {
        return Err("stored HTTP response has an unknown format version".into());
    }
    let status = StatusCode::from_u16(u16::from_be_bytes(r.array()?))?;
    let headers = r.fields()?;
    let trailers = match version {
        VERSION_1 => None,
        _ => Some(r.fields()?).filter(|t| !t.is_empty()),
    };
    Ok(StoredResponse {
        status,
        headers,
        trailers,
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

    /// What `put_fields` wrote.
    fn fields(&mut self) -> Result<HeaderMap, BoxError> {
        let count = u32::from_be_bytes(self.array()?);
        let mut fields = HeaderMap::new();
        for _ in 0..count {
            let len = u16::from_be_bytes(self.array()?);
            let name = HeaderName::from_bytes(self.take(usize::from(len))?)?;
            let len = u32::from_be_bytes(self.array()?);
            let value = HeaderValue::from_bytes(self.take(usize::try_from(len)?)?)?;
            fields.append(name, value);
        }
        Ok(fields)
    }
}
