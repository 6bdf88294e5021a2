//! Buffering request and response bodies within limits, without losing what was read.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum_core::body::Body;
use bytes::{Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::HeaderMap;
use http_body::{Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::stored;
use idem_core::BoxError;

/// A body a layer takes or passes on: bytes, an error that boxes, and `Send + 'static`, so
/// that started work can outlive its caller.
pub trait LayerBody: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static {}

impl<B> LayerBody for B
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
}

/// Why a request body was not read.
pub(crate) enum ReadError {
    /// Longer than the limit (by `Content-Length` or by what arrived).
    TooLarge,
    /// The body failed (the client went away, a broken chunked encoding).
    Failed(BoxError),
}

/// Reads the whole request body, refusing one longer than `limit` bytes before reading it when
/// `Content-Length` tells.
pub(crate) async fn read_request<B>(
    body: B,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, ReadError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ReadError::TooLarge);
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(ReadError::TooLarge),
        Err(e) => Err(ReadError::Failed(e)),
    }
}

/// A response body read whole, or given back intact when it cannot be stored.
pub(crate) enum Buffered {
    /// The body's bytes and its trailers, if it ended with some (every gRPC response does).
    Whole {
        body: Bytes,
        trailers: Option<HeaderMap>,
    },
    /// The body as the client should still receive it: what was read, then the rest.
    Unstorable { body: Body, why: &'static str },
}

/// Reads the response body, data and trailers, if their stored form takes at most `limit` bytes.
pub(crate) async fn read_response(mut body: Body, limit: usize) -> Buffered {
    const TOO_LARGE: &str = "its body is larger than max_response_bytes";
    if http_body::Body::size_hint(&body).lower() > limit as u64 {
        return Buffered::Unstorable {
            body,
            why: TOO_LARGE,
        };
    }
    let mut read: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut len = 0;
    let mut trailers = None;
    // Bounded by the body itself: every pass consumes one frame, and trailers end it.
    while trailers.is_none() {
        let frame = match body.frame().await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                let tail = Tail::Failed(Some(e));
                return Buffered::Unstorable {
                    body: Body::new(Resume { read, tail }),
                    why: "its body failed",
                };
            }
        };
        let frame = match frame.into_data() {
            Ok(data) => {
                len += data.len();
                // The whole body in one frame, its end known (what a handler's `Json` or
                // `String` makes): kept as it is, with no copy and no list of frames.
                if len <= limit && read.is_empty() && http_body::Body::is_end_stream(&body) {
                    return Buffered::Whole {
                        body: data,
                        trailers: None,
                    };
                }
                Frame::data(data)
            }
            Err(frame) => match frame.into_trailers() {
                Ok(fields) => {
                    len += stored::fields_len(&fields);
                    if len <= limit {
                        trailers = Some(fields);
                        continue;
                    }
                    Frame::trailers(fields)
                }
                // Neither data nor trailers: a kind of frame this version of `http-body` does
                // not know. Passed on, never stored.
                Err(frame) => {
                    read.push_back(frame);
                    return Buffered::Unstorable {
                        body: Body::new(Resume {
                            read,
                            tail: Tail::Body(body),
                        }),
                        why: "its body holds a frame that is neither data nor trailers",
                    };
                }
            },
        };
        read.push_back(frame);
        if len > limit {
            let tail = Tail::Body(body);
            return Buffered::Unstorable {
                body: Body::new(Resume { read, tail }),
                why: TOO_LARGE,
            };
        }
    }
    // One frame whose end only showed at the next read (a stream's, or one before trailers) is
    // kept as it is too.
    if read.len() <= 1 {
        let body = read
            .pop_front()
            .and_then(|frame| frame.into_data().ok())
            .unwrap_or_default();
        return Buffered::Whole { body, trailers };
    }
    let mut bytes = BytesMut::with_capacity(len);
    for frame in read {
        if let Ok(data) = frame.into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    Buffered::Whole {
        body: bytes.freeze(),
        trailers,
    }
}

/// The frames already read, then the rest of the original body (or its error).
struct Resume {
    read: VecDeque<Frame<Bytes>>,
    tail: Tail,
}

