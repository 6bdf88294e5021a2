//! The gRPC service of `proto/payments.proto` (package `idem.test.payments`), generated at build
//! time by tonic-prost-build on protox, a protobuf compiler written in Rust: no `protoc`.
//!
//! `payments_server::PaymentsServer` serves an implementation of `payments_server::Payments`;
//! `payments_client::PaymentsClient` calls it.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// The prost the generated messages derive from: to encode them as the wire carries them.
pub use prost;

tonic::include_proto!("idem.test.payments");

/// The stream an implementation of `payments_server::Payments` answers `Watch` with, boxed
/// (tonic's codegen alias, which the generated trait's bound names): the `WatchStream` of the
/// test service, the example and the benchmark.
///
/// ```
/// use idem_test_support::grpc::PaymentStream;
/// let streams: Vec<PaymentStream> = Vec::new();
/// # let _ = streams;
/// ```
pub type PaymentStream = tonic::codegen::BoxStream<Payment>;

/// The path of a method of the service: `/idem.test.payments.Payments/{method}`.
///
/// ```
/// assert_eq!(idem_test_support::grpc::path("Create"), "/idem.test.payments.Payments/Create");
/// ```
pub fn path(method: &str) -> String {
    format!("/idem.test.payments.Payments/{method}")
}
