//! What several test binaries share (a module of each, not a test of its own).

pub mod sqs;