enum Tail {
    Body(Body),
    Failed(Option<axum_core::Error>),
}

impl http_body::Body for Resume {
    type Data = Bytes;
    type Error = axum_core::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(frame) = this.read.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match &mut this.tail {
            Tail::Body(body) => Pin::new(body).poll_frame(cx),
            Tail::Failed(error) => Poll::Ready(error.take().map(Err)),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty()
            && match &self.tail {
                Tail::Body(body) => body.is_end_stream(),
                Tail::Failed(error) => error.is_none(),
            }
    }

    fn size_hint(&self) -> SizeHint {
        let read: u64 = self
            .read
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        let tail = match &self.tail {
            Tail::Body(body) => body.size_hint(),
            Tail::Failed(_) => SizeHint::with_exact(0),
        };
        let mut hint = SizeHint::new();
        hint.set_lower(read + tail.lower());
        if let Some(upper) = tail.upper() {
            hint.set_upper(read + upper);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::Full;

    use super::*;

    /// A body arriving in several frames, with no size hint.
    struct Frames(VecDeque<Frame<Bytes>>);

    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    fn chunks(parts: &[&'static str]) -> Body {
        Body::new(Frames(
            parts.iter().map(|c| Frame::data(Bytes::from(*c))).collect(),
        ))
    }

    /// Data frames, then `grpc-status: 0` as trailers.
    fn with_trailers(parts: &[&'static str]) -> Body {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let mut frames: VecDeque<_> = parts.iter().map(|c| Frame::data(Bytes::from(*c))).collect();
        frames.push_back(Frame::trailers(trailers));
        Body::new(Frames(frames))
    }

    #[tokio::test]
    async fn trailers_are_kept() {
        for parts in [&["ab", "cd"][..], &["abcd"], &[]] {
            // The stored form: the data, then the trailer "grpc-status: 0".
            let limit = parts.concat().len() + 2 + 11 + 4 + 1;
            match read_response(with_trailers(parts), limit).await {
                Buffered::Whole { body, trailers } => {
                    assert_eq!(body, parts.concat());
                    assert_eq!(trailers.unwrap()["grpc-status"], "0");
                }
                Buffered::Unstorable { why, .. } => panic!("{why}"),
            }
        }
    }

    #[tokio::test]
    async fn trailers_over_the_limit_are_given_back_intact() {
        let Buffered::Unstorable { body, why } = read_response(with_trailers(&["abcd"]), 10).await
        else {
            panic!("stored trailers over the limit");
        };
        assert!(why.contains("larger"));
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
        assert_eq!(collected.to_bytes(), "abcd");
    }

    #[tokio::test]
    async fn whole_bodies_are_read() {
        match read_response(chunks(&["ab", "cd"]), 4).await {
            Buffered::Whole { body, trailers } => {
                assert_eq!(body, "abcd");
                assert!(trailers.is_none());
            }
            Buffered::Unstorable { why, .. } => panic!("{why}"),
        }
    }

    #[tokio::test]
    async fn too_large_bodies_are_given_back_intact() {
        for body in [chunks(&["ab", "cd", "ef"]), Body::from("abcdef")] {
            let Buffered::Unstorable { body, why } = read_response(body, 3).await else {
                panic!("stored a body over the limit");
            };
            assert!(why.contains("larger"));
            assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdef");
        }
    }

    #[tokio::test]
    async fn request_limits() {
        let headers = HeaderMap::new();
        let ok = read_request(Full::new(Bytes::from_static(b"abc")), &headers, 3).await;
        assert!(matches!(ok, Ok(b) if b == "abc"));
        let big = read_request(Full::new(Bytes::from_static(b"abcd")), &headers, 3).await;
        assert!(matches!(big, Err(ReadError::TooLarge)));
        let mut declared = HeaderMap::new();
        declared.insert(CONTENT_LENGTH, "100".parse().unwrap());
        let early = read_request(Full::new(Bytes::new()), &declared, 3).await;
        assert!(matches!(early, Err(ReadError::TooLarge)));
    }
}
