//! What several test binaries share (a module of each, not a test of its own). A binary that
//! includes it (`mod support;`) compiles every part its features allow and uses some.
#![allow(dead_code)]

#[cfg(feature = "sqlite")]
pub mod steps_db;
