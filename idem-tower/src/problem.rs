//! The answers a transport layer gives itself, one type for the HTTP and the gRPC layer: each
//! variant is a row of the outcome table in docs/architecture.md, and each layer renders it in
//! its own terms (`http/problem.rs`: status, title, problem type; `grpc/problem.rs`: code,
//! `ErrorInfo` reason).

/// An answer the layer gives itself, without calling the handler (or, for
/// [`LeaseLost`](Self::LeaseLost), after it), or that the HTTP layer's `IdempotencyKey`
/// extractor gives for the handler. The HTTP and gRPC layers share this type
/// (`idem::http::Problem` and `idem::grpc::Problem` name it): a variant means the same
/// in both, and each layer says it in its own terms.
///
/// - **HTTP**: an `application/problem+json` body (RFC 9457) with `type`, `title`, `status` and
///   `detail`. `type` is the documentation link of the variant (`type_uri`, on docs.rs) or,
///   when the layer has a `problem_base`, `{base}#{slug}`, which then also goes out as
///   `Link: <{base}>; rel="describedby"`. See `status`, `title`, `slug` and `type_uri`.
/// - **gRPC**: a status in a trailers-only response, whose details
///   (`grpc-status-details-bin`, a `google.rpc.Status`) hold a `google.rpc.ErrorInfo` with the
///   domain `idem` and the variant's `reason`, so a client can tell the layer's answers apart
///   from the service's own. See `code` and `reason`.
///
/// Each variant's documentation gives its HTTP status and gRPC code.
///
/// ```
/// # #[cfg(all(feature = "http", feature = "grpc"))] {
/// use idem::http::Problem;
/// // One answer, said by each layer.
/// assert_eq!(Problem::KeyReused.status(), 422);
/// assert_eq!(Problem::KeyReused.slug(), "key-reused");
/// assert_eq!(Problem::KeyReused.code(), tonic::Code::FailedPrecondition);
/// assert_eq!(Problem::KeyReused.reason(), "IDEMPOTENCY_KEY_REUSED");
/// // The two paths name one type.
/// assert_eq!(idem::grpc::Problem::KeyInFlight, Problem::KeyInFlight);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The request must carry an idempotency key and has none. HTTP `400`; gRPC
    /// `INVALID_ARGUMENT`.
    KeyMissing,
    /// The key is malformed: over HTTP, not one structured-field string of 1 to 255
    /// characters; over gRPC, not 1 to 255 printable ASCII characters, the metadata entry came
    /// twice, or the key field could not be read from the request message. HTTP `400`; gRPC
    /// `INVALID_ARGUMENT`.
    KeyMalformed,
    /// A request with the same key is still running (or, in wait mode, was still running when
    /// the wait ended). Retry unchanged after the delay. HTTP `409` with `Retry-After`; gRPC
    /// `UNAVAILABLE` with `grpc-retry-pushback-ms`.
    KeyInFlight,
    /// The key was used before for another request (over HTTP: method, path, query or body;
    /// over gRPC: method or request message). Not retryable: send a new key for a new request.
    /// HTTP `422`; gRPC `FAILED_PRECONDITION`.
    KeyReused,
    /// The request body (over gRPC, the request message) is larger than the layer reads to
    /// fingerprint it. Nothing ran and nothing was stored. HTTP `413`; gRPC
    /// `RESOURCE_EXHAUSTED`.
    BodyTooLarge,
    /// The request body could not be read: the client went away or sent a broken body (over
    /// gRPC, also a request that is not one length-prefixed message). Nothing ran. HTTP `400`;
    /// gRPC `INVALID_ARGUMENT`.
    BodyUnreadable,
    /// The idempotency store cannot be reached. Nothing ran; retry later. HTTP `503` with
    /// `Retry-After: 1`; gRPC `UNAVAILABLE` with `grpc-retry-pushback-ms: 1000`.
    StoreUnavailable,
    /// The handler ran, but its claim on the key was taken over before the response could be
    /// stored, so the request may have run twice. Check its effect (the resource) before
    /// retrying. HTTP `500`; gRPC `INTERNAL`.
    LeaseLost,
    /// The first request with this key ran, but its response was not kept (larger than the
    /// engine's `max_response_bytes`, or a body that failed), so it cannot be replayed. The
    /// request does not run again: look up its effect (read the resource it created) instead
    /// of retrying. HTTP `422`; gRPC `FAILED_PRECONDITION`.
    ResponseNotRetained,
    /// The first request with this key claimed it for work whose effect must not repeat
    /// (`on_lapse(OnLapse::Uncertain)`), and its claim lapsed with no response stored: whether
    /// the effect happened is unknown, so it will not run again until an operator or a
    /// reconciler resolves the operation the problem names (`operation`, the key's hex form:
    /// what `idem resolve` takes). Do not retry, with this key or another. HTTP `409`; gRPC
    /// `ABORTED`.
    OperationUncertain,
    /// The first request with this key ran, and its response's retention has ended; the key is
    /// kept so that the request does not run again. Look up its effect; send a new key for a
    /// new request. HTTP `409`; gRPC `ALREADY_EXISTS`.
    ResultExpired,
    /// The key was first used under another version of what the layer fingerprints (a deploy
    /// changed it), and this request differs from that one as the new version sees it. Nothing
    /// ran. Send a new key for a new request. HTTP `409`; gRPC `FAILED_PRECONDITION`.
    PolicyChanged,
    /// The operation of this key was resolved by an operator as abandoned: it will not run
    /// again. HTTP `422`; gRPC `FAILED_PRECONDITION`.
    OperationAbandoned,
    /// Anything else (a store error, an unreadable stored response). The details are logged,
    /// not sent. HTTP `500`; gRPC `INTERNAL`.
    Internal,
    /// The layer scopes keys by the caller, and its caller extractor found no identity in this
    /// request. Nothing ran. Authenticate and retry. HTTP `401` (or `400`, by the HTTP layer's
    /// `caller_missing_status`); gRPC `UNAUTHENTICATED`.
    CallerMissing,
    /// The caller identity the extractor returned cannot scope a key (empty, over 255 bytes, or
    /// a byte outside printable ASCII). Nothing ran. HTTP `400`; gRPC `INVALID_ARGUMENT`.
    CallerInvalid,
    /// HTTP only (the gRPC layer has no key extractor, so it never answers this): a handler
    /// asked for the `IdempotencyKey` of a request that carries the header but that no layer
    /// checked (the route is outside the layer, most often because it was added to the `Router`
    /// after `.layer(…)`, or the layer does not guard its method). A mistake in the server's
    /// setup, not the client's: the key deduplicated nothing. Nothing was stored. HTTP `500`;
    /// gRPC, were it sent, `INTERNAL`.
    KeyUnguarded,
}

#[cfg(all(test, feature = "http", feature = "grpc"))]
mod tests {
    use tonic::Code;

    use super::Problem;

    /// Every problem, with what the outcome table in docs/architecture.md and the variant's
    /// documentation say it becomes: HTTP status, gRPC code.
    const TABLE: [(Problem, u16, Code); 17] = [
        (Problem::KeyMissing, 400, Code::InvalidArgument),
        (Problem::KeyMalformed, 400, Code::InvalidArgument),
        (Problem::KeyInFlight, 409, Code::Unavailable),
        (Problem::KeyReused, 422, Code::FailedPrecondition),
        (Problem::BodyTooLarge, 413, Code::ResourceExhausted),
        (Problem::BodyUnreadable, 400, Code::InvalidArgument),
        (Problem::StoreUnavailable, 503, Code::Unavailable),
        (Problem::LeaseLost, 500, Code::Internal),
        (Problem::ResponseNotRetained, 422, Code::FailedPrecondition),
        (Problem::Internal, 500, Code::Internal),
        (Problem::CallerMissing, 401, Code::Unauthenticated),
        (Problem::CallerInvalid, 400, Code::InvalidArgument),
        (Problem::KeyUnguarded, 500, Code::Internal),
        (Problem::OperationUncertain, 409, Code::Aborted),
        (Problem::ResultExpired, 409, Code::AlreadyExists),
        (Problem::PolicyChanged, 409, Code::FailedPrecondition),
        (Problem::OperationAbandoned, 422, Code::FailedPrecondition),
    ];

    #[test]
    fn each_layer_renders_every_problem_as_the_table_says() {
        for (problem, status, code) in TABLE {
            assert_eq!(problem.status().as_u16(), status, "{problem:?} over HTTP");
            assert_eq!(problem.code(), code, "{problem:?} over gRPC");
        }
    }

    #[test]
    fn every_problem_has_its_own_names_in_each_layer() {
        let mut slugs: Vec<_> = TABLE.iter().map(|(p, ..)| p.slug()).collect();
        let mut reasons: Vec<_> = TABLE.iter().map(|(p, ..)| p.reason()).collect();
        let mut titles: Vec<_> = TABLE.iter().map(|(p, ..)| p.title()).collect();
        for names in [&mut slugs, &mut reasons, &mut titles] {
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), TABLE.len(), "{names:?}");
        }
        for (problem, ..) in TABLE {
            let variant = format!("{problem:?}");
            assert!(problem.type_uri().ends_with(&format!("#variant.{variant}")));
            assert_eq!(problem.slug().replace('-', ""), variant.to_lowercase());
            let reason = problem.reason();
            assert!(
                reason.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'),
                "{reason}"
            );
        }
    }
}
